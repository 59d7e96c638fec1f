// Pins of the simulator's request handling that a mutation audit found unguarded (review 36, mutSimA SA01-SA12):
// each case is an upstream engine's behaviour the simulator models, checked where a changed line would show.
import { spawnSync } from "node:child_process"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { parsePromText, pickSum } from "../../src/services/engine/PromText.ts"
import { prefillLossOf } from "../../src/sim/pd.ts"
import { sglangHealthOf } from "../../src/sim/sglangHealth.ts"
import { getJson, postJson, readUntilPing, type SimHandle, simEntry, sseData, startSim } from "../support/sim.ts"
import { simGguf } from "../support/simModel.ts"

let vllm: SimHandle
let sglang: SimHandle
let mlx: SimHandle

beforeAll(async () => {
  ;[vllm, sglang, mlx] = await Promise.all([
    startSim({ args: ["serve", "org/m", "--sim-block-size", "4"] }),
    startSim({ args: ["--model-path", "org/sg", "--served-model-name", "sg", "--enable-metrics"] }),
    startSim({ args: ["--model", "mlx-community/tiny"] })
  ])
})
afterAll(() => Promise.all([vllm, sglang, mlx].map((s) => s?.stop())))

/** The sum of a counter's samples on a simulator's /metrics. */
const counter = async (sim: SimHandle, name: string): Promise<number> =>
  pickSum(parsePromText(await (await fetch(`${sim.url}/metrics`)).text(), new Set([name])), [name]) ?? Number.NaN

type Choice = { text: string; finish_reason: string }
const choicesOf = (json: unknown): Array<Choice> => (json as { choices: Array<Choice> }).choices

describe("SGLang's refusal of max_tokens <= 0 (SA01)", () => {
  // Only CompletionRequest has validate_max_tokens_positive (sgl-project/sglang python/sglang/srt/entrypoints/openai/
  // protocol.py); ChatCompletionRequest has none and hands `max_completion_tokens or max_tokens` to SamplingParams,
  // whose verify refuses only a negative max_new_tokens (python/sglang/srt/sampling/sampling_params.py).
  it("a chat's max_tokens 0 is served (nothing generated, finish length), a negative one refused in verify's words", async () => {
    const chat = (max: number) =>
      postJson(`${sglang.url}/v1/chat/completions`, { messages: [{ role: "user", content: "a b" }], max_tokens: max })
    const negative = await chat(-1)
    expect(negative.status).toBe(400)
    expect(negative.json).toMatchObject({ message: "max_new_tokens must be at least 0, got -1.", param: "max_tokens" })
    const zero = await chat(0)
    expect(zero.status).toBe(200)
    expect(zero.json).toMatchObject({
      choices: [{ message: { content: "" }, finish_reason: "length" }],
      usage: { completion_tokens: 0 }
    })
    const completion = await postJson(`${sglang.url}/v1/completions`, { prompt: "a b", max_tokens: 0 })
    expect(completion.status).toBe(400)
    expect(completion.text).toContain("max_tokens must be positive")
  })
})

