// The llama_cpp simulator's request-field checks as a pure function (llamaParams), pinned to what the real
// llama-server answered (measured with test/real/sim-differential-8.test.ts, which sends the same bodies to both):
// these run without the real binary. Rules: server-schema.cpp (each field's C++ type, its handler, the schema's
// order), server-common.cpp oaicompat_chat_params_parse (the fields a chat's template sets), common/sampling.cpp
// common_sampler_init (penalty_repeat).
import { describe, expect, it } from "vitest"
import { clampFloat, cppString } from "../../src/sim/llamaNumbers.ts"
import { llamaParams } from "../../src/sim/llamaRequest.ts"
import { CONVERSIONS, HANDLED_FIELDS, ORDER, type RequestFact, SAMPLER_INIT } from "../support/llamaRequestFacts.ts"

/** What the simulator answers to a fact's fields: the 400's message, or taken (and whether with logprobs). */
const answer = (f: RequestFact) => {
  // the wire carries JSON.stringify's digits, which the simulator reads back as JSON.parse does
  const body = JSON.parse(JSON.stringify({ max_tokens: 2, ...f.extra })) as Record<string, unknown>
  const r = llamaParams(body, 2, f.chat === true)
  if ("message" in r) return { refused: r.message }
  return f.logprobs === undefined ? {} : { logprobs: r.nProbs > 0 }
}

const expected = (f: RequestFact) => ({
  ...(f.refused === undefined ? {} : { refused: f.refused }),
  ...(f.logprobs === undefined ? {} : { logprobs: f.logprobs })
})

describe("llamaParams: numbers converted to the field's C++ type, as the real llama-server does", () => {
  it.each(CONVERSIONS.map((f) => [f.why, f] as const))("%s", (_, f) => {
    expect(answer(f)).toEqual(expected(f))
  })
})

describe("llamaParams: fields read by handlers of their own, refused in the real server's words and order", () => {
  it.each(HANDLED_FIELDS.map((f) => [f.why, f] as const))("%s", (_, f) => {
    expect(answer(f)).toEqual(expected(f))
  })
})

describe("llamaParams: the samplers' init checks, after every field's", () => {
  it.each(SAMPLER_INIT.map((f) => [f.why, f] as const))("%s", (_, f) => {
    expect(answer(f)).toEqual(expected(f))
  })
})

describe("llamaParams: grammar_lazy on a chat, stream_options' place", () => {
  it.each(ORDER.map((f) => [f.why, f] as const))("%s", (_, f) => {
    expect(answer(f)).toEqual(expected(f))
  })

  it("a seed is a uint32: a double past int64 is 0, 10^10 keeps its low 32 bits", () => {
    expect(llamaParams({ seed: 1e30 }, 2)).toMatchObject({ seed: 0 })
    expect(llamaParams({ seed: 1e10 }, 2)).toMatchObject({ seed: 1410065408 })
    expect(llamaParams({ seed: -1.5 }, 2)).toMatchObject({ seed: 4294967295 })
  })
})

// printf's %f and field_num's float limits at values no request reaches through a range refusal today (no float is
// 1e21 exactly, -0 passes every float limit, and the only unlimited float read back is repeat_penalty, whose check
// answers FLT_MAX and infinity alike): the helpers' own contract, for the next field that prints or reads one.
describe("std::to_string of a float, field_num's float limits", () => {
  it("%f writes 1e21 in digits and keeps -0's sign; an infinity is clamped to FLT_MAX", () => {
    expect(cppString(1e21, "float")).toBe("1000000000000000000000.000000")
    expect(cppString(-1e21, "float")).toBe("-1000000000000000000000.000000")
    expect(cppString(-0, "float")).toBe("-0.000000")
    expect([clampFloat(Infinity), clampFloat(-Infinity)]).toEqual([3.4028234663852886e38, -3.4028234663852886e38])
  })

  it("%f rounds an exact tie at the sixth decimal half to even, as glibc does (toFixed rounds it away from zero)", () => {
    // the real llama-server, adaptive_decay -0.0078125 out of range: "but got -0.007812" (code review, measured)
    expect(cppString(-0.0078125, "float")).toBe("-0.007812")
    expect(cppString(0.0078125, "float")).toBe("0.007812")
    expect(cppString(0.0234375, "float")).toBe("0.023438")
    // not a tie: as toFixed, both ways
    expect(cppString(Math.fround(0.1), "float")).toBe("0.100000")
    expect(cppString(0.0000015, "float")).toBe("0.000002")
  })
})
