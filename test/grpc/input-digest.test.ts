// InputDigest (pure): the digest of a vLLM P/D leg's input that ties a decode leg to its prefill leg, and the
// decode side's check, through planLeg as the gRPC layer calls it. The gRPC path: test/grpc/pd.test.ts.
import { hash } from "node:crypto"
import { Result } from "effect"
import { describe, expect, it } from "vitest"
import { ChatMessage, GenerateRequest } from "../../src/gen/cgn/agent/v1/agent.ts"
import { type InvalidHandoff, planLeg } from "../../src/services/grpc/Handoff.ts"
import {
  canonicalInput,
  INPUT_DIGEST_FIELD,
  inputDigest,
  type LegInput,
  ownInputDigest,
  withInputDigest
} from "../../src/services/grpc/InputDigest.ts"

const sha256 = (text: string): string => hash("sha256", text, "base64url")
const digest = (model: string, input: LegInput): string => inputDigest(sha256, model, input)
const chat = (...messages: Array<[string, string]>): LegInput => ({
  chat: { messages: messages.map(([role, content]) => ({ role, content })) }
})

const P_PARAMS = {
  do_remote_prefill: true,
  do_remote_decode: false,
  remote_block_ids: [1, 2],
  remote_engine_id: "engine-a",
  remote_request_id: "req-1",
  remote_host: "10.0.0.5",
  remote_port: 5600
}

describe("inputDigest", () => {
  const base = chat(["system", "be brief"], ["user", "hello"])

  it("equal inputs give equal digests, from separately built messages (as two nodes decode one request)", () => {
    const again = GenerateRequest.fromPartial({
      model: "ignored: the served name counts",
      chat: {
        messages: [ChatMessage.fromPartial({ role: "system", content: "be brief" }), { role: "user", content: "hello" }]
      },
      sampling: { temperature: 0.3, maxTokens: 9 }
    })
    expect(digest("m", again)).toBe(digest("m", base))
    expect(digest("m", { prompt: "a b" })).toBe(digest("m", { prompt: "a b" }))
  })

  it("names its scheme and is a SHA-256 in base64url", () => {
    expect(digest("m", base)).toMatch(/^v1:[A-Za-z0-9_-]{43}$/)
  })

  it.each<[string, string, LegInput]>([
    ["another model", "m2", base],
    ["another content", "m", chat(["system", "be brief"], ["user", "hello!"])],
    ["another role", "m", chat(["developer", "be brief"], ["user", "hello"])],
    ["messages in another order", "m", chat(["user", "hello"], ["system", "be brief"])],
    ["one message fewer", "m", chat(["user", "hello"])],
    ["one message more", "m", chat(["system", "be brief"], ["user", "hello"], ["assistant", ""])],
    ["text moved across the message boundary", "m", chat(["system", "be brie"], ["user", "fhello"])],
    ["the same text as a prompt", "m", { prompt: '[["system","be brief"],["user","hello"]]' }]
  ])("any change to the input changes it: %s", (_name, model, input) => {
    expect(digest(model, input)).not.toBe(digest("m", base))
  })

  it("prompts: any character counts; a prompt is not a one-message chat", () => {
    expect(digest("m", { prompt: "a b" })).not.toBe(digest("m", { prompt: "a  b" }))
    expect(digest("m", { prompt: "hello" })).not.toBe(digest("m", chat(["user", "hello"])))
  })

  it("chat wins over prompt, as in planRequest (a message that carries both runs as chat)", () => {
    expect(digest("m", { ...chat(["user", "x"]), prompt: "y" })).toBe(digest("m", chat(["user", "x"])))
  })

  it("the canonical text is spelled out: JSON of fixed-order fields (two agent versions must agree on it)", () => {
    expect(canonicalInput("m", chat(["user", 'say "hi"\n']))).toBe(
      '["cgn-input-v1","m","chat",[["user","say \\"hi\\"\\n"]]]'
    )
    expect(canonicalInput("m", { prompt: "é" })).toBe('["cgn-input-v1","m","prompt","é"]')
  })

  it("a ChatMessage has role and content only: a field added to it that the engine gets must be digested too", () => {
    // Fails when agent.proto's ChatMessage grows a field: add it to canonicalInput (a new scheme) or say why not.
    expect(Object.keys(ChatMessage.fromPartial({})).sort()).toEqual(["content", "role"])
  })
})

