// Differential check of the llama_cpp simulator against the real llama-server: request fields as the schema reads
// them (server-schema.cpp). A number converts to its field's C++ type (int32, int64, uint32, float) before its range
// check and is printed by std::to_string after; the fields read by handlers of their own (lora, samplers, grammar
// triggers, the chat parser, ...) refuse in their own words, in the schema's order; common_sampler_init refuses a
// repeat_penalty that is not a positive float with a finite inverse; a chat's template sets grammar_lazy (and
// other fields) over the request's; stream_options is read right after stream. Refusals are compared word for
// word, a taken completion by its status and whether it carries logprobs. The same facts are pinned without the
// binary by test/sim/llama-request-conversions.test.ts.
import { beforeAll, describe, expect, it } from "vitest"
import { CONVERSIONS, HANDLED_FIELDS, ORDER, type RequestFact, SAMPLER_INIT } from "../support/llamaRequestFacts.ts"
import { postOnOwnConnection as post } from "./engine.ts"
import { type Pair, pairs } from "./simPair.ts"

const diff = pairs("cgn-real-diff8-")
let pair: Pair

beforeAll(async () => {
  pair = await diff.pair()
}, 30 * 60_000)

const body = (f: RequestFact, prompt = "a b") =>
  f.chat === true
    ? { messages: [{ role: "user", content: prompt }], max_tokens: 2, ...f.extra }
    : { prompt, max_tokens: 2, ...f.extra }

/** One server's answer: its status and, refused, its whole body; taken, whether its choice carries logprobs. */
const answerOf = async (base: string, f: RequestFact, prompt?: string) => {
  const r = await post(base, f.chat === true ? "/v1/chat/completions" : "/v1/completions", body(f, prompt))
  if (r.status !== 200) return { status: r.status, text: r.text }
  const choice = (JSON.parse(r.text) as { choices: Array<{ logprobs?: unknown }> }).choices[0]
  return { status: 200, logprobs: choice?.logprobs !== null && choice?.logprobs !== undefined }
}

/** The fact as the real server answers it (its 400s are invalid_request_error). */
const asFact = (f: RequestFact) =>
  f.refused === undefined
    ? { status: 200, logprobs: f.logprobs ?? false }
    : { status: 400, text: JSON.stringify({ error: { code: 400, message: f.refused, type: "invalid_request_error" } }) }

/** Each fact: the real server answers it, and the simulator as the real one does. */
const check = async (facts: ReadonlyArray<RequestFact>) => {
  for (const f of facts) {
    const real = await answerOf(pair.real, f)
    expect([f.why, real]).toEqual([f.why, asFact(f)])
    expect([f.why, await answerOf(pair.sim, f)]).toEqual([f.why, real])
  }
}

describe("request fields: the simulator against the real server, converted and checked as it does", () => {
  it("numbers converted to the field's C++ type before the range check (F3), logprobs after n_probs' wrap", async () => {
    await check(CONVERSIONS)
  })

  it("fields read by handlers of their own, in their words and the schema's order (F4)", async () => {
    await check(HANDLED_FIELDS)
  })

  it("the samplers' init refuses repeat_penalty (F5)", async () => {
    await check(SAMPLER_INIT)
  })

  it("a chat's grammar_lazy is its template's (F7); stream_options right after stream (F11)", async () => {
    await check(ORDER)
  })

  it("the samplers' init comes before a prompt's length against the context", async () => {
    const f: RequestFact = { why: "a prompt past the slot's context", extra: { repeat_penalty: 0 } }
    const long = Array.from({ length: 1100 }, () => "a").join(" ")
    const real = await answerOf(pair.real, f, long)
    expect(real).toEqual(
      asFact({ ...f, refused: "Failed to initialize samplers: penalty_repeat must be finite and greater than 0" })
    )
    expect(await answerOf(pair.sim, f, long)).toEqual(real)
  })
})
