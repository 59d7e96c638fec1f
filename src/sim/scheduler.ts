// Admission of sequences: at most `maxSeqs` run at once, the rest wait in FIFO order (like an engine's
// waiting queue; a group waits for all its slots, and a later place that fits passes it). A waiting request that is aborted leaves the queue; a finished one hands its slot on. Each running
// one holds a numbered slot: the idle one its `prefer` names (llama-server's prompt similarity: llamaSlots.ts),
// else the idle one least recently used, the last of equals (llama-server's get_available_slot by LRU,
// tools/server/server-context.cpp: `slot.t_last_used <= t_last`, so a fresh server's first task takes its last
// slot; measured); a group's others take the lowest idle ones (get_free_slots, for a task's children).
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

/** A place in the queue: `need` slots taken together once that many are free. */
interface Waiting {
  readonly need: number
  readonly admit: () => void
  cancelled: boolean
}

export class Scheduler {
  private maxSeqs: number
  private runningCount = 0
  private readonly queue: Array<Waiting> = []
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

  private take(first: boolean, prefer?: (free: ReadonlyArray<number>) => number | undefined): number {
    const free = this.held.flatMap((h, id) => (h ? [] : [id]))
    let pick = first ? (prefer?.(free) ?? -1) : (free[0] ?? -1)
    for (const id of pick < 0 ? free : []) {
      if (pick < 0 || (this.lastUsed[id] ?? 0) <= (this.lastUsed[pick] ?? 0)) pick = id
    }
    this.held[pick] = true
    return pick
  }

  get running(): number {
    return this.runningCount
  }

  /** Places in the queue (a group is one: llama-server defers a task with its children as one). */
  get waiting(): number {
    return this.queued
  }

  /** A ticket in the queue; `onAdmit` is told its slot as it takes it. */
  enter(onAdmit?: (slot: number) => void): Ticket {
    return this.enterGroup(1, onAdmit && ((slot) => onAdmit(slot)))[0] as Ticket
  }

  /**
   * `n` tickets (at most maxSeqs) admitted together, once `n` slots are free: llama-server's task with `n`
   * completions holds no slot until it can launch with all its children, and a later task that fits a free slot
   * meanwhile runs first (measured against the real server: test/real/sim-differential-4.test.ts). Each ticket
   * frees its slot on its own; releasing one still waiting takes the whole group out of the queue.
   */
  enterGroup(
    n: number,
    onAdmit?: (slot: number, k: number) => void,
    prefer?: (free: ReadonlyArray<number>) => number | undefined
  ): ReadonlyArray<Ticket> {
    const need = Math.max(1, Math.min(n, this.maxSeqs))
    const states = Array.from({ length: need }, (): "waiting" | "running" | "done" => "waiting")
    const slots = Array.from({ length: need }, () => -1)
    let resolve: () => void = () => {}
    const admitted = new Promise<void>((r) => {
      resolve = r
    })
    const entry: Waiting = {
      need,
      cancelled: false,
      admit: () => {
        for (let k = 0; k < need; k++) {
          states[k] = "running"
          const slot = this.take(k === 0, prefer)
          slots[k] = slot
          onAdmit?.(slot, k)
        }
        resolve()
      }
    }
    // Whatever waits needs more slots than are free (next() admits all that fit), so one that fits goes first.
    if (this.maxSeqs - this.runningCount >= need) {
      this.runningCount += need
      entry.admit()
    } else {
      this.queue.push(entry)
      this.queued++
    }
    const ticket = (k: number): Ticket => ({
      admitted,
      holds: () => states[k] === "running",
      slot: () => slots[k] ?? -1,
      release: () => {
        if (states[k] === "done") return
        if (states[k] === "running") {
          const slot = slots[k] ?? -1
          this.held[slot] = false
          this.lastUsed[slot] = ++this.clock
          this.runningCount--
          this.next()
        } else if (!entry.cancelled) {
          entry.cancelled = true
          this.queued--
        }
        states[k] = "done"
      }
    })
    return Array.from({ length: need }, (_, k) => ticket(k))
  }

  /** Admits, in queue order, every place whose slots are free now (one that does not fit lets later ones pass). */
  private next(): void {
    for (let i = 0; i < this.queue.length; ) {
      const e = this.queue[i] as Waiting
      if (e.cancelled) this.queue.splice(i, 1)
      else if (this.maxSeqs - this.runningCount >= e.need) {
        this.queue.splice(i, 1)
        this.queued--
        this.runningCount += e.need
        e.admit()
      } else i++
    }
  }
}