describe("ownInputDigest (decode side)", () => {
  const own = () => digest("m", { prompt: "p" })
  const stamped = withInputDigest(P_PARAMS, own())

  it("a matching digest: the params without the field, exactly the engine's", () => {
    expect(stamped[INPUT_DIGEST_FIELD]).toBe(own())
    expect(ownInputDigest(stamped, own)).toStrictEqual({ _tag: "Same", params: P_PARAMS })
  })

  it("another input's digest: Differs", () => {
    expect(ownInputDigest(withInputDigest(P_PARAMS, digest("m", { prompt: "q" })), own)._tag).toBe("Differs")
  })

  it("params without the field (an older agent's, a router's own) pass as they are, unhashed", () => {
    const never = () => {
      throw new Error("no digest to compare")
    }
    expect(ownInputDigest(P_PARAMS, never)).toStrictEqual({ _tag: "Same", params: P_PARAMS })
    expect(ownInputDigest("junk", never)).toStrictEqual({ _tag: "Same", params: "junk" })
  })

  it("a newer agent's scheme is accepted unchecked and taken out; a value no agent writes is Malformed", () => {
    expect(ownInputDigest(withInputDigest(P_PARAMS, "v2:whatever"), own)).toStrictEqual({
      _tag: "Same",
      params: P_PARAMS
    })
    expect(ownInputDigest(withInputDigest(P_PARAMS, "abc"), own)._tag).toBe("Malformed")
    // the scheme is the value's prefix: one further in names none
    expect(ownInputDigest(withInputDigest(P_PARAMS, "junk v2:whatever"), own)._tag).toBe("Malformed")
    expect(ownInputDigest({ ...P_PARAMS, [INPUT_DIGEST_FIELD]: 7 }, own)._tag).toBe("Malformed")
  })
})

describe("planLeg with input digests", () => {
  const body = { prompt: "p", max_tokens: 8 }
  const ownDigest = digest("m", { prompt: "p" })
  const failure = (r: Result.Result<unknown, InvalidHandoff>): InvalidHandoff => {
    if (Result.isSuccess(r)) throw new Error(`expected a failure, got ${JSON.stringify(r.success)}`)
    return r.failure
  }

  it("a prefill leg carries its digest, to add to the engine's params", () => {
    const leg = planLeg({ role: "prefill", handoff: "kv_transfer_params", body, inputDigest: () => ownDigest })
    expect(Result.isSuccess(leg) && leg.success).toMatchObject({ _tag: "Prefill", inputDigest: ownDigest })
  })

  it("a decode leg whose params carry its own digest: the engine gets the params without it", () => {
    const leg = planLeg({
      role: "decode",
      handoff: "kv_transfer_params",
      body,
      kvTransferParams: withInputDigest(P_PARAMS, ownDigest),
      inputDigest: () => ownDigest
    })
    expect(Result.isSuccess(leg) && leg.success).toStrictEqual({
      _tag: "Decode",
      protocol: "kv_transfer_params",
      body: { ...body, kv_transfer_params: P_PARAMS }
    })
  })

  it("a decode leg whose params carry another input's digest: InvalidHandoff, whose message names the field", () => {
    const e = failure(
      planLeg({
        role: "decode",
        handoff: "kv_transfer_params",
        body,
        kvTransferParams: withInputDigest(P_PARAMS, digest("m", { prompt: "other" })),
        inputDigest: () => ownDigest
      })
    )
    expect(e.message).toMatch(
      /^the decode leg's input differs from its prefill leg's \(kv_transfer_params\.cgn_input_digest\)/
    )
  })

  it("a malformed digest: InvalidHandoff", () => {
    const e = failure(
      planLeg({
        role: "decode",
        handoff: "kv_transfer_params",
        body,
        kvTransferParams: { ...P_PARAMS, [INPUT_DIGEST_FIELD]: null },
        inputDigest: () => ownDigest
      })
    )
    expect(e.message).toContain("cgn_input_digest must be the string")
  })
})
