/**
 * Admission: at most `[agent].max_inflight` Generate calls run at once, at most `[agent].max_queue` wait in
 * FIFO order, everything beyond is refused at once (never an unbounded pile-up). A call with a deadline that must
 * wait is shed once its time left is below what calls here need (ServiceTimes.ts): at arrival (RESOURCE_EXHAUSTED,
 * try another node) or when a slot is handed to it (DEADLINE_EXCEEDED), never sent to the engine. Owns the service
 * interface, its typed errors (their gRPC statuses are rows of GrpcStatus.ts's table; their messages carry no advice
 * to retry, which StatusMessage.ts asSent appends), and the pure slot/queue ledger the live layer drives.
 * The ledger does no I/O and knows nothing of fibers: a waiter is any object the caller gives it.
 */
import { Context, type Effect, Schema, type Scope } from "effect"
import type { ServiceKind } from "./ServiceTimes.ts"

/** Both the slots and the queue are full. Maps to RESOURCE_EXHAUSTED; the router should try another node. */
export class Overloaded extends Schema.TaggedError<Overloaded>()("Overloaded", {
  maxInflight: Schema.Number,
  maxQueue: Schema.Number
}) {
  override get message(): string {
    return (
      `overloaded: ${this.maxInflight} requests in flight (agent.max_inflight = ${this.maxInflight}) and ` +
      `${this.maxQueue} queued (agent.max_queue = ${this.maxQueue})`
    )
  }
}

/** The agent is draining and takes no new requests. Maps to UNAVAILABLE (retryable elsewhere). */
export class Draining extends Schema.TaggedError<Draining>()("Draining", {}) {
  override get message(): string {
    return "draining: this node takes no new requests"
  }
}

const ServiceKindSchema = Schema.Literals(["prefill", "decode", "normal"])

/** What calls of a kind need, in words: "prefill legs here need ~900 ms to finish". */
const needs = (kind: ServiceKind, needMs: number): string => {
  const ms = `~${Math.round(needMs)} ms`
  if (kind === "prefill") return `prefill legs here need ${ms} from a slot to their answer`
  return `${kind === "decode" ? "decode legs" : "calls"} here need ${ms} from a slot to their first token`
}

const shedFields = {
  kind: ServiceKindSchema,
  /** Time left of the call's deadline when it was shed, ms. */
  leftMs: Schema.Number,
  /** What calls of its kind need here (ServiceTimes' estimate), ms. */
  needMs: Schema.Number,
  /** Whose deadline: "[agent].handoff_timeout = 4s", "the caller's deadline". */
  deadline: Schema.String
}

/**
 * All slots were busy and the call's deadline was already below what calls here need: it is refused at once
 * instead of queued. Maps to RESOURCE_EXHAUSTED: another node, less loaded, may still answer in time.
 */
export class ShedAtArrival extends Schema.TaggedError<ShedAtArrival>()("ShedAtArrival", {
  ...shedFields,
  maxInflight: Schema.Number
}) {
  override get message(): string {
    return (
      `not queued: all ${this.maxInflight} slots are busy (agent.max_inflight) and the call has ` +
      `~${Math.round(this.leftMs)} ms left of its deadline (${this.deadline}); ${needs(this.kind, this.needMs)}; ` +
      "not sent to the engine"
    )
  }
}

/**
 * A queued call reached a slot with less time left than calls here need: it fails at once and the slot goes to
 * the next waiter. Maps to DEADLINE_EXCEEDED (its deadline could not be met here).
 */
export class ShedAtSlot extends Schema.TaggedError<ShedAtSlot>()("ShedAtSlot", {
  ...shedFields,
  /** How long it waited for the slot, ms. */
  queuedMs: Schema.Number
}) {
  override get message(): string {
    return (
      `~${Math.round(this.leftMs)} ms left of its deadline (${this.deadline}) after ${Math.round(this.queuedMs)} ms ` +
      `waiting for a slot (agent.max_inflight); ${needs(this.kind, this.needMs)}; not sent to the engine`
    )
  }
}

export type AdmissionError = Overloaded | Draining | ShedAtArrival | ShedAtSlot

/** A call's deadline as admission sees it: shedding compares it with what calls of its kind need. */
export interface CallDeadline {
  /** Time left, in ms from the acquire. */
  readonly ms: number
  readonly kind: ServiceKind
  /** Whose deadline, for the message: "[agent].handoff_timeout = 4s", "the caller's deadline". */
  readonly source: string
}

/** What a caller holds while admitted. */
export interface Permit {
  /** How long the caller waited in the queue, in milliseconds (0 when a slot was free at once). */
  readonly queuedMs: number
  /** When the slot was taken (Clock ms): what the call needs from there is measured from it (`observe`). */
  readonly at: number
}

