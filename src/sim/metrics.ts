// Prometheus text of each flavor's /metrics (pure): the real metric names, HELP/TYPE lines and label sets
// (vLLM {engine="0",model_name}, SGLang {model_name}, llama.cpp unlabelled). mlx has no /metrics.
import type { Flavor } from "./simConfig.ts"
import type { Histogram, Stats } from "./stats.ts"

export interface Gauges {
  readonly running: number
  readonly waiting: number
  /** KV usage fraction 0..1. */
  readonly kvUsage: number
  readonly usedTokens: number
  readonly maxTotalTokens: number
  readonly maxSeqs: number
}

const fmt = (n: number): string => (Number.isInteger(n) ? `${n}.0` : String(n))

const esc = (s: string): string => s.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n")

class Text {
  readonly lines: Array<string> = []
  private readonly labels: string
  constructor(labels: string) {
    this.labels = labels
  }
  private l(extra?: string): string {
    const parts = [this.labels, extra].filter((x) => x !== undefined && x !== "")
    return parts.length === 0 ? "" : `{${parts.join(",")}}`
  }
  gauge(name: string, help: string, v: number): void {
    this.lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} gauge`, `${name}${this.l()} ${fmt(v)}`)
  }
  counter(name: string, help: string, v: number): void {
    this.lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} counter`, `${name}${this.l()} ${fmt(v)}`)
  }
  labelledCounter(name: string, help: string, label: string, values: ReadonlyMap<string, number>): void {
    this.lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} counter`)
    for (const [k, v] of values) this.lines.push(`${name}${this.l(`${label}="${esc(k)}"`)} ${fmt(v)}`)
  }
  histogram(name: string, help: string, h: Histogram): void {
    this.lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} histogram`)
    let acc = 0
    h.buckets.forEach((b, i) => {
      acc += h.counts[i] ?? 0
      this.lines.push(`${name}_bucket${this.l(`le="${fmt(b)}"`)} ${fmt(acc)}`)
    })
    this.lines.push(`${name}_bucket${this.l('le="+Inf"')} ${fmt(h.count)}`)
    this.lines.push(`${name}_count${this.l()} ${fmt(h.count)}`, `${name}_sum${this.l()} ${fmt(h.sum)}`)
  }
}

const vllm = (model: string, s: Stats, g: Gauges): string => {
  const t = new Text(`engine="0",model_name="${esc(model)}"`)
  t.gauge("vllm:num_requests_running", "Number of requests in model execution batches.", g.running)
  t.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", g.waiting)
  t.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", g.kvUsage)
  t.counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", s.preemptions)
  t.counter(
    "vllm:prefix_cache_queries_total",
    "Prefix cache queries, in terms of number of queried tokens.",
    s.prefixQueries
  )
  t.counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", s.prefixHits)
  t.counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", s.promptTokens)
  t.counter("vllm:generation_tokens_total", "Number of generation tokens processed.", s.generationTokens)
  t.labelledCounter(
    "vllm:request_success_total",
    "Count of successfully processed requests.",
    "finished_reason",
    s.success
  )
  t.histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", s.ttft)
  t.histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", s.itl)
  t.histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", s.e2e)
  return `${t.lines.join("\n")}\n`
}

const sglang = (model: string, s: Stats, g: Gauges): string => {
  const t = new Text(`model_name="${esc(model)}"`)
  t.gauge("sglang:num_running_reqs", "The number of running requests.", g.running)
  t.gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", g.waiting)
  t.gauge("sglang:num_used_tokens", "The number of used tokens.", g.usedTokens)
  t.gauge("sglang:token_usage", "The token usage.", g.kvUsage)
  t.gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", g.maxTotalTokens)
  t.gauge("sglang:gen_throughput", "The generation throughput (token/s).", 0)
  t.gauge(
    "sglang:cache_hit_rate",
    "The prefix cache hit rate.",
    s.prefixQueries === 0 ? 0 : s.prefixHits / s.prefixQueries
  )
  t.gauge("sglang:num_grammar_queue_reqs", "The number of requests in the grammar waiting queue.", 0)
  t.counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.", s.promptTokens)
  t.counter("sglang:generation_tokens_total", "Number of generation tokens processed.", s.generationTokens)
  t.counter("sglang:cached_tokens_total", "Number of cached prompt tokens.", s.prefixHits)
  t.counter("sglang:num_requests_total", "Number of requests processed.", s.served)
  t.histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", s.ttft)
  t.histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", s.itl)
  t.histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", s.e2e)
  return `${t.lines.join("\n")}\n`
}

const llama = (s: Stats, g: Gauges): string => {
  const t = new Text("")
  t.counter("llamacpp:prompt_tokens_total", "Number of prompt tokens processed.", s.promptTokens)
  t.counter("llamacpp:prompt_tokens_cached_total", "Number of prompt tokens reused from the cache", 0)
  t.counter("llamacpp:prompt_seconds_total", "Prompt process time", 0)
  t.counter("llamacpp:tokens_predicted_total", "Number of generation tokens processed.", s.generationTokens)
  t.counter("llamacpp:tokens_predicted_seconds_total", "Predict process time", 0)
  t.counter("llamacpp:n_decode_total", "Total number of llama_decode() calls", s.generationTokens)
  t.counter("llamacpp:n_tokens_max", "Largest observed n_tokens.", g.usedTokens)
  // tools/server/server-task.cpp exports the speculative-decoding counters even with no draft model.
  t.counter("llamacpp:spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated", 0)
  t.counter("llamacpp:spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted", 0)
  t.counter("llamacpp:spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps", 0)
  t.gauge("llamacpp:prompt_tokens_seconds", "Average prompt throughput in tokens/s.", 0)
  t.gauge("llamacpp:predicted_tokens_seconds", "Average generation throughput in tokens/s.", 0)
  t.gauge("llamacpp:requests_processing", "Number of requests processing.", g.running)
  t.gauge("llamacpp:requests_deferred", "Number of requests deferred.", g.waiting)
  t.gauge("llamacpp:n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call", g.running)
  return `${t.lines.join("\n")}\n`
}

/** The /metrics body of a flavor, or undefined where the engine has none (mlx). */
export const renderMetrics = (flavor: Flavor, model: string, s: Stats, g: Gauges): string | undefined => {
  switch (flavor) {
    case "vllm":
      return vllm(model, s, g)
    case "sglang":
      return sglang(model, s, g)
    case "llama_cpp":
      return llama(s, g)
    case "mlx":
      return undefined
  }
}
