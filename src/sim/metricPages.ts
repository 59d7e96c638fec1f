// The /metrics page of each flavor as data (pure): which families it has, under which names, HELP texts and
// labels, and whether a family has a child per engine core or one for the whole server. metrics.ts renders
// them. Names, texts and labels are the engines' own (sources on each page).

import type { Flavor } from "./simConfig.ts"
import type { Histogram, Stats } from "./stats.ts"

export type Labels = Readonly<Record<string, string>>
export type Child = readonly [Labels, number]

export interface Gauges {
  readonly running: number
  readonly waiting: number
  /** KV usage fraction 0..1. */
  readonly kvUsage: number
  readonly usedTokens: number
  readonly maxTotalTokens: number
  readonly maxSeqs: number
}

/** One engine core's (DP rank's) counters and gauges. */
export interface RankMetrics {
  readonly stats: Stats
  readonly gauges: Gauges
}

/** What the page's labels say of the server. */
export interface PageContext {
  /** The served name (`model_name`). */
  readonly model: string
  /** SGLang's `engine_type`: the disaggregation mode, "unified" without one. */
  readonly disaggregationMode: "prefill" | "decode" | undefined
}

/** "rank": a child per engine core; "server": one child for the server, counted over the cores. */
export type Scope = "rank" | "server"

export type Family =
  | {
      readonly kind: "gauge" | "counter"
      readonly name: string
      readonly help: string
      readonly scope: Scope
      /** A core's children as labels of their own and value (`all`: every core, for keys they share). */
      readonly children: (r: RankMetrics, all: ReadonlyArray<RankMetrics>) => ReadonlyArray<Child>
    }
  | {
      readonly kind: "histogram"
      readonly name: string
      readonly help: string
      readonly scope: Scope
      readonly hist: (s: Stats) => Histogram
    }

export interface Page {
  /** How a sample's value is written; unset: as prometheus_client writes a float (`1.0`). */
  readonly value?: (n: number) => string
  /** The labels of core `i` of `n`. */
  readonly rankLabels: (c: PageContext, i: number, n: number) => Labels
  /** The labels of the server-wide children. */
  readonly serverLabels: (c: PageContext) => Labels
  readonly families: ReadonlyArray<Family>
}

/**
 * A double as a C++ ostream writes it by default (six significant digits, %g: `0`, `1`, `0.5`, `1.23457e+06`):
 * llama-server writes its samples so (tools/server handle_metrics: `name << " " << value`, a double).
 */
export const cppDouble = (n: number): string => {
  if (Number.isNaN(n)) return "nan"
  if (!Number.isFinite(n)) return n > 0 ? "inf" : "-inf"
  if (n === 0) return "0"
  const [mantissa = "", e = "0"] = n.toExponential(5).split("e")
  const exp = Number(e)
  const trim = (t: string) => (t.includes(".") ? t.replace(/0+$/, "").replace(/\.$/, "") : t)
  if (exp < -4 || exp >= 6) return `${trim(mantissa)}e${exp < 0 ? "-" : "+"}${String(Math.abs(exp)).padStart(2, "0")}`
  return trim(n.toFixed(5 - exp))
}

const one =
  (f: (r: RankMetrics) => number) =>
  (r: RankMetrics): ReadonlyArray<Child> => [[{}, f(r)]]

/** A family with one child per core (or one server-wide child) holding `f`'s value. */
const value =
  (kind: "gauge" | "counter", scope: Scope) =>
  (name: string, help: string, f: (r: RankMetrics) => number): Family => ({
    kind,
    name,
    help,
    scope,
    children: one(f)
  })
const gauge = value("gauge", "rank")
const counter = value("counter", "rank")
const serverCounter = value("counter", "server")

const hist = (scope: Scope, name: string, help: string, h: (s: Stats) => Histogram) =>
  ({ kind: "histogram", name, help, scope, hist: h }) as const

/**
 * vLLM's finish reasons: request_success_total has a child per reason and engine from the start, zeros included
 * (vllm-project/vllm vllm/v1/metrics/loggers.py, PrometheusStatLogger: `for reason in FinishReason`).
 */
const VLLM_FINISH_REASONS = ["stop", "length", "abort"]

/**
 * vLLM: every family has a child per engine core (DP rank), labelled `model_name` and `engine` (the core's
 * index), as PrometheusStatLogger registers them (vllm-project/vllm vllm/v1/metrics/loggers.py: `labelnames =
 * ["model_name", "engine"]`, a child per engine index through make_per_engine / create_metric_per_engine).
 */