/** The ledger's counters. */
export interface LedgerStats {
  readonly inflight: number
  readonly queued: number
  readonly maxInflight: number
  readonly maxQueue: number
  readonly draining: boolean
  /** Totals since start. */
  readonly admitted: number
  readonly refusedOverloaded: number
  readonly refusedDraining: number
  /** Calls shed for their deadline (ShedAtArrival, ShedAtSlot). */
  readonly shedAtArrival: number
  readonly shedAtSlot: number
}

/** Counters for /status and /metrics; all readable at any time. */
export interface AdmissionStats extends LedgerStats {
  /** What calls of each kind measured so far need from a slot, ms (ServiceTimes' estimate; none: never shed). */
  readonly needMs: Partial<Record<ServiceKind, number>>
}

export interface AdmissionService {
  /**
   * Take a slot, waiting in the queue when all are busy; the slot is released when the scope closes.
   * Interrupting a queued caller removes it from the queue (or returns the slot it was just handed).
   */
  readonly acquire: Effect.Effect<Permit, AdmissionError, Scope.Scope>
  /** `acquire` for a call with a deadline: shed (ShedAtArrival, ShedAtSlot) once it cannot finish in time. */
  readonly acquireWithin: (deadline: CallDeadline) => Effect.Effect<Permit, AdmissionError, Scope.Scope>
  /**
   * A call of `kind` got what it needed (a prefill leg its answer, others their first chunk) `ms` after its slot
   * (Permit.at). Calls cut off before then tell nothing (ServiceTimes.ts says why). Synchronous: it is called from
   * the engine read's callback.
   */
  readonly observe: (kind: ServiceKind, ms: number) => void
  readonly inflight: Effect.Effect<number>
  readonly queued: Effect.Effect<number>
  readonly stats: Effect.Effect<AdmissionStats>
  /**
   * Enter drain mode: new acquires fail with Draining; holders finish. Queued callers are still served in
   * order, unless `rejectQueued`, which fails them with Draining at once. Idempotent.
   */
  readonly close: (options?: { readonly rejectQueued?: boolean }) => Effect.Effect<void>
  /**
   * A new call the node's drain refused before it reached a slot (ServingState: from the drain's first moment,
   * while admission is closed only after the `draining` write to etcd): counted with admission's own drain
   * refusals, so `refusedDraining` and `admission_refusals_total{reason="draining"}` count every call the drain
   * refused. Synchronous (the per-call refusal is a flag read); returns the error to end the call with.
   */
  readonly refuseDraining: () => Draining
  /** Completes once nothing is in flight or queued (at once if so now). Drain uses it with a timeout. */
  readonly awaitIdle: Effect.Effect<void>
}

export class Admission extends Context.Service<Admission, AdmissionService>()("cgn-agent/Admission") {}

// ---------------------------------------------------------------------------------------------------------
// Pure ledger

/** The outcome of `AdmissionLedger.enter`. */
export type EnterResult = "admitted" | "queued" | "overloaded" | "draining" | "shed"

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
  #shedAtArrival = 0
  #shedAtSlot = 0

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

  /**
   * A new caller: a free slot, a place in the queue, or a refusal. `tooLateToWait`: its deadline is already below
   * what calls here need, so it is shed rather than queued (a free slot still takes it: nobody waits for that slot,
   * and calls that go straight to the engine keep the estimate current).
   */
  enter(waiter: W, tooLateToWait = false): EnterResult {
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
      if (tooLateToWait) {
        this.#shedAtArrival++
        return "shed"
      }
      this.#queue.add(waiter)
      return "queued"
    }
    this.#refusedOverloaded++
    return "overloaded"
  }

  /**
   * A holder gives its slot back. Returns the waiter that now owns it (the caller must wake it), or
   * undefined when the slot became free. Each waiter is offered to `tooLate` first, oldest first: true takes it
   * out of the queue (the caller fails it, once this returns) and the slot goes on to the next one. `tooLate` only
   * decides: it must not wake anyone, whose fiber would then run inside this loop.
   */
  release(tooLate?: (waiter: W) => boolean): W | undefined {
    if (this.#inflight === 0) throw new Error("AdmissionLedger.release without a held slot")
    for (const next of this.#queue) {
      this.#queue.delete(next)
      if (tooLate?.(next) === true) {
        this.#shedAtSlot++
        continue
      }
      this.#admitted++
      return next
    }
    this.#inflight--
    return undefined
  }

  /** A caller refused for the drain before it entered (see AdmissionService.refuseDraining). */
  refuseDraining(): void {
    this.#refusedDraining++
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

  stats(): LedgerStats {
    return {
      inflight: this.#inflight,
      queued: this.#queue.size,
      maxInflight: this.maxInflight,
      maxQueue: this.maxQueue,
      draining: this.#draining,
      admitted: this.#admitted,
      refusedOverloaded: this.#refusedOverloaded,
      refusedDraining: this.#refusedDraining,
      shedAtArrival: this.#shedAtArrival,
      shedAtSlot: this.#shedAtSlot
    }
  }
}
