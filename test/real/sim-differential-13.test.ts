// Differential check of the llama_cpp simulator against the real llama-server, on what earlier suites compared by
// shape only or not at all:
// - a task's params in /slots (and a `__verbose` answer's generation_settings): the request's sampling fields as the
//   schema keeps them (float values, set_limits' clamps, dry_base below 1, samplers by name or letter,
//   reasoning_format), the fields' refusals word for word beside them (src/sim/llamaSlotParams.ts);
// - /tokenize and /detokenize with the model's vocabulary: ids, pieces (a byte that is no UTF-8 alone as numbers),
//   add_special, parse_special, leading and repeated spaces, the whole vocabulary's pieces (src/sim/llamaVocab.ts);
// - the POST routes a server without their flag refuses 501 whatever the body (src/sim/llamaUnsupported.ts);
// - a body of whitespace alone: nlohmann's words, its line and column (src/sim/errors.ts).
import { beforeAll, describe, expect, it } from "vitest"
import { postOnOwnConnection as post, requestOnOwnConnection } from "./engine.ts"
import { type Pair, pairs } from "./simPair.ts"

const diff = pairs("cgn-real-diff13-")
let pair: Pair

beforeAll(async () => {
  pair = await diff.pair()
}, 30 * 60_000)

const C = "/v1/completions"
const H = "/v1/chat/completions"

interface Slot {
  readonly id_task?: number
  readonly params?: Record<string, unknown>
}

/** A request's status and refusal, then its task's params as /slots shows them (its latest task's). */
const taskParams = async (base: string, p: string, body: Record<string, unknown>) => {
  const r = await post(base, p, body)
  if (r.status !== 200) return { status: r.status, text: r.text }
  const slots = JSON.parse((await requestOnOwnConnection(`${base}/slots`)).text) as Array<Slot>
  const latest = slots.filter((s) => s.id_task !== undefined).sort((a, b) => (b.id_task ?? 0) - (a.id_task ?? 0))[0]
  type Whole = { choices?: Array<{ __verbose?: { generation_settings?: unknown } }> }
  // a stream's text is its events: no __verbose asked of one here
  const verbose = body.stream === true ? undefined : (JSON.parse(r.text) as Whole).choices?.[0]?.__verbose
  // the key order too: llama-server writes ordered JSON
  return { status: 200, params: JSON.stringify(latest?.params), verbose: JSON.stringify(verbose?.generation_settings) }
}

const SET = {
  temperature: 0.3,
  top_k: 7,
  top_p: 0.5,
  min_p: 0.1,
  top_n_sigma: 1.5,
  xtc_probability: 0.5,
  xtc_threshold: 0.3,
  typical_p: 0.7,
  repeat_last_n: 8,
  repeat_penalty: 1.1,
  presence_penalty: 0.4,
  frequency_penalty: 0.2,
  dry_multiplier: 0.8,
  dry_base: 1.5,
  dry_allowed_length: 3,
  dry_penalty_last_n: 0,
  dry_sequence_breakers: ["a", "b"],
  mirostat: 2,
  mirostat_tau: 4,
  mirostat_eta: 0.2,
  dynatemp_range: 0.2,
  dynatemp_exponent: 2,
  adaptive_target: 0.5,
  adaptive_decay: 0.5,
  n_keep: 3,
  n_discard: 1,
  min_keep: 3,
  n_probs: 2,
  samplers: ["top_k", "temperature"],
  backend_sampling: true,
  seed: 5
}

/** One field at a time: valid, at and past its limits (clamped or refused), of a wrong type. */
const EDGES: ReadonlyArray<Record<string, unknown>> = [
  ...[0, 0.5, 1, 1.5, -1, "0.5", null, true].map((xtc_probability) => ({ xtc_probability })),
  ...[0, 0.6, 1, -1, "x"].map((xtc_threshold) => ({ xtc_threshold })),
  ...[0, 0.5, 2, -1, "x"].map((typical_p) => ({ typical_p })),
  ...[-1, 0, 2.5, -7, "x"].map((top_n_sigma) => ({ top_n_sigma })),
  ...[0, 0.8, -1, "x"].map((dry_multiplier) => ({ dry_multiplier })),
  ...[1.75, 0, 0.5, 1, -1, "x"].map((dry_base) => ({ dry_base })),
  ...[0, 2, -1, 1.5, "x"].map((dry_allowed_length) => ({ dry_allowed_length })),
  ...[-1, 0, 64, -2, "x"].map((dry_penalty_last_n) => ({ dry_penalty_last_n })),
  ...[["\n"], [], "x", [1]].map((dry_sequence_breakers) => ({ dry_sequence_breakers })),
  ...[0, 1, 2, 3, -1, 1.5, "x"].map((mirostat) => ({ mirostat })),
  ...[0, -1, 1e39, "x"].map((mirostat_tau) => ({ mirostat_tau })),
  ...[0, -1, "x"].map((mirostat_eta) => ({ mirostat_eta })),
  ...[0, 1, 100, -1, "x"].map((min_keep) => ({ min_keep })),
  ...[0, 1, 5, -1, "x"].map((n_probs) => ({ n_probs })),
  ...[-5, 1e10, true].map((top_k) => ({ top_k })),
  ...[1.5, -1].map((top_p) => ({ top_p })),
  ...[2, -1].map((min_p) => ({ min_p })),
  ...[-1, 1e30].map((temperature) => ({ temperature })),
  { adaptive_target: 3 },
  { n_keep: -1 },
  ...["kxyzt", "", 5, [], ["TOP-K", "topp", "nucleus", "bogus", "temp", "typ", "top_k"]].map((samplers) => ({
    samplers
  })),
  ...["none", "auto", "deepseek-legacy"].map((reasoning_format) => ({ reasoning_format })),
  { reasoning_format: "deepseek-legacy", stream: true }
]

