// What engine-numbers.test.ts and handoff.test.ts left open in the decode leg's kv_transfer_params check
// (services/grpc/NixlParams.ts), found by a mutation audit: the edges of a host name (a label of 63 characters, a name
// of 253: RFC 1035 section 2.3.4, RFC 1123 section 2.1), of an IPv4 literal (255 the top of an octet; a leading zero
// refused: glibc's inet_aton, which getaddrinfo uses for a numeric host, reads "010" as octal 8, so the address
// dialled is not the one written), and the port's range and integrality (the prefill engine returns its side
// channel's port, an int: vllm/distributed/kv_transfer/kv_connector/v1/nixl/scheduler.py, side_channel_port).
import { describe, expect, it } from "vitest"
import { isHostOrIp, nixlParamsProblems } from "../../src/services/grpc/NixlParams.ts"
import { PREFILL_PARAMS } from "../support/nixlParams.ts"

const label = (n: number) => "a".repeat(n)
/** Three 63-character labels and one of 61, with their dots: 253 characters. */
const NAME_253 = `${`${label(63)}.`.repeat(3)}${label(61)}`

describe("a host name at its limits", () => {
  it("a label of 63 characters is taken (64 is refused elsewhere)", () => {
    expect(isHostOrIp(label(63))).toBe(true)
    expect(isHostOrIp(`prefill.${label(63)}.svc`)).toBe(true)
  })

  it("a name of 253 characters is taken, 254 refused", () => {
    expect(NAME_253.length).toBe(253)
    expect(isHostOrIp(NAME_253)).toBe(true)
    expect(isHostOrIp(`${NAME_253}a`)).toBe(false)
  })
})

describe("an IPv4 literal", () => {
  it.each(["255.255.255.255", "250.251.252.253", "254.0.0.255", "0.0.0.0", "10.0.0.7"])("%s is taken", (host) => {
    expect(isHostOrIp(host)).toBe(true)
  })

  // inet_aton (man 3 inet_aton: "a leading 0 implies octal") would dial 8.0.0.1 for 010.0.0.1
  it.each(["010.0.0.1", "10.0.0.01", "10.00.0.1", "256.0.0.1"])("%s is refused", (host) => {
    expect(isHostOrIp(host)).toBe(false)
  })
})

describe("remote_port: an integer in 1..65535, both ends taken", () => {
  it.each([1, 65535])("port %d is taken", (remote_port) => {
    expect(nixlParamsProblems({ ...PREFILL_PARAMS, remote_port })).toEqual({ missing: [], wrong: [] })
  })

  it.each([0, 65536, 5600.5])("port %d is refused, naming it", (remote_port) => {
    expect(nixlParamsProblems({ ...PREFILL_PARAMS, remote_port })).toEqual({
      missing: [],
      wrong: [`remote_port must be a port, 1..65535, got ${remote_port}`]
    })
  })
})

describe("remote_block_ids: every id a block id", () => {
  // NixlConnector indexes its block table with each id; one that is not a safe integer >= 0 failed in the engine
  it.each([
    ["one bad id among good ones", [1, "a"]],
    ["one bad group among good ones", [[1, 2], ["a"]]],
    ["an id past 2^53 (not exact once parsed)", [1, 2 ** 53]]
  ])("%s is refused", (_name, remote_block_ids) => {
    expect(nixlParamsProblems({ ...PREFILL_PARAMS, remote_block_ids }).wrong).toEqual([
      expect.stringMatching(/^remote_block_ids must be the prefill engine's block ids/)
    ])
  })
})

describe("remote_block_ids: absent or empty is missing, anything but a list is wrong, said once", () => {
  it.each([
    ["absent", undefined, { missing: ["remote_block_ids"], wrong: [] }],
    ["an empty list", [], { missing: ["remote_block_ids"], wrong: [] }],
    ["groups without a block", [[], []], { missing: ["remote_block_ids"], wrong: [] }],
    // it read "...got \"0\": missing or empty remote_block_ids": the one field both wrong and missing
    [
      "a string",
      "0",
      {
        missing: [],
        wrong: [
          `remote_block_ids must be the prefill engine's block ids (integers >= 0, or a list of them per group), got "0"`
        ]
      }
    ]
  ])("%s", (_name, remote_block_ids, problems) => {
    expect(nixlParamsProblems({ ...PREFILL_PARAMS, remote_block_ids })).toEqual(problems)
  })
})

describe("remote_request_id, where a newer engine sends it, is a string", () => {
  it("a number is refused, naming it", () => {
    expect(nixlParamsProblems({ ...PREFILL_PARAMS, remote_request_id: 7 })).toEqual({
      missing: [],
      wrong: ["remote_request_id must be a string, got 7"]
    })
  })
})

describe("a wrong value is shown up to 40 characters of its JSON", () => {
  it("40 whole, 41 cut with '...'", () => {
    const at = (n: number) => nixlParamsProblems({ ...PREFILL_PARAMS, remote_port: "x".repeat(n - 2) }).wrong
    expect(at(40)).toEqual([`remote_port must be a port, 1..65535, got "${"x".repeat(38)}"`])
    expect(at(41)).toEqual([`remote_port must be a port, 1..65535, got "${"x".repeat(39)}...`])
  })
})