const VLLM: Page = {
  rankLabels: (c, i) => ({ model_name: c.model, engine: String(i) }),
  serverLabels: (c) => ({ model_name: c.model }),
  families: [
    gauge("vllm:num_requests_running", "Number of requests in model execution batches.", (r) => r.gauges.running),
    gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", (r) => r.gauges.waiting),
    gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", (r) => r.gauges.kvUsage),
    counter(
      "vllm:num_preemptions_total",
      "Cumulative number of preemption from the engine.",
      (r) => r.stats.preemptions
    ),
    counter(
      "vllm:prefix_cache_queries_total",
      "Prefix cache queries, in terms of number of queried tokens.",
      (r) => r.stats.prefixQueries
    ),
    counter(
      "vllm:prefix_cache_hits_total",
      "Prefix cache hits, in terms of number of cached tokens.",
      (r) => r.stats.prefixHits
    ),
    counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", (r) => r.stats.promptTokens),
    counter("vllm:generation_tokens_total", "Number of generation tokens processed.", (r) => r.stats.generationTokens),
    {
      kind: "counter",
      name: "vllm:request_success_total",
      help: "Count of successfully processed requests.",
      scope: "rank",
      children: (r, all) => {
        const reasons = [...VLLM_FINISH_REASONS]
        for (const o of all) for (const k of o.stats.success.keys()) if (!reasons.includes(k)) reasons.push(k)
        return reasons.map((reason) => [{ finished_reason: reason }, r.stats.success.get(reason) ?? 0] as const)
      }
    },
    hist("rank", "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", (s) => s.ttft),
    hist("rank", "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", (s) => s.itl),
    hist("rank", "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", (s) => s.e2e)
  ]
}

/** SGLang's server-wide labels: the model name and `engine_type` (prefill, decode, or unified without P/D). */
const sglangLabels = (c: PageContext): Labels => ({
  model_name: c.model,
  engine_type: c.disaggregationMode ?? "unified"
})

/**
 * SGLang: two collectors. Each scheduler's (SchedulerMetricsCollector) are labelled `model_name`,
 * `engine_type`, `tp_rank`, `pp_rank`, `moe_ep_rank`, and `dp_rank` when the scheduler belongs to a DP
 * replica (launched by the DataParallelController; without --dp-size dp_rank is None and the label absent);
 * only the schedulers with attn_tp_rank 0 report, one per replica (tp_rank 0) unless
 * --enable-metrics-for-all-schedulers (sgl-project/sglang python/sglang/srt/observability/
 * scheduler_metrics_mixin.py, init_metrics; metrics_collector.py). The tokenizer manager's
 * (TokenizerMetricsCollector: token counters, request counts, latency histograms) see every request and are
 * labelled `model_name` and `engine_type` alone (python/sglang/srt/managers/tokenizer_manager.py).
 * realtime_tokens_total gets a child per mode only once that mode counted tokens (`if delta == 0: continue`).
 */
