// The wedge fault (POST /sim/faults {"wedged": true}): the engine core hangs while its API server still answers, as
// a hung collective or a scheduler stuck in a loop leaves vLLM or SGLang. No request moves (no first token, no next
// one, no answer), an abort never reaches the core (the request stays counted as running or waiting), /metrics
// answers what the core last published (vLLM's and SGLang's gauges and counters come from the core's own reports:
// they stay as they were when it hung), and health stays green. llama-server answers /metrics from its server loop
// (a SERVER_TASK_TYPE_METRICS task, ggml-org/llama.cpp tools/server/server-context.cpp), so there the answer waits
// for the loop. {"wedged": false} lets the core go on: every request resumes where it stopped, and those abandoned
// meanwhile are let go. One data-parallel rank can hang alone ({"wedged_rank": 1}; null lets it go on): vLLM runs a
// dense model's DP ranks as independent engine cores (vllm-project/vllm vllm/v1/engine/core.py run_engine_core:
// "Non-MoE DP ranks are completely independent"), so one can hang while the others serve; its series on /metrics
// keep what it last published (its gauges frozen here, its counters still since it makes nothing).

/** An engine core's run state; `Snapshot`: what it last published, kept while it hangs. */
export class Core<Snapshot = string> {
  #resumed: Promise<void> | undefined
  #resume: () => void = () => {}
  /** What the core had published when it hung (the /metrics text, or a rank's gauges), or undefined. */
  #frozen: Snapshot | undefined

  get wedged(): boolean {
    return this.#resumed !== undefined
  }

  get frozenMetrics(): Snapshot | undefined {
    return this.#frozen
  }

  /** Hangs the core; `metrics`: what it published at this moment (undefined where the engine has none). */
  wedge(metrics: Snapshot | undefined): void {
    if (this.#resumed !== undefined) return
    this.#frozen = metrics
    this.#resumed = new Promise<void>((resolve) => {
      this.#resume = resolve
    })
  }

  unwedge(): void {
    if (this.#resumed === undefined) return
    this.#resumed = undefined
    this.#frozen = undefined
    this.#resume()
  }

  /** Resolves at once while the core runs, else once it runs again. */
  running(): Promise<void> {
    return this.#resumed ?? Promise.resolve()
  }

  /** Runs `f` now while the core runs, else once it runs again (an abort reaches a hung core only then). */
  whenRunning(f: () => void): void {
    if (this.#resumed === undefined) f()
    else void this.#resumed.then(f)
  }
}