describe("cache_salt (SA02)", () => {
  const SALT_TEXT = "Parameter 'cache_salt' must be a non-empty string if provided."

  it.each([
    ["an empty string", ""],
    ["a number", 5],
    ["a list", ["s"]]
  ])("vLLM refuses %s with its 400 validation error", async (_name, salt) => {
    for (const [path, body] of [
      ["/v1/completions", { prompt: "a b", cache_salt: salt }],
      ["/v1/chat/completions", { messages: [{ role: "user", content: "a b" }], cache_salt: salt }]
    ] as const) {
      const r = await postJson(`${vllm.url}${path}`, body)
      expect(r.status).toBe(400)
      expect(r.json).toEqual({
        error: { message: expect.stringContaining(SALT_TEXT), type: "Bad Request", param: "cache_salt", code: 400 }
      })
    }
  })

  it("vLLM serves a null or non-empty salt", async () => {
    for (const salt of [null, "s"]) {
      expect((await postJson(`${vllm.url}/v1/completions`, { prompt: "a b", cache_salt: salt })).status).toBe(200)
    }
  })

  // SGLang joins only truthy salts into the request's extra key (python/sglang/srt/entrypoints/openai/serving_base.py
  // _compute_extra_key), so "" is no salt: the prompt hits the blocks an unsalted request cached.
  it("SGLang takes an empty salt as none: the same prefix-cache hits as unsalted", async () => {
    const prompt = "s1 s2 s3 s4 s5 s6"
    const cached = async (extra: Record<string, unknown>) => {
      const before = await counter(sglang, "sglang:cached_tokens_total")
      expect((await postJson(`${sglang.url}/v1/completions`, { prompt, max_tokens: 1, ...extra })).status).toBe(200)
      return (await counter(sglang, "sglang:cached_tokens_total")) - before
    }
    await cached({})
    const unsalted = await cached({})
    expect(unsalted).toBeGreaterThan(0)
    expect(await cached({ cache_salt: "" })).toBe(unsalted)
    expect(await cached({ cache_salt: "other" })).toBe(0)
  })
})

describe("mlx-lm has no ignore_eos (SA03)", () => {
  // mlx_lm/server.py reads no `ignore_eos`: the echo still ends at the prompt's end (its EOS).
  it("an echo with ignore_eos true still stops at the prompt's length", async () => {
    const r = await postJson(`${mlx.url}/v1/completions`, { prompt: "a b c", max_tokens: 10, ignore_eos: true })
    expect(r.status).toBe(200)
    expect(choicesOf(r.json)[0]).toMatchObject({ text: "a b c", finish_reason: "stop" })
  })
})

describe("vLLM's prefix-cache counters (SA04)", () => {
  // vllm/v1/core/kv_cache_manager.py get_computed_blocks counts every queried prompt token (PrefixCacheStats.queries).
  it("prefix_cache_queries_total grows by the prompt's tokens; a repeated prompt moves the hits", async () => {
    const prompt = "q1 q2 q3 q4 q5 q6 q7 q8 q9"
    const queries = await counter(vllm, "vllm:prefix_cache_queries_total")
    expect((await postJson(`${vllm.url}/v1/completions`, { prompt, max_tokens: 1 })).status).toBe(200)
    expect((await counter(vllm, "vllm:prefix_cache_queries_total")) - queries).toBe(9)
    const hits = await counter(vllm, "vllm:prefix_cache_hits_total")
    expect((await postJson(`${vllm.url}/v1/completions`, { prompt, max_tokens: 1 })).status).toBe(200)
    expect((await counter(vllm, "vllm:prefix_cache_queries_total")) - queries).toBe(18)
    expect((await counter(vllm, "vllm:prefix_cache_hits_total")) - hits).toBeGreaterThan(0)
  })
})

describe("echo's finish reason at exactly max_tokens (SA08)", () => {
  // The EOS would be token N+1 of an N-word echo, so max_tokens N ends it first (vllm/v1/core/sched/utils.py
  // check_stop: num_output_tokens >= max_tokens is LENGTH).
  it("N prompt words and max_tokens N finish with length; max_tokens N+1 with stop", async () => {
    const at = async (max: number) =>
      choicesOf((await postJson(`${vllm.url}/v1/completions`, { prompt: "a b c", max_tokens: max })).json)[0]
    expect(await at(3)).toMatchObject({ text: "a b c", finish_reason: "length" })
    expect(await at(4)).toMatchObject({ text: "a b c", finish_reason: "stop" })
  })
})

describe("SGLang's /v1/models root (SA09)", () => {
  // SGLang's ModelCard carries root=served_model_name (http_server.py available_models); vLLM's is the model path.
  it("is the served name, not the model path", async () => {
    const { json } = await getJson(`${sglang.url}/v1/models`)
    expect((json as { data: Array<{ id: string; root: string }> }).data[0]).toMatchObject({ id: "sg", root: "sg" })
  })
})