describe("a task's params: the simulator against the real server", () => {
  it("every sampling field set: /slots shows the request's values, on completions and chats, and __verbose", async () => {
    const bodies: Array<[string, Record<string, unknown>]> = [
      [C, { prompt: "the quick", max_tokens: 2, ...SET }],
      [H, { messages: [{ role: "user", content: "hi" }], max_tokens: 2, ...SET }],
      [C, { prompt: "the quick", max_tokens: 2, verbose: true, ...SET }],
      [H, { messages: [{ role: "user", content: "hi" }], max_tokens: 2, samplers: "tk", reasoning_format: "none" }]
    ]
    for (const [p, body] of bodies) {
      const real = await taskParams(pair.real, p, body)
      expect(real.status).toBe(200)
      expect([p, body, await taskParams(pair.sim, p, body)]).toEqual([p, body, real])
    }
  })

  it("each field at its edges: refused alike word for word, or taken and shown clamped as the real server keeps it", async () => {
    for (const edge of EDGES) {
      const body = { prompt: "the quick", max_tokens: 2, ...edge }
      const real = await taskParams(pair.real, C, body)
      expect([edge, await taskParams(pair.sim, C, body)]).toEqual([edge, real])
    }
  })
})

/** Both servers' answers to a POST of `raw` (a JSON value, or a raw body): status, content type and body. */
const both = async (p: string, raw: unknown, asText = false) => {
  const init = {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: asText ? (raw as string) : JSON.stringify(raw)
  }
  const answer = async (base: string) => {
    const r = await requestOnOwnConnection(`${base}${p}`, init)
    return [r.status, r.text]
  }
  return { real: await answer(pair.real), sim: await answer(pair.sim) }
}

describe("/tokenize and /detokenize with the model's vocabulary: the simulator against the real server", () => {
  it("ids and pieces: spaces, add_special, parse_special, with_pieces, bytes, ids mixed in", async () => {
    const cases: ReadonlyArray<Record<string, unknown>> = [
      { content: "hello" },
      { content: " hello" },
      { content: "  hello   world  " },
      { content: "\n\t x" },
      { content: "hello", with_pieces: true },
      { content: "  hello  wörld", with_pieces: true, add_special: true },
      { content: "héllo 🙂 日本語", with_pieces: true },
      { content: "a</s>b<s> c", with_pieces: true },
      { content: "a</s>b<s> c", with_pieces: true, parse_special: false },
      { content: "hello", add_special: "yes", with_pieces: 1, parse_special: "no" },
      { content: "", add_special: true },
      { content: [" a", 5, "b"], with_pieces: true, add_special: true },
      { content: [5, "hello"], add_special: true },
      { content: ["hello", " world"], add_special: true },
      { content: [32000], with_pieces: true }
    ]
    for (const body of cases) {
      const r = await both("/tokenize", body)
      expect([body, r.sim]).toEqual([body, r.real])
    }
    const tokens: ReadonlyArray<Array<number>> = [
      [1, 22172, 3186],
      [29871, 22172],
      [259, 259, 13],
      [243, 162, 156, 133],
      [243, 263],
      [131],
      [0, 1, 2, 3],
      [30143]
    ]
    for (const t of tokens) {
      const r = await both("/detokenize", { tokens: t })
      expect([t, r.sim]).toEqual([t, r.real])
    }
  })

  it("every token of the vocabulary: the same piece", async () => {
    const r = await both("/tokenize", { content: Array.from({ length: 32000 }, (_, i) => i), with_pieces: true })
    expect(r.real[0]).toBe(200)
    const pieces = (text: unknown) => (JSON.parse(text as string) as { tokens: Array<unknown> }).tokens
    const [real, sim] = [pieces(r.real[1]), pieces(r.sim[1])]
    expect(sim.filter((s, i) => JSON.stringify(s) !== JSON.stringify(real[i]))).toEqual([])
    expect(sim).toHaveLength(real.length)
  })
})

describe("routes a server without their flag refuses, and bodies of whitespace: the simulator against the real server", () => {
  it("501 whatever the body: infill, embeddings, rerank, POST /props, slot actions, audio transcriptions", async () => {
    const paths = [
      ...["/infill", "/embedding", "/embeddings", "/v1/embeddings", "/rerank", "/reranking", "/v1/rerank"],
      ...["/v1/reranking", "/props", "/slots/0", "/slots/", "/slots/0?action=save", "/v1/audio/transcriptions"],
      "/audio/transcriptions"
    ]
    for (const p of paths) {
      for (const raw of ["", "x", '{"content":"a"}']) {
        const seen = async (base: string) => {
          const r = await fetch(`${base}${p}`, {
            method: "POST",
            body: raw,
            headers: { "content-type": "application/json" }
          })
          return [p, raw, r.status, r.headers.get("content-type"), r.headers.get("connection"), await r.text()]
        }
        const real = await seen(pair.real)
        expect(real[2]).toBe(501)
        expect(await seen(pair.sim)).toEqual(real)
      }
    }
    // one path segment only: /slots/0/x has no route
    const deeper = await both("/slots/0/x", {})
    expect([deeper.real[0], deeper.sim]).toEqual([404, deeper.real])
  })

  it("a body of whitespace alone: nlohmann's end-of-input error, at its line and column", async () => {
    for (const p of [C, H, "/tokenize", "/apply-template"]) {
      for (const raw of ["   ", "\n", "\t\r\n  \n\t", " \r "]) {
        const r = await both(p, raw, true)
        expect([p, raw, r.sim]).toEqual([p, raw, r.real])
      }
    }
  })
})
