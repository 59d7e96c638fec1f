// llama.cpp's sampler chain keeps one candidate, whatever the model, at more than temperature <= 0 and top_k 1:
// a temperature of 1e-6 or below, a top_p at or below 1 / top_k's candidates, a min_p of 1 or more (the default
// chain or the request's own `samplers` holding them, min_keep <= 1, no mirostat), and not at top_k 1 or temperature 0
// where the chain does not hold that sampler, nor at temperature 0 with a dynamic range. The seed 4294967295 (-1) is
// a random one, for each of `n` completions. The real llama-server repeats its text for the same prompt exactly where
// these say (test/real/sim-differential-11.test.ts measures it); the simulator did not.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { parseArgs } from "../../src/sim/args.ts"
import { llamaParams } from "../../src/sim/llamaRequest.ts"
import { type GenRequest, validate } from "../../src/sim/request.ts"
import { postJson, type SimHandle, startSim } from "../support/sim.ts"
import { simGguf } from "../support/simModel.ts"

const greedy = (b: Record<string, unknown>) => (llamaParams(b, 2) as { greedy: boolean }).greedy

describe("llama.cpp: what its sampler chain makes greedy", () => {
  it("a temperature at or below 1e-6, under mirostat too; 1e-5 and up samples", () => {
    expect([
      greedy({ temperature: 1e-8 }),
      greedy({ temperature: 1e-6 }),
      greedy({ temperature: 1e-6, mirostat: 2 })
    ]).toEqual([true, true, true])
    expect([greedy({ temperature: 1e-5 }), greedy({ temperature: 0.01 })]).toEqual([false, false])
  })

  it("top_p at or below 1 / top_k's candidates (40 by default, the vocabulary when top_k <= 0)", () => {
    expect([greedy({ top_p: 1e-9 }), greedy({ top_p: 0.025 }), greedy({ top_p: 0.01 })]).toEqual([true, true, true])
    expect([greedy({ top_k: 100, top_p: 0.0099 }), greedy({ top_k: -1, top_p: 3e-5 })]).toEqual([true, true])
    expect([greedy({ top_p: 0.026 }), greedy({ top_k: -1, top_p: 0.01 }), greedy({ top_p: 0.5 })]).toEqual([
      false,
      false,
      false
    ])
  })

  it("min_p of 1 or more", () => {
    expect([greedy({ min_p: 1 }), greedy({ min_p: 1.5, top_k: -1 }), greedy({ min_p: 0.99 })]).toEqual([
      true,
      true,
      false
    ])
  })

  it("none of top_p's and min_p's under mirostat, with min_keep above 1, or in a request's own chain without them", () => {
    for (const b of [{ mirostat: 2 }, { min_keep: 3 }, { samplers: ["temperature"] }, { samplers: "t" }]) {
      expect([greedy({ top_p: 1e-9, ...b }), greedy({ min_p: 1, ...b })]).toEqual([false, false])
    }
    // a `samplers` of another type is ignored (llamaFields.ts samplers): the default chain
    expect(greedy({ top_p: 1e-9, samplers: 5 })).toBe(true)
  })

  it("a request's own chain: only its samplers count, by name (any alias, any case) or letter, in its order", () => {
    expect([greedy({ top_k: 1, samplers: "t" }), greedy({ top_k: 1, samplers: ["temperature"] })]).toEqual([
      false,
      false
    ])
    expect([greedy({ top_k: 1, samplers: ["Top-K"] }), greedy({ top_k: 1, samplers: "kt" })]).toEqual([true, true])
    expect([greedy({ min_p: 1, samplers: ["minp"] }), greedy({ top_p: 1e-9, samplers: ["nucleus"] })]).toEqual([
      true,
      true
    ])
    // top_p before top_k: the whole vocabulary's softmax, where 0.01 is no longer at most 1 / candidates
    expect([greedy({ top_p: 0.01, samplers: "kp" }), greedy({ top_p: 0.01, samplers: "pk" })]).toEqual([true, false])
    // no temperature sampler in the chain: temperature 0 is not read, the dist sampler draws
    expect([greedy({ temperature: 0, samplers: "k" }), greedy({ temperature: 0, samplers: [] })]).toEqual([
      false,
      false
    ])
  })

  it("temperature 0 with a dynamic range (dynatemp_range > 0) samples; under mirostat the range is not read", () => {
    expect([
      greedy({ temperature: 0, dynatemp_range: 0.5 }),
      greedy({ temperature: 0, dynatemp_range: 0.5, mirostat: 2 })
    ]).toEqual([false, true])
  })
})

describe("llama.cpp: the seed 4294967295 (-1 as sent, LLAMA_DEFAULT_SEED) asks for a random one", () => {
  const cfg = parseArgs(["-m", "/models/tiny.gguf", "-np", "4"])
  const seeds = (body: Record<string, unknown>) =>
    (validate(cfg, "completion", { prompt: "a b", ...body }, "") as GenRequest).sequences.map((q) => q.seed)

  it("for every completion of the prompt (add_child keeps it); another seed counts up", () => {
    expect([seeds({ seed: -1, n: 3 }), seeds({ seed: 4294967295, n: 2 })]).toEqual([
      [undefined, undefined, undefined],
      [undefined, undefined]
    ])
    expect([seeds({ seed: 4294967294, n: 2 }), seeds({ seed: 5, n: 3 })]).toEqual([
      [4294967294, 4294967295],
      [5, 6, 7]
    ])
  })
})

describe("llama_cpp simulator: these give the same text for the same prompt", () => {
  let sim: SimHandle
  beforeAll(async () => {
    sim = await startSim({
      flavor: "llama_cpp",
      args: ["-m", simGguf("tiny.gguf"), "-np", "2", "--sim-mode", "random"]
    })
  })
  afterAll(async () => {
    await sim?.stop()
  })

  const texts = async (body: Record<string, unknown>): Promise<number> => {
    const seen = new Set<string>()
    for (let i = 0; i < 3; i++) {
      const r = await postJson(`${sim.url}/v1/completions`, { prompt: "the quick brown fox", max_tokens: 8, ...body })
      expect(r.status).toBe(200)
      seen.add((r.json as { choices: Array<{ text: string }> }).choices[0]?.text ?? "")
    }
    return seen.size
  }

  it("one text each for temperature 1e-8, top_p 1e-9, min_p 1; several for top_p 0.5", async () => {
    const greedyBodies = [{ temperature: 1e-8 }, { top_p: 1e-9 }, { min_p: 1 }]
    expect(await Promise.all(greedyBodies.map(texts))).toEqual([1, 1, 1])
    expect(await texts({ top_p: 0.5 })).toBeGreaterThan(1)
  })

  it("several for top_k 1 outside the chain, temperature 0 with a dynamic range, and the random seed (-1)", async () => {
    for (const b of [
      { top_k: 1, samplers: "t" },
      { temperature: 0, dynatemp_range: 0.5 },
      { temperature: 0.7, seed: -1 },
      { temperature: 0.7, seed: 4294967295 }
    ])
      expect([b, (await texts(b)) > 1]).toEqual([b, true])
  })
})
