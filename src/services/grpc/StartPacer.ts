/**
 * StartPacer: how the starts of calls that arrive together are spread over event-loop turns.
 * A router's burst arrives in one read of the HTTP/2 connection, and each call's start (planning, admission,
 * the engine request) runs before the loop reads anything else. Started all at once, 256 calls keep the loop
 * busy for ~10 ms here, longer than the engine takes to answer the first of them, so the first tokens of the
 * calls started first wait for the last start. The pacer runs starts at once until one turn has spent
 * `budgetMs` on them; later starts wait in FIFO order and run `budgetMs` at a time in the following turns,
 * and between those the loop relays what the engine has answered (docs/bench.md, "Starts paced").
 * A lone call, or a few, start at once: nothing is deferred until a turn's starts exceed the budget.
 * Pure scheduling: the clock and the deferral (the next turn) are given, so tests drive both.
 */

export interface StartPacerOptions {
  /** Time one event-loop turn may spend on starts before the rest wait for the next turn (ms). */
  readonly budgetMs: number
  /** A monotonic clock in milliseconds. */
  readonly now: () => number
  /** Runs its argument in a later event-loop turn, after pending I/O has been handled. */
  readonly defer: (f: () => void) => void
}

/** A start must not throw: a deferred one runs outside any caller that could catch it. */
export type Start = () => void

export class StartPacer {
  readonly #budgetMs: number
  readonly #now: () => number
  readonly #defer: (f: () => void) => void
  #queue: Array<Start | undefined> = []
  #head = 0
  #windowStart = Number.NEGATIVE_INFINITY
  /** The current window spent its budget: new starts queue until the deferred drain has run them. */
  #saturated = false

  constructor(options: StartPacerOptions) {
    this.#budgetMs = options.budgetMs
    this.#now = options.now
    this.#defer = options.defer
  }

  /** Starts waiting for a later turn. */
  get queued(): number {
    return this.#queue.length - this.#head
  }

  /** Runs `start` now, or after the starts queued before it when this turn's budget is spent. */
  start(start: Start): void {
    if (this.#saturated) {
      this.#queue.push(start)
      return
    }
    const now = this.#now()
    // A window is the stretch of starts one turn runs; one idle for longer than the budget is over.
    if (now - this.#windowStart > this.#budgetMs) this.#windowStart = now
    start()
    if (this.#now() - this.#windowStart > this.#budgetMs) {
      this.#saturated = true
      this.#defer(this.#drain)
    }
  }

  /** One later turn: a fresh budget for the queued starts, oldest first (at least one runs). */
  readonly #drain = (): void => {
    this.#windowStart = this.#now()
    while (this.#head < this.#queue.length) {
      const start = this.#queue[this.#head] as Start
      this.#queue[this.#head++] = undefined
      start()
      if (this.#now() - this.#windowStart > this.#budgetMs) break
    }
    if (this.#head < this.#queue.length) {
      this.#defer(this.#drain)
      return
    }
    this.#queue = []
    this.#head = 0
    this.#saturated = false
  }
}
