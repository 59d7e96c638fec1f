/**
 * Admission: at most `[agent].max_inflight` Generate calls run at once, at most `[agent].max_queue` wait in
 * FIFO order, everything beyond is refused at once (never an unbounded pile-up). Owns the service interface,
 * its two typed errors (their gRPC statuses are rows of GrpcStatus.ts's table), and the pure slot/queue ledger
 * the live layer drives.
 * The ledger does no I/O and knows nothing of fibers: a waiter is any object the caller gives it.
 */
import { Context, type Effect, Schema, type Scope } from "effect"

/** Both the slots and the queue are full. Maps to RESOURCE_EXHAUSTED; the router should try another node. */
export class Overloaded extends Schema.TaggedError<Overloaded>()("Overloaded", {
  maxInflight: Schema.Number,
  maxQueue: Schema.Number
}) {
  override get message(): string {
    return (
      `overloaded: ${this.maxInflight} requests in flight (agent.max_inflight = ${this.maxInflight}) and ` +
      `${this.maxQueue} queued (agent.max_queue = ${this.maxQueue}); retry later or on another node`
    )
  }
}

/** The agent is draining and takes no new requests. Maps to UNAVAILABLE (retryable elsewhere). */
export class Draining extends Schema.TaggedError<Draining>()("Draining", {}) {
  override get message(): string {
    return "draining: this node takes no new requests; retry on another node"
  }
}

export type AdmissionError = Overloaded | Draining

/** What a caller holds while admitted. */
export interface Permit {
  /** How long the caller waited in the queue, in milliseconds (0 when a slot was free at once). */
  readonly queuedMs: number
}

/** Counters for NodeHealth and /metrics; all readable at any time. */
export interface AdmissionStats {
  readonly inflight: number
  readonly queued: number
  readonly maxInflight: number
  readonly maxQueue: number
  readonly draining: boolean
  /** Totals since start. */
  readonly admitted: number
  readonly refusedOverloaded: number
  readonly refusedDraining: number
}

export interface AdmissionService {
  /**
   * Take a slot, waiting in the queue when all are busy; the slot is released when the scope closes.
   * Interrupting a queued caller removes it from the queue (or returns the slot it was just handed).
   */
  readonly acquire: Effect.Effect<Permit, AdmissionError, Scope.Scope>
  readonly inflight: Effect.Effect<number>
  readonly queued: Effect.Effect<number>
  readonly stats: Effect.Effect<AdmissionStats>
  /**
   * Enter drain mode: new acquires fail with Draining; holders finish. Queued callers are still served in
   * order, unless `rejectQueued`, which fails them with Draining at once. Idempotent.
   */
  readonly close: (options?: { readonly rejectQueued?: boolean }) => Effect.Effect<void>
  /** Completes once nothing is in flight or queued (at once if so now). Drain uses it with a timeout. */
  readonly awaitIdle: Effect.Effect<void>
}

export class Admission extends Context.Service<Admission, AdmissionService>()("cgn-agent/Admission") {}

// ---------------------------------------------------------------------------------------------------------
// Pure ledger

/** The outcome of `AdmissionLedger.enter`. */
export type EnterResult = "admitted" | "queued" | "overloaded" | "draining"

/**
 * Slot and queue accounting. `W` is the caller's waiter object; the ledger hands a freed slot directly to the
 * oldest waiter (so `inflight` never dips and a newcomer cannot overtake the queue).
 * A Set keeps insertion order and deletes in O(1), which is all a FIFO with cancellation needs.
 */
export class AdmissionLedger<W> {
  readonly maxInflight: number
  readonly maxQueue: number
  #inflight = 0
  readonly #queue = new Set<W>()
  #draining = false
  #admitted = 0
  #refusedOverloaded = 0
  #refusedDraining = 0

  constructor(maxInflight: number, maxQueue: number) {
    if (!Number.isInteger(maxInflight) || maxInflight < 1) throw new RangeError("maxInflight must be an integer >= 1")
    if (!Number.isInteger(maxQueue) || maxQueue < 0) throw new RangeError("maxQueue must be an integer >= 0")
    this.maxInflight = maxInflight
    this.maxQueue = maxQueue
  }

  get inflight(): number {
    return this.#inflight
  }
  get queued(): number {
    return this.#queue.size
  }
  get draining(): boolean {
    return this.#draining
  }
  get idle(): boolean {
    return this.#inflight === 0 && this.#queue.size === 0
  }

  /** A new caller: a free slot, a place in the queue, or a refusal. */
  enter(waiter: W): EnterResult {
    if (this.#draining) {
      this.#refusedDraining++
      return "draining"
    }
    if (this.#inflight < this.maxInflight) {
      this.#inflight++
      this.#admitted++
      return "admitted"
    }
    if (this.#queue.size < this.maxQueue) {
      this.#queue.add(waiter)
      return "queued"
    }
    this.#refusedOverloaded++
    return "overloaded"
  }

  /**
   * A holder gives its slot back. Returns the waiter that now owns it (the caller must wake it), or
   * undefined when the slot became free.
   */
  release(): W | undefined {
    if (this.#inflight === 0) throw new Error("AdmissionLedger.release without a held slot")
    const next = this.#queue.values().next()
    if (!next.done) {
      this.#queue.delete(next.value)
      this.#admitted++
      return next.value
    }
    this.#inflight--
    return undefined
  }

  /** A queued waiter gives up. False when it is not queued (it was already handed a slot, or rejected). */
  cancel(waiter: W): boolean {
    return this.#queue.delete(waiter)
  }

  /** Enter drain mode; returns the waiters to reject when `rejectQueued` (they leave the queue). */
  close(rejectQueued: boolean): ReadonlyArray<W> {
    this.#draining = true
    if (!rejectQueued) return []
    const rejected = [...this.#queue]
    this.#queue.clear()
    this.#refusedDraining += rejected.length
    return rejected
  }

  stats(): AdmissionStats {
    return {
      inflight: this.#inflight,
      queued: this.#queue.size,
      maxInflight: this.maxInflight,
      maxQueue: this.maxQueue,
      draining: this.#draining,
      admitted: this.#admitted,
      refusedOverloaded: this.#refusedOverloaded,
      refusedDraining: this.#refusedDraining
    }
  }
}
