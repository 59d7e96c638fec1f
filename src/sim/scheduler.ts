// Admission of sequences: at most `maxSeqs` run at once, the rest wait in FIFO order (like an engine's
// waiting queue). A waiting request that is aborted leaves the queue; a finished one hands its slot on. Each running
// one holds a numbered slot: the idle one least recently used, the last of equals (llama-server's
// get_available_slot by LRU, tools/server/server-context.cpp: `slot.t_last_used <= t_last`, so a fresh server's
// first task takes its last slot; measured).
export interface Ticket {
  /** Resolves when the sequence may run. */
  readonly admitted: Promise<void>
  /** Whether it holds its slot now (admitted, not yet released). */
  holds(): boolean
  /** The slot it holds or held; -1 before. */
  slot(): number
  /** Frees the slot (running) or leaves the queue (waiting). Idempotent. */
  release(): void
}

export class Scheduler {
  private maxSeqs: number
  private runningCount = 0
  private readonly queue: Array<{ resolve: () => void; cancelled: boolean }> = []
  private queued = 0
  /** Per slot: whether it is held, and when it was last freed (-1: never). */
  private readonly held: Array<boolean>
  private readonly lastUsed: Array<number>
  private clock = 0

  constructor(maxSeqs: number) {
    this.maxSeqs = Math.max(1, maxSeqs)
    this.held = Array.from({ length: this.maxSeqs }, () => false)
    this.lastUsed = Array.from({ length: this.maxSeqs }, () => -1)
  }

  /** Whether slot `id` is held. */
  busy(id: number): boolean {
    return this.held[id] === true
  }

  private take(): number {
    let pick = -1
    for (let id = 0; id < this.maxSeqs; id++) {
      if (!this.held[id] && (pick < 0 || (this.lastUsed[id] ?? 0) <= (this.lastUsed[pick] ?? 0))) pick = id
    }
    this.held[pick] = true
    return pick
  }

  get running(): number {
    return this.runningCount
  }

  get waiting(): number {
    return this.queued
  }

  /** A ticket in the queue; `onAdmit` is told its slot as it takes it. */
  enter(onAdmit?: (slot: number) => void): Ticket {
    let state: "waiting" | "running" | "done" = "waiting"
    let slot = -1
    const entry = { resolve: () => {}, cancelled: false }
    const admitted = new Promise<void>((resolve) => {
      entry.resolve = () => {
        state = "running"
        slot = this.take()
        onAdmit?.(slot)
        resolve()
      }
    })
    if (this.runningCount < this.maxSeqs) {
      this.runningCount++
      entry.resolve()
    } else {
      this.queue.push(entry)
      this.queued++
    }
    return {
      admitted,
      holds: () => state === "running",
      slot: () => slot,
      release: () => {
        if (state === "done") return
        if (state === "running") {
          this.held[slot] = false
          this.lastUsed[slot] = ++this.clock
          this.runningCount--
          this.next()
        } else {
          entry.cancelled = true
          this.queued--
        }
        state = "done"
      }
    }
  }

  private next(): void {
    while (this.runningCount < this.maxSeqs && this.queue.length > 0) {
      const e = this.queue.shift()
      if (e === undefined || e.cancelled) continue
      this.queued--
      this.runningCount++
      e.resolve()
    }
  }
}
