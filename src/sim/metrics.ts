// Prometheus text of each flavor's /metrics (pure): the real metric names, HELP/TYPE lines and label sets
// (vLLM {engine,model_name} per DP rank, SGLang {model_name}, llama.cpp unlabelled). mlx has no /metrics.
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

type Labels = Readonly<Record<string, string>>

/** A label set as prometheus_client writes it: sorted by name (prometheus/client_python exposition.py, generate_latest). */
const labelText = (labels: Labels): string => {
  const keys = Object.keys(labels).sort()
  return keys.length === 0 ? "" : `{${keys.map((k) => `${k}="${esc(labels[k] ?? "")}"`).join(",")}}`
}

/** One registry page: each family's HELP and TYPE once, then its samples, one label set (child) after another. */
class Text {
  readonly lines: Array<string> = []
  private head(name: string, help: string, type: string): void {
    this.lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`)
  }
  gauge(name: string, help: string, children: ReadonlyArray<readonly [Labels, number]>): void {
    this.head(name, help, "gauge")
    for (const [l, v] of children) this.lines.push(`${name}${labelText(l)} ${fmt(v)}`)
  }
  counter(name: string, help: string, children: ReadonlyArray<readonly [Labels, number]>): void {
    this.head(name, help, "counter")
    for (const [l, v] of children) this.lines.push(`${name}${labelText(l)} ${fmt(v)}`)
  }
  histogram(name: string, help: string, children: ReadonlyArray<readonly [Labels, Histogram]>): void {
    this.head(name, help, "histogram")
    for (const [l, h] of children) {
      let acc = 0
      h.buckets.forEach((b, i) => {
        acc += h.counts[i] ?? 0
        this.lines.push(`${name}_bucket${labelText({ ...l, le: fmt(b) })} ${fmt(acc)}`)
      })
      this.lines.push(`${name}_bucket${labelText({ ...l, le: "+Inf" })} ${fmt(h.count)}`)
      this.lines.push(`${name}_count${labelText(l)} ${fmt(h.count)}`, `${name}_sum${labelText(l)} ${fmt(h.sum)}`)
    }
  }
}

/** One engine core's (DP rank's) counters and gauges. */
export interface RankMetrics {
  readonly stats: Stats
  readonly gauges: Gauges
}

/**
 * vLLM's finish reasons: request_success_total has a child per reason and engine from the start, zeros included
 * (vllm-project/vllm vllm/v1/metrics/loggers.py, PrometheusStatLogger: `for reason in FinishReason`).
 */
const VLLM_FINISH_REASONS = ["stop", "length", "abort"]

/** vLLM's gauges and counters with one value per rank: kind, name, HELP text, the rank's value. */
const VLLM_SERIES: ReadonlyArray<readonly ["gauge" | "counter", string, string, (r: RankMetrics) => number]> = [
  ["gauge", "vllm:num_requests_running", "Number of requests in model execution batches.", (r) => r.gauges.running],
  ["gauge", "vllm:num_requests_waiting", "Number of requests waiting to be processed.", (r) => r.gauges.waiting],
  ["gauge", "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", (r) => r.gauges.kvUsage],
  [
    "counter",
    "vllm:num_preemptions_total",
    "Cumulative number of preemption from the engine.",
    (r) => r.stats.preemptions
  ],
  [
    "counter",
    "vllm:prefix_cache_queries_total",
    "Prefix cache queries, in terms of number of queried tokens.",
    (r) => r.stats.prefixQueries
  ],
  [
    "counter",
    "vllm:prefix_cache_hits_total",
    "Prefix cache hits, in terms of number of cached tokens.",
    (r) => r.stats.prefixHits
  ],
  ["counter", "vllm:prompt_tokens_total", "Number of prefill tokens processed.", (r) => r.stats.promptTokens],
  ["counter", "vllm:generation_tokens_total", "Number of generation tokens processed.", (r) => r.stats.generationTokens]
]

/**
 * vLLM's page: one child per engine core (DP rank) of every family, labelled `model_name` and `engine` (the
 * rank's index), as PrometheusStatLogger registers them (vllm-project/vllm vllm/v1/metrics/loggers.py:
 * `labelnames = ["model_name", "engine"]`, a child per engine index through make_per_engine /
 * create_metric_per_engine). A scraper sums the counts over `engine`.
 */
const vllm = (model: string, ranks: ReadonlyArray<RankMetrics>): string => {
  const t = new Text()
  const labels = (i: number): Labels => ({ model_name: model, engine: String(i) })
  const each = (f: (r: RankMetrics) => number) => ranks.map((r, i) => [labels(i), f(r)] as const)
  const hist = (f: (s: Stats) => Histogram) => ranks.map((r, i) => [labels(i), f(r.stats)] as const)
  for (const [kind, name, help, value] of VLLM_SERIES) t[kind](name, help, each(value))
  const reasons = [...VLLM_FINISH_REASONS]
  for (const r of ranks) for (const k of r.stats.success.keys()) if (!reasons.includes(k)) reasons.push(k)
  t.counter(
    "vllm:request_success_total",
    "Count of successfully processed requests.",
    reasons.flatMap((reason) =>
      ranks.map((r, i) => [{ ...labels(i), finished_reason: reason }, r.stats.success.get(reason) ?? 0] as const)
    )
  )
  t.histogram(
    "vllm:time_to_first_token_seconds",
    "Histogram of time to first token in seconds.",
    hist((s) => s.ttft)
  )
  t.histogram(
    "vllm:inter_token_latency_seconds",
    "Histogram of inter-token latency in seconds.",
    hist((s) => s.itl)
  )
  t.histogram(
    "vllm:e2e_request_latency_seconds",
    "Histogram of e2e request latency in seconds.",
    hist((s) => s.e2e)
  )
  return `${t.lines.join("\n")}\n`
}

const sglang = (model: string, r: RankMetrics): string => {
  const { stats: s, gauges: g } = r
  const t = new Text()
  const l: Labels = { model_name: model }
  const one = (v: number) => [[l, v] as const]
  t.gauge("sglang:num_running_reqs", "The number of running requests.", one(g.running))
  t.gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", one(g.waiting))
  t.gauge("sglang:num_used_tokens", "The number of used tokens.", one(g.usedTokens))
  t.gauge("sglang:token_usage", "The token usage.", one(g.kvUsage))
  t.gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", one(g.maxTotalTokens))
  t.gauge("sglang:gen_throughput", "The generation throughput (token/s).", one(0))
  t.gauge(
    "sglang:cache_hit_rate",
    "The prefix cache hit rate.",
    one(s.prefixQueries === 0 ? 0 : s.prefixHits / s.prefixQueries)
  )
  t.gauge("sglang:num_grammar_queue_reqs", "The number of requests in the grammar waiting queue.", one(0))
  t.counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.", one(s.promptTokens))
  t.counter("sglang:generation_tokens_total", "Number of generation tokens processed.", one(s.generationTokens))
  t.counter("sglang:cached_tokens_total", "Number of cached prompt tokens.", one(s.prefixHits))
  t.counter("sglang:num_requests_total", "Number of requests processed.", one(s.served))
  t.histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", [[l, s.ttft]])
  t.histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", [[l, s.itl]])
  t.histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", [[l, s.e2e]])
  return `${t.lines.join("\n")}\n`
}

const llama = (r: RankMetrics): string => {
  const { stats: s, gauges: g } = r
  const t = new Text()
  const one = (v: number) => [[{}, v] as const]
  t.counter("llamacpp:prompt_tokens_total", "Number of prompt tokens processed.", one(s.promptTokens))
  t.counter("llamacpp:prompt_tokens_cached_total", "Number of prompt tokens reused from the cache", one(0))
  t.counter("llamacpp:prompt_seconds_total", "Prompt process time", one(0))
  t.counter("llamacpp:tokens_predicted_total", "Number of generation tokens processed.", one(s.generationTokens))
  t.counter("llamacpp:tokens_predicted_seconds_total", "Predict process time", one(0))
  t.counter("llamacpp:n_decode_total", "Total number of llama_decode() calls", one(s.generationTokens))
  t.counter("llamacpp:n_tokens_max", "Largest observed n_tokens.", one(g.usedTokens))
  // tools/server/server-task.cpp exports the speculative-decoding counters even with no draft model.
  t.counter("llamacpp:spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated", one(0))
  t.counter("llamacpp:spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted", one(0))
  t.counter(
    "llamacpp:spec_decode_num_drafts_total",
    "Speculative: Total speculative decoding verification steps",
    one(0)
  )
  t.gauge("llamacpp:prompt_tokens_seconds", "Average prompt throughput in tokens/s.", one(0))
  t.gauge("llamacpp:predicted_tokens_seconds", "Average generation throughput in tokens/s.", one(0))
  t.gauge("llamacpp:requests_processing", "Number of requests processing.", one(g.running))
  t.gauge("llamacpp:requests_deferred", "Number of requests deferred.", one(g.waiting))
  t.gauge("llamacpp:n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call", one(g.running))
  return `${t.lines.join("\n")}\n`
}

/**
 * The /metrics body of a flavor from its engine cores' figures, or undefined where the engine has none (mlx).
 * Only vLLM runs more than one core (DP ranks); the others get one.
 */
export const renderMetrics = (flavor: Flavor, model: string, ranks: ReadonlyArray<RankMetrics>): string | undefined => {
  const first = ranks[0]
  if (first === undefined) return undefined
  switch (flavor) {
    case "vllm":
      return vllm(model, ranks)
    case "sglang":
      return sglang(model, first)
    case "llama_cpp":
      return llama(first)
    case "mlx":
      return undefined
  }
}
