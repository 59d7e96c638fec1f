// Edges of the input digest's field (services/grpc/InputDigest.ts) that input-digest.test.ts leaves open: the agent's
// digest replaces a value already under its key, a scheme must name a version, and a non-string that would print as a
// digest is no digest. Pure.
import { describe, expect, it } from "vitest"
import { INPUT_DIGEST_FIELD, ownInputDigest, withInputDigest } from "../../src/services/grpc/InputDigest.ts"

const P_PARAMS = { do_remote_decode: false, remote_block_ids: [1, 2], remote_engine_id: "engine-a" }
const own = () => "v1:own"

describe("cgn_input_digest edges", () => {
  it("P: the agent's digest replaces any value the engine's params already hold under its key", () => {
    const stamped = withInputDigest({ ...P_PARAMS, [INPUT_DIGEST_FIELD]: "v1:from-the-engine" }, "v1:agent")
    expect(stamped[INPUT_DIGEST_FIELD]).toBe("v1:agent")
    expect(stamped).toMatchObject(P_PARAMS)
  })

  it("D: a scheme without a version number ('v:') is Malformed, not a newer agent's scheme accepted unchecked", () => {
    expect(ownInputDigest(withInputDigest(P_PARAMS, "v:abc"), own)).toStrictEqual({ _tag: "Malformed", value: "v:abc" })
    expect(ownInputDigest(withInputDigest(P_PARAMS, "v12:abc"), own)).toStrictEqual({ _tag: "Same", params: P_PARAMS })
  })

  it("D: a list holding a digest string is Malformed (only a string is a digest), with or without a check", () => {
    for (const check of [own, undefined])
      expect(ownInputDigest({ ...P_PARAMS, [INPUT_DIGEST_FIELD]: ["v1:own"] }, check)).toStrictEqual({
        _tag: "Malformed",
        value: ["v1:own"]
      })
  })
})
