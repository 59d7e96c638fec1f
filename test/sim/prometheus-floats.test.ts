// vLLM's and SGLang's /metrics values as prometheus_client writes them (prometheus/client_python
// prometheus_client/utils.py floatToGoString, applied by generate_latest to every sample value and `le` bound): the
// expected strings below are that function's output under CPython 3, run on each input. And the agent's own parser
// (src/services/engine/PromText.ts) reads the page so written.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { parsePromText, pickSum } from "../../src/services/engine/PromText.ts"
import { type Gauges, renderMetrics } from "../../src/sim/metrics.ts"
import { goFloat } from "../../src/sim/pyWords.ts"
import { Stats } from "../../src/sim/stats.ts"
import { type SimHandle, startSim } from "../support/sim.ts"

describe("goFloat: floatToGoString (pure)", () => {
  it.each([
    [0, "0.0"],
    [1, "1.0"],
    [0.25, "0.25"],
    [999_999, "999999.0"],
    [1e6, "1e+06"],
    [1_234_567, "1.234567e+06"],
    [1_000_001, "1.000001e+06"],
    [2.5e6, "2.5e+06"],
    [1e10, "1e+010"],
    [123_456_789.5, "1.234567895e+08"],
    [1e15, "1e+015"],
    [1e16, "1e+16"],
    [1.5e17, "1.5e+17"],
    [1e-7, "1e-07"],
    [0.1 + 0.2, "0.30000000000000004"],
    [-1e6, "-1000000.0"],
    [-2.5, "-2.5"],
    [Number.POSITIVE_INFINITY, "+Inf"],
    [Number.NEGATIVE_INFINITY, "-Inf"],
    [Number.NaN, "NaN"],
    [3e21, "3e+21"]
  ])("%s is written %s", (x, text) => {
    expect(goFloat(x)).toBe(text)
  })
})

const gauges = (maxTotalTokens: number): Gauges => ({
  running: 0,
  waiting: 0,
  kvUsage: 0,
  usedTokens: 0,
  maxTotalTokens,
  maxSeqs: 256
})

describe("the vLLM and SGLang pages write floats as prometheus_client does (pure)", () => {
  it("SGLang: a pool of a million tokens is 1e+06, a count below it 4096.0", () => {
    const page = renderMetrics("sglang", { model: "m", disaggregationMode: undefined }, [
      { stats: new Stats(), gauges: gauges(1_000_000) }
    ])
    expect(page).toContain(
      'sglang:max_total_num_tokens{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 1e+06\n'
    )
    const small = renderMetrics("sglang", { model: "m", disaggregationMode: undefined }, [
      { stats: new Stats(), gauges: gauges(4096) }
    ])
    expect(small).toContain('tp_rank="0"} 4096.0\n')
  })

  it("vLLM: a counter past a million tokens in Go's exponent, a histogram's sum its float repr", () => {
    const stats = new Stats()
    stats.promptTokens = 1_234_567
    stats.e2e.observe(2_000_000.5)
    const page = renderMetrics("vllm", { model: "m", disaggregationMode: undefined }, [{ stats, gauges: gauges(16) }])
    expect(page).toContain('vllm:prompt_tokens_total{engine="0",model_name="m"} 1.234567e+06\n')
    expect(page).toContain('vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 2.0000005e+06\n')
    expect(page).toContain('vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 1.0\n')
  })
})

describe("a simulated SGLang's page, read by the agent's parser", () => {
  let sim: SimHandle
  beforeAll(async () => {
    // 62500 blocks of 16 tokens: a pool of 1e6 tokens
    sim = await startSim({
      flavor: "sglang",
      args: ["--model-path", "org/sg", "--enable-metrics", "--sim-kv-blocks", "62500", "--sim-block-size", "16"]
    })
  })
  afterAll(async () => {
    await sim?.stop()
  })

  it("max_total_num_tokens is written 1e+06 and parsed as a million", async () => {
    const text = await (await fetch(`${sim.url}/metrics`)).text()
    expect(text).toMatch(/^sglang:max_total_num_tokens\{[^}]*\} 1e\+06$/m)
    expect(pickSum(parsePromText(text), ["sglang:max_total_num_tokens"])).toBe(1_000_000)
  })
})
