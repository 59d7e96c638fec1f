// The llama_cpp simulator held to what the real llama-server was measured to answer (test/support/llamaChatFacts.ts,
// measured with test/real/sim-differential-9.test.ts, which sends the same requests to both): a chat's own checks on
// /v1/chat/completions and /apply-template (server-common.cpp oaicompat_chat_params_parse, common/chat.cpp), the
// items of /detokenize and /tokenize (get<llama_token>), a slot's launch checks in order (server-context.cpp
// launch_slot_with_task), `verbose`'s `__verbose` and `return_progress`'s prompt_progress chunks. Runs without the
// real binary.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { CHAT_CHECKS, type ChatFact, errorText } from "../support/llamaChatFacts.ts"
import {
  CHAT_TOP_LOGPROBS,
  chatProbsOf,
  LAUNCH_ORDER,
  PROGRESS_KEYS,
  PROGRESS_PER_CHOICE,
  progressPerChoice,
  SETTINGS_EXTRA_KEYS,
  TOKEN_ITEMS,
  TOKENS_CACHED,
  VERBOSE_ANSWER_KEYS,
  VERBOSE_FINAL_KEYS,
  VERBOSE_PARTIAL_KEYS
} from "../support/llamaLaunchFacts.ts"
import { type SimHandle, startSim } from "../support/sim.ts"
import { simGguf } from "../support/simModel.ts"

let sim: SimHandle

beforeAll(async () => {
  sim = await startSim({
    flavor: "llama_cpp",
    args: ["-m", simGguf("tiny.gguf"), "-a", "tiny", "-c", "1024", "-np", "2", "--sim-mode", "random"]
  })
}, 60_000)

afterAll(async () => {
  await sim?.stop()
})

