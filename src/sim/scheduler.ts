// Admission of sequences: at most `maxSeqs` run at once, the rest wait in FIFO order (like an engine's
// waiting queue). A waiting request that is aborted leaves the queue; a finished one hands its slot on.
export interface Ticket {
  /** Resolves when the sequence may run. */
  readonly admitted: Promise<void>
  /** Frees the slot (running) or leaves the queue (waiting). Idempotent. */
  release(): void
}

export class Scheduler {
  private maxSeqs: number
  private runningCount = 0
  private readonly queue: Array<{ resolve: () => void; cancelled: boolean }> = []
  private queued = 0

  constructor(maxSeqs: number) {
    this.maxSeqs = Math.max(1, maxSeqs)
  }

  get running(): number {
    return this.runningCount
  }

  get waiting(): number {
    return this.queued
  }

  enter(): Ticket {
    let state: "waiting" | "running" | "done" = "waiting"
    const entry = { resolve: () => {}, cancelled: false }
    const admitted = new Promise<void>((resolve) => {
      entry.resolve = () => {
        state = "running"
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
      release: () => {
        if (state === "done") return
        if (state === "running") {
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
