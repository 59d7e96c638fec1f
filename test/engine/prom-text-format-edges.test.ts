// The Prometheus text exposition format (https://prometheus.io/docs/instrumenting/exposition_formats/, "Text format
// details") at edges prom-text.test.ts does not reach, as services/engine/PromText.ts reads it: comments, tabs,
// a sample line without a value, a malformed line in the middle of a page, and a KV-cache usage of exactly 0.
import { describe, expect, it } from "vitest"
import type { MetricNames } from "../../src/services/engine/Engine.ts"
import { loadSignals, parsePromText } from "../../src/services/engine/PromText.ts"

const vllmNames: MetricNames = {
  running: ["vllm:num_requests_running"],
  waiting: ["vllm:num_requests_waiting"],
  kvUsage: ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"]
}

describe("parsePromText format edges", () => {
  it("a line whose first character is # is a comment, whatever follows it", () => {
    // the format: "Lines with a # as the first non-whitespace character are comments" (HELP and TYPE are two kinds)
    expect(parsePromText("# 42 requests served\n#x 1\nm 1\n")).toEqual([{ name: "m", labels: {}, value: 1 }])
  })

  it("value and timestamp may be separated by a tab as well as by spaces", () => {
    // the format: the tokens of a sample line are separated by blanks or tabs
    expect(parsePromText('m\t2\t1700000000000\nn{a="b"} 3\t1700000000000\n')).toEqual([
      { name: "m", labels: {}, value: 2 },
      { name: "n", labels: { a: "b" }, value: 3 }
    ])
  })

  it("a sample line without a value is malformed and skipped, not read as 0", () => {
    expect(parsePromText('m\nn{a="b"}\no 4\n')).toEqual([{ name: "o", labels: {}, value: 4 }])
  })

  it("a line with a malformed label set is skipped and the rest of the page still read", () => {
    // one odd series must not hide the load: vLLM's page lists the load gauges after hundreds of other series
    // a label value must be quoted ({a="x"}); an unterminated or unquoted one makes the whole line malformed
    const text = [
      'vllm:num_requests_waiting{engine="0} 9',
      'vllm:num_requests_running{engine=0"} 5',
      "vllm:num_requests_running 2",
      "vllm:num_requests_waiting 1"
    ]
    expect(loadSignals(text.join("\n"), vllmNames)).toEqual({ running: 2, waiting: 1, kvUsage: undefined })
  })
})

describe("loadSignals: zero is a value", () => {
  it("an idle engine's KV-cache usage of 0 is 0, not absent, and the older name does not stand in for it", () => {
    const text =
      'vllm:kv_cache_usage_perc{engine="0"} 0\nvllm:kv_cache_usage_perc{engine="1"} 0\nvllm:gpu_cache_usage_perc 0.9\n'
    expect(loadSignals(text, vllmNames).kvUsage).toBe(0)
  })
})
