// Differential check of the llama_cpp simulator against the real llama-server: a chat's own checks
// (oaicompat_chat_params_parse: tools, tool_choice, response_format, reasoning_format, json_schema with grammar,
// continue_final_message, tool calls, the template's json_schema), on /v1/chat/completions and /apply-template, before
// the schema's fields (F6); /detokenize's and /tokenize's items read as llama_token (F9); a slot's launch checks in
// their order (bad token ids, the samplers' init, then the context); `verbose`'s `__verbose` (F10) and
// `return_progress`'s prompt_progress chunks (F8) by their shapes. The same facts are pinned without the binary by
// test/sim/llama-chat-checks.test.ts.
import { beforeAll, describe, expect, it } from "vitest"
import { CHAT_CHECKS, type ChatFact, errorText } from "../support/llamaChatFacts.ts"
import {
  CHAT_TOP_LOGPROBS,
  chatProbsOf,
  LAUNCH_ORDER,
  PROGRESS_KEYS,
  PROGRESS_PER_CHOICE,
  progressPerChoice,
  TOKEN_ITEMS,
  TOKENS_CACHED,
  VERBOSE_ANSWER_KEYS
} from "../support/llamaLaunchFacts.ts"
import { postOnOwnConnection as post } from "./engine.ts"
import { orderedShape, type Pair, pairs } from "./simPair.ts"

const diff = pairs("cgn-real-diff9-")
let pair: Pair

beforeAll(async () => {
  pair = await diff.pair()
}, 30 * 60_000)

/** One server's answer to a fact: its status and, refused or answered from no sampling, its whole body. */
const answerOf = async (base: string, f: ChatFact) => {
  const r = await post(base, f.path, f.body)
  if (r.status !== 200) return { status: r.status, text: r.text }
  return f.answer === undefined ? { status: 200 } : { status: 200, body: JSON.parse(r.text) as unknown }
}

const asFact = (f: ChatFact) =>
  f.message !== undefined
    ? { status: f.status, text: errorText(f.status, f.message) }
    : f.answer === undefined
      ? { status: f.status }
      : { status: f.status, body: f.answer }

/** Each fact: the real server answers it, and the simulator as the real one does. */
const check = async (facts: ReadonlyArray<ChatFact>) => {
  for (const f of facts) {
    const real = await answerOf(pair.real, f)
    expect([f.why, real]).toEqual([f.why, asFact(f)])
    expect([f.why, await answerOf(pair.sim, f)]).toEqual([f.why, real])
  }
}

/** A stream's JSON events (without [DONE]), read whole. */
const events = async (base: string, p: string, body: Record<string, unknown>) => {
  const r = await post(base, p, { ...body, stream: true })
  expect(r.status).toBe(200)
  return r.text
    .split("\n\n")
    .filter((e) => e.startsWith("data: {"))
    .map((e) => JSON.parse(e.slice(6)) as Record<string, unknown>)
}

/** Events by their ordered shapes: the first, the last, and the set of all (a token's text is no shape). */
const shapes = (evs: ReadonlyArray<Record<string, unknown>>) => {
  const s = evs.map((e) => JSON.stringify(orderedShape(e)))
  return { first: s[0], last: s.at(-1), all: [...new Set(s)].sort() }
}

const chat = { messages: [{ role: "user", content: "a b" }], max_tokens: 2 }
const completion = { prompt: "a b", max_tokens: 2 }

describe("chat checks, token items and a slot's launch: the simulator against the real server", () => {
  it("a chat's own checks, in oaicompat_chat_params_parse's order and words, on both chat routes (F6)", async () => {
    await check(CHAT_CHECKS)
  })

  it("/detokenize and /tokenize read each item as a llama_token (F9)", async () => {
    await check(TOKEN_ITEMS)
  })

  it("a slot's launch: bad token ids, then the samplers' init, then the prompt against the context", async () => {
    await check(LAUNCH_ORDER)
  })
})

describe("verbose and return_progress: the simulator's shapes are the real server's", () => {
  it("`__verbose` on a whole answer, chat and completion (F10)", async () => {
    for (const [p, body] of [
      ["/v1/chat/completions", chat],
      ["/v1/completions", completion]
    ] as const) {
      const [r, s] = [
        await post(pair.real, p, { ...body, verbose: true }),
        await post(pair.sim, p, { ...body, verbose: true })
      ]
      const real = JSON.parse(r.text) as Record<string, unknown>
      expect([p, Object.keys(real)]).toEqual([p, VERBOSE_ANSWER_KEYS])
      expect([p, orderedShape(JSON.parse(s.text))]).toEqual([p, orderedShape(real)])
    }
  })

  it("`__verbose` in a stream: on a completion's every chunk, on a chat's finish chunk only (F10)", async () => {
    for (const [p, body] of [
      ["/v1/chat/completions", chat],
      ["/v1/completions", completion]
    ] as const) {
      const real = await events(pair.real, p, { ...body, verbose: true })
      expect([p, real.filter((e) => "__verbose" in e).length]).toEqual([p, p === "/v1/completions" ? real.length : 1])
      expect([p, shapes(await events(pair.sim, p, { ...body, verbose: true }))]).toEqual([p, shapes(real)])
    }
  })

  it("return_progress sends a stream's prompt_progress chunks first: 0%, then the whole prompt (F8)", async () => {
    for (const [p, body] of [
      ["/v1/chat/completions", chat],
      ["/v1/completions", completion],
      ["/v1/completions", { ...completion, verbose: true, timings_per_token: true }]
    ] as const) {
      const ask = { ...body, return_progress: true }
      const [real, sim] = [await events(pair.real, p, ask), await events(pair.sim, p, ask)]
      for (const evs of [real, sim]) {
        const progress = evs.map((e) => e.prompt_progress as Record<string, number> | undefined)
        expect([p, progress.slice(2).every((x) => x === undefined)]).toEqual([p, true])
        expect([p, Object.keys(progress[0] ?? {})]).toEqual([p, PROGRESS_KEYS])
        expect([p, progress[1]?.processed]).toEqual([p, progress[1]?.total])
      }
      expect([p, shapes(sim)]).toEqual([p, shapes(real)])
    }
  })
})

describe("values beside the shapes (llamaLaunchFacts.ts): the real server's, and the simulator's the same", () => {
  it("return_progress with several prompts: two prompt_progress chunks for each prompt's first, one for a child", async () => {
    for (const { body, chunks } of PROGRESS_PER_CHOICE)
      for (const base of pair.bases) {
        const evs = await events(base, "/v1/completions", { ...body, return_progress: true })
        expect([base, body, progressPerChoice(evs, chunks.length)]).toEqual([base, body, chunks])
      }
  })

  it("__verbose.tokens_cached: prompt and output tokens but the last; a chat's top_logprobs is its n_probs", async () => {
    for (const base of pair.bases) {
      for (const { body, cached } of TOKENS_CACHED) {
        const r = await post(base, "/v1/completions", { ...body, verbose: true })
        const v = (JSON.parse(r.text) as { __verbose: { tokens_cached: unknown } }).__verbose
        expect([base, body, v.tokens_cached]).toEqual([base, body, cached])
      }
      const chat = await post(base, "/v1/chat/completions", CHAT_TOP_LOGPROBS.body)
      const n = CHAT_TOP_LOGPROBS.nProbs
      expect([base, chatProbsOf(chat.text)]).toEqual([base, [[n, n], n]])
    }
  })
})