describe("the engines' environment defaults (SA10, SA12)", () => {
  it("SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE not an integer falls back to 2; at least 1", () => {
    const failures = (v: string) =>
      prefillLossOf({ SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE: v }).heartbeatMaxFailures
    expect(failures("abc")).toBe(2)
    expect(failures("1.5")).toBe(2)
    expect(failures("0")).toBe(1)
    expect(failures("4")).toBe(4)
  })

  it("SGLANG_HEALTH_CHECK_TIMEOUT defaults to 20 s and refuses what is not a number of seconds", () => {
    expect(sglangHealthOf({}).timeoutMs).toBe(20_000)
    expect(sglangHealthOf({ SGLANG_HEALTH_CHECK_TIMEOUT: "3" }).timeoutMs).toBe(3_000)
    expect(() => sglangHealthOf({ SGLANG_HEALTH_CHECK_TIMEOUT: "abc" })).toThrow(/SGLANG_HEALTH_CHECK_TIMEOUT/)
    expect(() => sglangHealthOf({ SGLANG_HEALTH_CHECK_TIMEOUT: "-1" })).toThrow(/SGLANG_HEALTH_CHECK_TIMEOUT/)
  })
})

describe("vLLM's max-model-len death (SA11)", () => {
  // vllm/v1/core/kv_cache_utils.py _check_enough_kv_cache_memory raises only when the estimate is below max_model_len.
  it("names an estimated maximum model length below the --max-model-len asked", () => {
    const p = spawnSync(
      process.execPath,
      [simEntry, "serve", "org/m", "--max-model-len", "8192", "--sim-crash-at-start", "max-model-len"],
      { encoding: "utf8", timeout: 20_000 }
    )
    expect(p.status).toBe(1)
    const m = /estimated maximum model length is (\d+)\./.exec(`${p.stdout}\n${p.stderr}`)
    expect(m).not.toBeNull()
    const estimate = Number(m?.[1])
    expect(estimate).toBeGreaterThan(0)
    expect(estimate).toBeLessThan(8192)
  })
})

describe("llama.cpp (SA05, SA06, SA07)", () => {
  // server-task.h add_child: each further completion of a prompt samples with the seed + its number.
  it("the n completions of a seeded request sample apart (seed + j)", async () => {
    const sim = await startSim({
      flavor: "llama_cpp",
      args: ["-m", simGguf("m.gguf"), "-np", "2", "--sim-mode", "random"]
    })
    try {
      const r = await postJson(`${sim.url}/v1/completions`, { prompt: "a", n: 2, seed: 42, max_tokens: 12 })
      expect(r.status).toBe(200)
      const texts = choicesOf(r.json).map((c) => c.text)
      expect(texts).toHaveLength(2)
      expect(texts[0]).not.toBe(texts[1])
    } finally {
      await sim.stop()
    }
  })

  // llama-server's per-request `sse_ping_interval` is in seconds (tools/server/server-schema.cpp; the flag's default
  // is 30 s, common/common.h). A 1 s interval: the first ping comes about 1 s after the stall, not 0.1 s.
  it("a request's sse_ping_interval is read in seconds", async () => {
    const sim = await startSim({
      flavor: "llama_cpp",
      args: ["-m", simGguf("m.gguf"), "--sim-stall-after-tokens", "1"]
    })
    const ac = new AbortController()
    try {
      const res = await fetch(`${sim.url}/v1/completions`, {
        method: "POST",
        body: JSON.stringify({ prompt: "a b c", stream: true, sse_ping_interval: 1 }),
        signal: ac.signal
      })
      const { text, firstDataAt } = await readUntilPing(res)
      const gap = performance.now() - (firstDataAt ?? Number.NaN)
      expect(sseData(text)).toHaveLength(1)
      // 1000 ms as configured; the client may see the first chunk late, so half of it is the bound.
      expect(gap).toBeGreaterThanOrEqual(500)
    } finally {
      ac.abort()
      await sim.stop()
    }
  })
})
