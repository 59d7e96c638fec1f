// Counters and histograms the simulator's /metrics reports (pure data, updated by the server).
export class Histogram {
  readonly buckets: ReadonlyArray<number>
  readonly counts: Array<number>
  sum = 0
  count = 0
  constructor(buckets: ReadonlyArray<number>) {
    this.buckets = buckets
    this.counts = buckets.map(() => 0)
  }
  observe(v: number): void {
    this.sum += v
    this.count++
    // Per-bucket (non-cumulative) counts; the renderer accumulates them into `le` buckets.
    for (let i = 0; i < this.buckets.length; i++) {
      if (v <= (this.buckets[i] ?? 0)) {
        this.counts[i] = (this.counts[i] ?? 0) + 1
        return
      }
    }
  }
}

/** vLLM's TTFT buckets (seconds). */
export const TTFT_BUCKETS = [
  0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
  640.0, 2560.0
]
/** vLLM's inter-token latency buckets (seconds). */
export const ITL_BUCKETS = [
  0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0
]
export const E2E_BUCKETS = [
  0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0,
  7680.0
]

/** A request's part in llama-server's decode steps (Stats.decoded). */
interface Decoding {
  /** The last step it had tokens in. */
  step: number
  /** Its tokens in that step: one per sequence. */
  tokens: number
  /** Its sequences that were generating as that step began. */
  sequences: number
  /** The steps it had tokens in: its longest sequence's tokens. */
  steps: number
}

/**
 * One engine core's figures. Each token counter moves when its engine moves its own (the agent's stall rule reads
 * them as proof of progress, so a counter that moved early would hide a wedge): prompts once prefilled, at the
 * request's first token (vllm/v1/metrics/stats.py IterationStats.update_from_output; llama.cpp
 * tools/server/server-context.cpp server_metrics::on_prompt_eval; SGLang's scheduler counts a prefill batch as it
 * runs); generated tokens one by one; the `finished*` ones as a request finishes, as SGLang's tokenizer manager
 * counts its prompt, generation and cached tokens (TokenizerMetricsCollector.observe_one_finished_request) and
 * llama-server its predicted tokens (server_metrics::on_prediction). Prefix-cache queries and hits count at
 * scheduling, as vLLM's do.
 */
export class Stats {
  promptTokens = 0
  /** The cached part of the prefilled prompts (SGLang's realtime prefill_cache tokens). */
  prefilledHits = 0
  generationTokens = 0
  finishedPromptTokens = 0
  finishedGenerationTokens = 0
  finishedCachedTokens = 0
  prefixQueries = 0
  prefixHits = 0
  preemptions = 0
  served = 0
  aborted = 0
  received = 0
  /** SGLang: health checks answered 200 after their generation (sglangHealth.ts). */
  healthChecks = 0
  readonly success = new Map<string, number>()
  readonly ttft = new Histogram(TTFT_BUCKETS)
  readonly itl = new Histogram(ITL_BUCKETS)
  readonly e2e = new Histogram(E2E_BUCKETS)
  /** llama-server's `n_decode`: its llama_decode() calls, one batch for every busy slot's next token. */
  decodes = 0
  /** llama-server's `n_busy_slots`: the busy slots of every decode, added up. */
  busySlots = 0
  /** llama-server's `n_tokens_max`: the longest sequence (prompt and tokens) a decode has seen. */
  tokensMax = 0
  private stepRequests: Array<() => boolean> = []
  private readonly decoding = new WeakMap<() => boolean, Decoding>()
  finished(reason: string): void {
    this.served++
    this.success.set(reason, (this.success.get(reason) ?? 0) + 1)
  }

  /**
   * A request its client left while it waited for a slot, which llama-server keeps (generate.ts): its prompt is
   * evaluated for nobody and its first token made with it, counted as the request ends.
   */
  firstTokenForNobody(ended: () => boolean, promptTokens: number, promptWords: number): void {
    this.promptTokens += promptWords
    this.generationTokens++
    this.decoded(ended, promptTokens, 1)
    this.finishedGenerationTokens++
  }

  /**
   * One token a request made (generate.ts calls it with each), counted as llama-server counts its decode steps: each
   * llama_decode() takes a token of every busy slot (a new request's prompt with them), then metrics_post_decode adds
   * one to `n_decode`, each busy slot to `n_busy_slots`, and raises `n_tokens_max` to the longest slot's tokens
   * (ggml-org/llama.cpp tools/server/server-context.cpp, update_slots, metrics_post_decode). Here a step holds at most
   * one token of each sequence: a request's token opens a new step once the current one has a token of each of its
   * sequences; else it joins the current step if the request had tokens in it or in the one before, or if another
   * request still running has tokens in it; else (the server was idle) it opens one. A sequence's k-th step decodes
   * its prompt and k - 1 tokens. Only the llama_cpp page reads these.
   * @param ended the request's test of whether it has ended (generate.ts `gone`), which also names it
   * @param promptTokens its prompt's tokens
   * @param sequences its sequences not yet ended (llama.cpp's `n`, each in a slot of its own), read as its part in a
   *   step begins: one that ends within the step keeps its place there
   */
  decoded(ended: () => boolean, promptTokens: number, sequences: number): void {
    let d = this.decoding.get(ended)
    if (d === undefined) {
      d = { step: 0, tokens: 0, sequences: 0, steps: 0 }
      this.decoding.set(ended, d)
    }
    const current = this.decodes
    const mine = current > 0 && d.step === current
    const joins = mine || (d.step > 0 && d.step === current - 1) || this.stepRequests.some((e) => !e())
    if ((mine && d.tokens >= d.sequences) || !joins) {
      this.decodes++
      this.stepRequests = []
    }
    if (d.step !== this.decodes) {
      d.step = this.decodes
      d.tokens = 0
      d.sequences = Math.max(1, sequences)
      d.steps++
      this.stepRequests.push(ended)
    }
    d.tokens++
    this.busySlots++
    this.tokensMax = Math.max(this.tokensMax, promptTokens + d.steps - 1)
  }
}