const post = async (p: string, body: unknown) => {
  const r = await fetch(`${sim.url}${p}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body)
  })
  return { status: r.status, text: await r.text() }
}

/** What the simulator answers to a fact, in the fact's terms. */
const answerOf = async (f: ChatFact) => {
  const r = await post(f.path, f.body)
  if (r.status !== 200) return { status: r.status, text: r.text }
  return f.answer === undefined ? { status: 200 } : { status: 200, body: JSON.parse(r.text) as unknown }
}

const expected = (f: ChatFact) =>
  f.message !== undefined
    ? { status: f.status, text: errorText(f.status, f.message) }
    : f.answer === undefined
      ? { status: f.status }
      : { status: f.status, body: f.answer }

describe("llama_cpp simulator: a chat's own checks, in the real server's order and words (F6)", () => {
  it.each(CHAT_CHECKS.map((f) => [f.why, f] as const))("%s", async (_, f) => {
    expect(await answerOf(f)).toEqual(expected(f))
  })
})

describe("llama_cpp simulator: /detokenize and /tokenize items as llama_token (F9)", () => {
  it.each(TOKEN_ITEMS.map((f) => [f.why, f] as const))("%s", async (_, f) => {
    expect(await answerOf(f)).toEqual(expected(f))
  })
})

describe("llama_cpp simulator: a slot's launch checks in order", () => {
  it.each(LAUNCH_ORDER.map((f) => [f.why, f] as const))("%s", async (_, f) => {
    expect(await answerOf(f)).toEqual(expected(f))
  })
})

const events = async (p: string, body: Record<string, unknown>) => {
  const r = await post(p, { ...body, stream: true })
  return r.text
    .split("\n\n")
    .filter((e) => e.startsWith("data: {"))
    .map((e) => JSON.parse(e.slice(6)) as Record<string, Record<string, unknown>>)
}

const chat = { messages: [{ role: "user", content: "a b" }], max_tokens: 2 }
const completion = { prompt: "a b", max_tokens: 2 }

describe("llama_cpp simulator: verbose (F10) and return_progress (F8)", () => {
  it("a whole answer's __verbose: after id, the final result's keys, generation_settings with the full form's", async () => {
    for (const [p, body] of [
      ["/v1/chat/completions", chat],
      ["/v1/completions", completion]
    ] as const) {
      const answer = JSON.parse((await post(p, { ...body, verbose: true })).text) as Record<string, unknown>
      expect(Object.keys(answer)).toEqual(VERBOSE_ANSWER_KEYS)
      const v = answer.__verbose as Record<string, unknown>
      expect(Object.keys(v)).toEqual(VERBOSE_FINAL_KEYS)
      const keys = Object.keys(v.generation_settings as object)
      for (const [before, key] of SETTINGS_EXTRA_KEYS)
        expect([key, keys.indexOf(key)]).toEqual([key, keys.indexOf(before) + 1])
      expect(v).toMatchObject({ stop: true, stop_type: "limit", tokens_predicted: 2 })
    }
  })

  it("in a stream: every completion chunk carries one (partial, then final), a chat only its finish chunk", async () => {
    const c = await events("/v1/completions", { ...completion, verbose: true })
    expect(c.map((e) => Object.keys(e.__verbose ?? {}))).toEqual([
      VERBOSE_PARTIAL_KEYS,
      VERBOSE_PARTIAL_KEYS,
      VERBOSE_FINAL_KEYS
    ])
    const ch = await events("/v1/chat/completions", { ...chat, verbose: true })
    expect(ch.map((e) => "__verbose" in e)).toEqual([false, false, false, true])
    expect(Object.keys(ch.at(-1) ?? {}).slice(-2)).toEqual(["timings", "__verbose"])
  })

  it("return_progress: two prompt_progress chunks first (0%, then the whole prompt), then the tokens", async () => {
    const c = await events("/v1/completions", { ...completion, return_progress: true })
    expect(c.map((e) => e.prompt_progress)).toEqual([
      { total: 3, cache: 0, processed: 0, time_ms: 0 },
      { total: 3, cache: 0, processed: 3, time_ms: 0 },
      undefined,
      undefined,
      undefined
    ])
    expect(c[0]?.choices).toEqual([{ text: "", index: 0, logprobs: null, finish_reason: null }])
    const ch = await events("/v1/chat/completions", { ...chat, return_progress: true })
    expect(Object.keys(ch[0]?.prompt_progress ?? {})).toEqual(PROGRESS_KEYS)
    expect(ch.slice(0, 3).map((e) => e.choices)).toEqual(
      Array.from({ length: 3 }, () => [{ finish_reason: null, index: 0, delta: { role: "assistant", content: null } }])
    )
    // not without a stream
    const whole = JSON.parse((await post("/v1/completions", { ...completion, return_progress: true })).text)
    expect("prompt_progress" in whole).toBe(false)
  })
})

describe("llama_cpp simulator: values beside the shapes (llamaLaunchFacts.ts)", () => {
  it("return_progress with several prompts: two prompt_progress chunks for each prompt's first, one for a child", async () => {
    for (const { body, chunks } of PROGRESS_PER_CHOICE)
      expect([
        body,
        progressPerChoice(await events("/v1/completions", { ...body, return_progress: true }), chunks.length)
      ]).toEqual([body, chunks])
  })

  it("__verbose.tokens_cached: prompt and output tokens but the last", async () => {
    for (const { body, cached } of TOKENS_CACHED) {
      const v = (
        JSON.parse((await post("/v1/completions", { ...body, verbose: true })).text) as {
          __verbose: { tokens_cached: unknown }
        }
      ).__verbose
      expect([body, v.tokens_cached]).toEqual([body, cached])
    }
  })

  it("a chat's top_logprobs is its n_probs: each token's alternatives and generation_settings.n_probs", async () => {
    const n = CHAT_TOP_LOGPROBS.nProbs
    expect(chatProbsOf((await post("/v1/chat/completions", CHAT_TOP_LOGPROBS.body)).text)).toEqual([[n, n], n])
  })
})
