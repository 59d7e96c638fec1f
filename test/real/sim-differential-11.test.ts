// Differential check of the llama_cpp simulator against the real llama-server: which sampling settings give the same
// text for the same prompt. Beside temperature <= 0 and top_k 1, llama-server's sampler chain keeps one candidate at
// a tiny temperature (1e-8, 1e-6: expf underflows past the top logit), a top_p at or below 1 / top_k's candidates
// (1e-9, 0.025 of the default 40, 0.0099 of 100, 3e-5 of the whole vocabulary at top_k -1) and a min_p of 1 or more;
// not under mirostat (temperature aside), with min_keep above 1, or where a request's own `samplers` chain lacks the
// sampler (top_k 1 and temperature 0 too), nor at temperature 0 with a dynamic range (src/sim/llamaGreedy.ts). The
// seed 4294967295 (-1) is a random one, for each of `n` completions (src/sim/llamaValidate.ts). The agent-level
// differential fuzz (temperature 1e-8, top_p 1e-9 and 0.01) drew the first.
// The real answer's text cannot be the simulator's (the tiny model's weights are random), whether it repeats can.
import { beforeAll, describe, expect, it } from "vitest"
import { postOnOwnConnection as post } from "./engine.ts"
import { type Pair, pairs } from "./simPair.ts"

const diff = pairs("cgn-real-diff11-")
let pair: Pair

beforeAll(async () => {
  pair = await diff.pair()
}, 30 * 60_000)

/** Whether three completions of one prompt give one text (each choice's, `n` of them, in order). */
const repeats = async (base: string, sampling: Record<string, unknown>): Promise<boolean> => {
  const texts = new Set<string>()
  for (let i = 0; i < 3; i++) {
    const r = await post(base, "/v1/completions", { prompt: "the quick brown fox", max_tokens: 8, ...sampling })
    expect(r.status, r.text).toBe(200)
    const choices = (JSON.parse(r.text) as { choices: Array<{ index: number; text: string }> }).choices
    texts.add(JSON.stringify([...choices].sort((a, b) => a.index - b.index).map((c) => c.text)))
  }
  return texts.size === 1
}

const GREEDY: ReadonlyArray<Record<string, unknown>> = [
  { temperature: 1e-8 },
  { temperature: 1e-6 },
  { temperature: 1e-6, mirostat: 2 },
  { top_p: 1e-9 },
  { top_p: 0.025 },
  { top_k: 100, top_p: 0.0099 },
  { top_k: -1, top_p: 3e-5 },
  { min_p: 1 },
  { top_k: -1, min_p: 1.5 },
  // a request's own chain holding the sampler, by any of its names
  { top_k: 1, samplers: ["Top-K"] },
  { min_p: 1, samplers: ["minp"] },
  { top_p: 0.01, samplers: "kp" },
  // mirostat's temperature has no dynamic range
  { temperature: 0, dynatemp_range: 0.5, mirostat: 2 }
]

const SAMPLED: ReadonlyArray<Record<string, unknown>> = [
  { top_p: 0.5 },
  { top_k: -1, top_p: 0.5 },
  { top_p: 1e-9, mirostat: 2 },
  { min_p: 1, mirostat: 2 },
  { top_p: 1e-9, samplers: ["temperature"] },
  { top_p: 1e-9, samplers: "t" },
  { top_p: 1e-9, min_keep: 3 },
  { min_p: 1, min_keep: 2 },
  // top_k 1 and temperature 0 where the chain does not hold them, a dynamic temperature range
  { top_k: 1, samplers: "t" },
  { top_k: 1, samplers: ["temperature"] },
  { temperature: 0, samplers: "k" },
  { temperature: 0, dynatemp_range: 0.5 },
  // LLAMA_DEFAULT_SEED: a random seed (src/llama-sampler.cpp get_rng_seed)
  { temperature: 0.7, seed: -1 },
  { temperature: 0.7, seed: 4294967295 },
  { temperature: 0.7, seed: -1, n: 2 }
]

describe("the same prompt, the same text: as the real server's sampler chain decides", () => {
  it("one candidate left: both repeat their text", async () => {
    for (const s of GREEDY) {
      expect([s, await repeats(pair.real, s)]).toEqual([s, true])
      expect([s, await repeats(pair.sim, s)]).toEqual([s, true])
    }
  })

  it("several left: neither does (five tries at most, where a random model may draw the same words twice)", async () => {
    for (const s of SAMPLED) {
      for (const base of pair.bases) {
        let varied = false
        for (let i = 0; i < 5 && !varied; i++) varied = !(await repeats(base, s))
        expect([s, base === pair.real ? "real" : "sim", varied]).toEqual([s, base === pair.real ? "real" : "sim", true])
      }
    }
  })
})
