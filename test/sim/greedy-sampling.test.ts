// Greedy sampling in every flavor of the simulator (random words): the same prompt gives the same text, as the real
// engines' greedy sampling does (real llama-server: " will will will will will will" twice for "the quick brown fox"
// at temperature 0). What each engine calls greedy is requestChecks.ts greedySampling's (vLLM, SGLang, mlx-lm) and
// llamaRequest.ts llamaParams' (llama.cpp). And llama-server's first generated piece has its leading space, as every
// piece does (common_token_to_piece of a SentencePiece "▁word"), in completions and chats alike (measured).
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { llamaParams } from "../../src/sim/llamaRequest.ts"
import { greedySampling } from "../../src/sim/requestChecks.ts"
import type { SimConfig } from "../../src/sim/simConfig.ts"
import { plan, prng } from "../../src/sim/tokens.ts"
import { postJson, type SimFlavor, type SimHandle, startSim } from "../support/sim.ts"
import { simGguf } from "../support/simModel.ts"

const RANDOM = ["--sim-mode", "random"]
const ARGS: Record<SimFlavor, ReadonlyArray<string>> = {
  vllm: ["serve", "m", ...RANDOM],
  sglang: ["--model-path", "m", ...RANDOM],
  llama_cpp: ["-m", simGguf("tiny.gguf"), "-np", "2", ...RANDOM],
  mlx: ["--model", "mlx-community/tiny", ...RANDOM]
}
const FLAVORS = Object.keys(ARGS) as Array<SimFlavor>

const cfg = (flavor: SimFlavor) => ({ flavor }) as SimConfig

describe("what each flavor calls greedy", () => {
  it("vLLM: temperature below 1e-5 (default 1); SGLang below 1e-6 (default 1); mlx-lm 0 (its default); top_k 1", () => {
    const greedy = (f: SimFlavor, b: Record<string, unknown>) => greedySampling(cfg(f), b)
    expect([greedy("vllm", { temperature: 0 }), greedy("vllm", { temperature: 9e-6 })]).toEqual([true, true])
    expect([greedy("vllm", { temperature: 1e-5 }), greedy("vllm", {})]).toEqual([false, false])
    expect([greedy("sglang", { temperature: 9e-7 }), greedy("sglang", { temperature: 2e-6 })]).toEqual([true, false])
    expect(greedy("sglang", {})).toBe(false)
    expect([greedy("mlx", {}), greedy("mlx", { temperature: 1e-9 })]).toEqual([true, false])
    for (const f of ["vllm", "sglang", "mlx"] as const) {
      expect([greedy(f, { temperature: 1, top_k: 1 }), greedy(f, { temperature: 1, top_k: 2 })]).toEqual([true, false])
    }
  })

  it("llama.cpp: temperature <= 0 (default 0.8), or top_k 1 unless mirostat samples", () => {
    const greedy = (b: Record<string, unknown>) => (llamaParams(b, 2) as { greedy: boolean }).greedy
    expect([greedy({ temperature: 0 }), greedy({ temperature: -1 }), greedy({})]).toEqual([true, true, false])
    expect([greedy({ temperature: 0.01 }), greedy({ top_k: 1 }), greedy({ top_k: 1, mirostat: 2 })]).toEqual([
      false,
      true,
      false
    ])
  })
})

describe("the first generated word", () => {
  it("llama.cpp's has its leading space; the others' (and echo's) none", () => {
    expect(plan("random", ["a"], 2, prng(1), false, true).tokens.every((t) => t.startsWith(" "))).toBe(true)
    expect(plan("random", ["a"], 2, prng(1)).tokens[0]?.startsWith(" ")).toBe(false)
    expect(plan("echo", ["a", "b"], 2, prng(1), false, true).tokens).toEqual(["a", " b"])
  })
})

describe.each(FLAVORS)("%s: a greedy request's text is its prompt's", (flavor) => {
  let sim: SimHandle
  beforeAll(async () => {
    sim = await startSim({ flavor, args: ARGS[flavor] })
  })
  afterAll(async () => {
    await sim?.stop()
  })

  const text = async (body: Record<string, unknown>): Promise<string> => {
    const model = flavor === "mlx" ? "mlx-community/tiny" : "m"
    const r = await postJson(`${sim.url}/v1/completions`, { model, max_tokens: 8, ...body })
    expect(r.status).toBe(200)
    return (r.json as { choices: Array<{ text: string }> }).choices[0]?.text ?? ""
  }

  it("the same prompt twice: the same text, whatever the seed; another prompt: other text", async () => {
    const fox = { prompt: "the quick brown fox", temperature: 0 }
    const first = await text(fox)
    expect(await text(fox)).toBe(first)
    expect(await text({ ...fox, seed: 7 })).toBe(first)
    expect(await text({ ...fox, temperature: 1, top_k: 1 })).toBe(first)
    expect(await text({ ...fox, prompt: "the lazy dog" })).not.toBe(first)
  })

  it("sampled (temperature 1): the shared stream, another text each time", async () => {
    const texts = new Set<string>()
    for (let i = 0; i < 3; i++) texts.add(await text({ prompt: "the quick brown fox", temperature: 1 }))
    expect(texts.size).toBeGreaterThan(1)
  })
})

describe("llama_cpp: every generated piece has its leading space, the first one too", () => {
  let sim: SimHandle
  beforeAll(async () => {
    sim = await startSim({ flavor: "llama_cpp", args: ARGS.llama_cpp })
  })
  afterAll(async () => {
    await sim?.stop()
  })

  it("a stop at a space ends at the first piece, none of its text out (real: finish stop, '', 1 token)", async () => {
    const r = await postJson(`${sim.url}/v1/completions`, { prompt: " ", stop: [" "], max_tokens: 1, temperature: 0 })
    const body = r.json as { choices: Array<{ text: string; finish_reason: string }>; usage: Record<string, number> }
    expect([body.choices[0]?.finish_reason, body.choices[0]?.text]).toEqual(["stop", ""])
    expect(body.usage.completion_tokens).toBe(1)
  })

  it("/v1/completions and a chat's answer begin with a space", async () => {
    const v = await postJson(`${sim.url}/v1/completions`, { prompt: "hello", max_tokens: 3 })
    expect((v.json as { choices: Array<{ text: string }> }).choices[0]?.text).toMatch(/^( [a-z]+){3}$/)
    const h = await postJson(`${sim.url}/v1/chat/completions`, {
      messages: [{ role: "user", content: "hello" }],
      max_tokens: 3
    })
    const content = (json: unknown) =>
      (json as { choices: Array<{ message: { content: string } }> }).choices[0]?.message.content
    expect(content(h.json)).toMatch(/^( [a-z]+){3}$/)
    // an assistant prefill leads as it is: the first piece brings its own space (real: "The" -> "The will will")
    const p = await postJson(`${sim.url}/v1/chat/completions`, {
      messages: [
        { role: "user", content: "hello" },
        { role: "assistant", content: "The" }
      ],
      max_tokens: 2
    })
    expect(content(p.json)).toMatch(/^The( [a-z]+){2}$/)
  })
})
