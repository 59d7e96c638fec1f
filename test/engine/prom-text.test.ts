// Prometheus text parsing and load-signal extraction: per-engine pages, old vLLM names, label sums, oddities.
import { Result } from "effect"
import { describe, expect, it } from "vitest"
import { decodeConfigObject } from "../../src/layers/config/Config.ts"
import { engineFor } from "../../src/layers/engine/backends/index.ts"
import type { MetricNames } from "../../src/services/engine/Engine.ts"
import { loadSignals, parsePromText, pickSum } from "../../src/services/engine/PromText.ts"

const vllmNames: MetricNames = {
  running: ["vllm:num_requests_running"],
  waiting: ["vllm:num_requests_waiting"],
  kvUsage: ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"]
}

describe("parsePromText", () => {
  it("samples with labels, escapes, timestamps and special values", () => {
    const text = [
      "# HELP a_total A counter.",
      "# TYPE a_total counter",
      'a_total{model_name="m",path="C:\\\\x \\"q\\" \\n"} 3 1700000000000',
      "b 1.5e3",
      "c +Inf",
      "c2 Inf",
      "d NaN",
      'e{x="1",} -2',
      "f\t7",
      "",
      "garbage line without value",
      "# EOF"
    ].join("\n")
    expect(parsePromText(text)).toEqual([
      { name: "a_total", labels: { model_name: "m", path: 'C:\\x "q" \n' }, value: 3 },
      { name: "b", labels: {}, value: 1500 },
      { name: "c", labels: {}, value: Number.POSITIVE_INFINITY },
      { name: "c2", labels: {}, value: Number.POSITIVE_INFINITY },
      { name: "d", labels: {}, value: Number.NaN },
      { name: "e", labels: { x: "1" }, value: -2 },
      { name: "f", labels: {}, value: 7 }
    ])
  })
  it("the filter keeps only wanted names", () => {
    expect(parsePromText("a 1\nb 2\nc 3\n", new Set(["b"]))).toEqual([{ name: "b", labels: {}, value: 2 }])
  })
  it("CRLF pages parse", () => {
    expect(pickSum(parsePromText("a 1\r\na 2\r\n"), ["a"])).toBe(3)
  })
  it("a NaN sample counts for nothing: the others' sum, and a name with only NaN is absent", () => {
    expect(pickSum(parsePromText('a{engine="0"} NaN\na{engine="1"} 2\n'), ["a"])).toBe(2)
    expect(pickSum(parsePromText("a NaN\nb 1\n"), ["a", "b"])).toBe(1)
  })
})