const SGLANG: Page = {
  rankLabels: (c, i, n) => ({
    ...sglangLabels(c),
    tp_rank: "0",
    pp_rank: "0",
    moe_ep_rank: "0",
    ...(n > 1 ? { dp_rank: String(i) } : {})
  }),
  serverLabels: sglangLabels,
  families: [
    gauge("sglang:num_running_reqs", "The number of running requests.", (r) => r.gauges.running),
    gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", (r) => r.gauges.waiting),
    gauge("sglang:num_used_tokens", "The number of used tokens.", (r) => r.gauges.usedTokens),
    gauge("sglang:token_usage", "The token usage.", (r) => r.gauges.kvUsage),
    gauge(
      "sglang:max_total_num_tokens",
      "Maximum total number of tokens in the KV cache pool.",
      (r) => r.gauges.maxTotalTokens
    ),
    gauge("sglang:gen_throughput", "The generation throughput (token/s).", () => 0),
    gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", ({ stats: s }) =>
      s.prefixQueries === 0 ? 0 : s.prefixHits / s.prefixQueries
    ),
    gauge("sglang:num_grammar_queue_reqs", "The number of requests in the grammar waiting queue.", () => 0),
    {
      kind: "counter",
      name: "sglang:realtime_tokens_total",
      help: "Total number of tokens processed (updated on each log interval). mode: prefill_compute, prefill_cache, decode.",
      scope: "rank",
      children: ({ stats: s }) =>
        (
          [
            [{ mode: "prefill_compute" }, s.promptTokens - s.prefilledHits],
            [{ mode: "prefill_cache" }, s.prefilledHits],
            [{ mode: "decode" }, s.generationTokens]
          ] as const
        ).filter(([, v]) => v > 0)
    },
    // the tokenizer manager's: a request's tokens once it finishes
    serverCounter(
      "sglang:prompt_tokens_total",
      "Number of prefill tokens processed.",
      (r) => r.stats.finishedPromptTokens
    ),
    serverCounter(
      "sglang:generation_tokens_total",
      "Number of generation tokens processed.",
      (r) => r.stats.finishedGenerationTokens
    ),
    serverCounter("sglang:cached_tokens_total", "Number of cached prompt tokens.", (r) => r.stats.finishedCachedTokens),
    serverCounter("sglang:num_requests_total", "Number of requests processed.", (r) => r.stats.served),
    // TokenizerManager.abort_request counts a request still in flight that its client left (python/sglang/srt/
    // managers/tokenizer_manager.py; metrics/collector.py): its one child is made at the first abort
    {
      kind: "counter",
      name: "sglang:num_aborted_requests_total",
      help: "Number of requests aborted.",
      scope: "server",
      children: ({ stats: s }, all) => (all.some((r) => r.stats.aborted > 0) ? [[{}, s.aborted]] : [])
    },
    hist("server", "sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", (s) => s.ttft),
    hist("server", "sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", (s) => s.itl),
    hist(
      "server",
      "sglang:e2e_request_latency_seconds",
      "Histogram of End-to-end request latency in seconds",
      (s) => s.e2e
    )
  ]
}

/**
 * llama-server (ggml-org/llama.cpp tools/server): one server, its series unlabelled, the HELP texts and values as
 * the bundled build writes them (test/real/sim-differential.test.ts holds the page to it line for line).
 */
const LLAMA: Page = {
  value: cppDouble,
  rankLabels: () => ({}),
  serverLabels: () => ({}),
  families: [
    counter(
      "llamacpp:prompt_tokens_total",
      "Number of prompt tokens processed, excluding cached tokens",
      (r) => r.stats.promptTokens
    ),
    counter("llamacpp:prompt_tokens_cached_total", "Number of prompt tokens reused from the cache", () => 0),
    counter("llamacpp:prompt_seconds_total", "Total time spent processing prompts", () => 0),
    counter(
      "llamacpp:tokens_predicted_total",
      "Number of generation tokens processed",
      (r) => r.stats.finishedGenerationTokens
    ),
    counter("llamacpp:tokens_predicted_seconds_total", "Total time spent generating tokens", () => 0),
    // one per batched llama_decode() (a token of every busy slot), the longest sequence a decode saw (Stats.decoded;
    // tools/server/server-context.cpp metrics_post_decode); HELP texts of tools/server/server-task.cpp to_metrics
    counter(
      "llamacpp:n_decode_total",
      "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
      (r) => r.stats.decodes
    ),
    counter(
      "llamacpp:n_tokens_max",
      "Largest observed sequence length (prompt + generation)",
      (r) => r.stats.tokensMax
    ),
    // tools/server/server-task.cpp exports the speculative-decoding counters even with no draft model.
    counter("llamacpp:spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated", () => 0),
    counter(
      "llamacpp:spec_decode_num_accepted_tokens_total",
      "Speculative: Total draft tokens accepted by the target model",
      () => 0
    ),
    counter(
      "llamacpp:spec_decode_num_drafts_total",
      "Speculative: Total speculative decoding verification steps",
      () => 0
    ),
    gauge("llamacpp:prompt_tokens_seconds", "Average prompt throughput in tokens/s", () => 0),
    gauge("llamacpp:predicted_tokens_seconds", "Average generation throughput in tokens/s", () => 0),
    gauge("llamacpp:requests_processing", "Number of requests processing", (r) => r.gauges.running),
    gauge("llamacpp:requests_deferred", "Number of requests deferred", (r) => r.gauges.waiting),
    // n_busy_slots / n_decode since the start, not the slots busy now (server_task_result_metrics::to_metrics)
    gauge(
      "llamacpp:n_busy_slots_per_decode",
      "Average number of busy slots per llama_decode() call",
      (r) => r.stats.busySlots / Math.max(r.stats.decodes, 1)
    )
  ]
}

export const PAGES: Record<Flavor, Page | undefined> = { vllm: VLLM, sglang: SGLANG, llama_cpp: LLAMA, mlx: undefined }