describe("loadSignals", () => {
  it("vLLM current names, summed over engines, KV usage averaged", () => {
    const text = [
      "# TYPE vllm:num_requests_running gauge",
      'vllm:num_requests_running{engine="0",model_name="m"} 3.0',
      'vllm:num_requests_running{engine="1",model_name="m"} 2.0',
      'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0',
      'vllm:num_requests_waiting{engine="1",model_name="m"} 0.0',
      'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5',
      'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25',
      'vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="m"} 0.0'
    ].join("\n")
    expect(loadSignals(text, vllmNames)).toEqual({ running: 5, waiting: 1, kvUsage: 0.375 })
  })
  it("old vLLM: gpu_cache_usage_perc when kv_cache_usage_perc is absent", () => {
    const text = 'vllm:num_requests_running{model_name="m"} 1\nvllm:gpu_cache_usage_perc{model_name="m"} 0.8\n'
    expect(loadSignals(text, vllmNames)).toEqual({ running: 1, waiting: undefined, kvUsage: 0.8 })
  })
  it("the newest name wins when both are present", () => {
    const text = "vllm:kv_cache_usage_perc 0.1\nvllm:gpu_cache_usage_perc 0.9\n"
    expect(loadSignals(text, vllmNames).kvUsage).toBe(0.1)
  })
  it("SGLang", () => {
    const names: MetricNames = {
      running: ["sglang:num_running_reqs"],
      waiting: ["sglang:num_queue_reqs"],
      kvUsage: ["sglang:token_usage"]
    }
    const text =
      'sglang:num_running_reqs{model_name="m"} 4\nsglang:num_queue_reqs{model_name="m"} 2\nsglang:token_usage{model_name="m"} 0.3\n'
    expect(loadSignals(text, names)).toEqual({ running: 4, waiting: 2, kvUsage: 0.3 })
  })
  it("llama.cpp: no KV series", () => {
    const names: MetricNames = {
      running: ["llamacpp:requests_processing"],
      waiting: ["llamacpp:requests_deferred"],
      kvUsage: []
    }
    const text = "# HELP llamacpp:requests_processing x\nllamacpp:requests_processing 2\nllamacpp:requests_deferred 0\n"
    expect(loadSignals(text, names)).toEqual({ running: 2, waiting: 0, kvUsage: undefined })
  })
  it("progress counters: each one present, summed over its label sets; absent ones left out", () => {
    const names: MetricNames = {
      ...vllmNames,
      progress: ["vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:not_there_total"]
    }
    const text = [
      'vllm:num_requests_running{engine="0",model_name="m"} 1.0',
      'vllm:prompt_tokens_total{engine="0",model_name="m"} 120.0',
      'vllm:prompt_tokens_total{engine="1",model_name="m"} 30.0',
      'vllm:generation_tokens_total{engine="0",model_name="m"} 0.0'
    ].join("\n")
    expect(loadSignals(text, names).progress).toEqual({
      "vllm:prompt_tokens_total": 150,
      "vllm:generation_tokens_total": 0
    })
    expect(loadSignals("", names).progress).toEqual({})
    // SGLang's realtime counter: every mode's child counts
    const sglang =
      'sglang:realtime_tokens_total{mode="prefill_compute"} 7\nsglang:realtime_tokens_total{mode="decode"} 5\n'
    expect(
      loadSignals(sglang, { running: [], waiting: [], kvUsage: [], progress: ["sglang:realtime_tokens_total"] })
        .progress
    ).toEqual({ "sglang:realtime_tokens_total": 12 })
  })
  it("per rank (vLLM's engine label): one figure of its counters and KV usage, which moves when any of them does", () => {
    const names: MetricNames = { ...vllmNames, progress: ["vllm:generation_tokens_total"], rankLabel: "engine" }
    const page = (gen0: number, kv1: number) =>
      [
        `vllm:generation_tokens_total{engine="0",model_name="m"} ${gen0}`,
        'vllm:generation_tokens_total{engine="1",model_name="m"} 30',
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5',
        `vllm:kv_cache_usage_perc{engine="1",model_name="m"} ${kv1}`,
        'vllm:num_requests_running{engine="1",model_name="m"} 3'
      ].join("\n")
    expect(loadSignals(page(100, 0.25), names).rankProgress).toEqual({ "0": 100.5, "1": 30.25 })
    expect(loadSignals(page(101, 0.25), names).rankProgress?.["0"]).not.toBe(100.5)
    expect(loadSignals(page(100, 0.3), names).rankProgress?.["1"]).not.toBe(30.25)
    // a NaN sample counts for nothing (NaN never equals itself: the figure would move at every scrape)
    expect(loadSignals(page(100, Number.NaN), names).rankProgress).toEqual({ "0": 100.5, "1": 30 })
    // no rank label named: no per-rank figure
    const { rankLabel: _, ...unlabelled } = names
    expect(loadSignals(page(100, 0.25), unlabelled).rankProgress).toBeUndefined()
  })

  it("per rank on SGLang's page (its dp_rank label, with --dp-size > 1): each replica's own figure", () => {
    // the names the SGLang backend reads; the page as SGLang's schedulers label it (python/sglang/srt/observability/
    // scheduler_metrics_mixin.py init_metrics), the tokenizer manager's counters server-wide, without dp_rank
    const c = decodeConfigObject(
      { engine: { kind: "sglang" }, models: { m: { hf_repo: "org/m", dp: 2 } } },
      undefined,
      {}
    )
    if (Result.isFailure(c)) throw new Error(c.failure.message)
    const names = engineFor("sglang").render(c.success).metrics?.names as MetricNames
    const labels = (r: number) =>
      `model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="${r}"`
    const page = (decode1: number) =>
      [
        `sglang:realtime_tokens_total{${labels(0)},mode="prefill_compute"} 70`,
        `sglang:realtime_tokens_total{${labels(0)},mode="decode"} 30`,
        `sglang:realtime_tokens_total{${labels(1)},mode="decode"} ${decode1}`,
        `sglang:token_usage{${labels(0)}} 0.5`,
        `sglang:token_usage{${labels(1)}} 0.25`,
        `sglang:num_queue_reqs{${labels(1)}} 9`,
        'sglang:prompt_tokens_total{model_name="m",engine_type="unified"} 1000'
      ].join("\n")
    const signals = loadSignals(page(40), names)
    expect(signals.rankProgress).toEqual({ "0": 100.5, "1": 40.25 })
    expect(signals.progress).toEqual({ "sglang:realtime_tokens_total": 140 })
    expect(signals.kvUsage).toBe(0.375)
    // replica 1 at work (its queue holding a test): its own figure moves, replica 0's does not
    const next = loadSignals(page(41), names).rankProgress
    expect(next?.["1"]).not.toBe(40.25)
    expect(next?.["0"]).toBe(100.5)
    // without --dp-size SGLang adds no dp_rank: no rank to read
    expect(loadSignals(page(40).replaceAll(/,dp_rank="\d"/g, ""), names).rankProgress).toEqual({})
  })

  it("an empty page gives undefined everywhere", () => {
    expect(loadSignals("", vllmNames)).toEqual({ running: undefined, waiting: undefined, kvUsage: undefined })
  })
})
