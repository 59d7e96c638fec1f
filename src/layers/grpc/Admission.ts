/**
 * Live Admission: drives the pure AdmissionLedger with fibers. A queued caller waits on its own Deferred; a
 * releasing holder hands its slot to the oldest waiter and completes that Deferred, after failing at once each
 * older waiter whose deadline can no longer be met (ShedAtSlot; ServiceTimes.ts says what calls here need). All
 * ledger updates run synchronously inside uninterruptible regions, so an interruption at any point leaks neither a
 * slot nor a queue entry. Time is the Clock's. `layer` reads `[agent].max_inflight` / `max_queue` and, with
 * Metrics, counts refusals by reason (admissionMetrics.ts); `layerWith` takes the limits (tests).
 */
import { Clock, Deferred, Effect, Layer, Scope } from "effect"
import { Config } from "../../services/config/Config.ts"
import {
  Admission,
  type AdmissionError,
  AdmissionLedger,
  type AdmissionService,
  type CallDeadline,
  Draining,
  Overloaded,
  ShedAtArrival,
  ShedAtSlot
} from "../../services/grpc/Admission.ts"
import { cannotFinish, ServiceTimes } from "../../services/grpc/ServiceTimes.ts"
import { Metrics } from "../../services/observability/Metrics.ts"
import { registerMetrics } from "./admissionMetrics.ts"

interface Waiter {
  readonly wake: Deferred.Deferred<void, Draining | ShedAtSlot>
  /** Set by whoever takes the waiter out of the queue, read by the waiter when it is interrupted. */
  outcome: "queued" | "admitted" | "rejected"
  /** Clock ms of its arrival, and its deadline if it has one. */
  readonly start: number
  readonly deadline: CallDeadline | undefined
}

export interface AdmissionLimits {
  readonly maxInflight: number
  readonly maxQueue: number
}

/** An Admission service over fresh counters. */
export const make = (limits: AdmissionLimits): AdmissionService => {
  const ledger = new AdmissionLedger<Waiter>(limits.maxInflight, limits.maxQueue)
  const times = new ServiceTimes()
  let idleWaiters: Array<Deferred.Deferred<void>> = []

  const notifyIfIdle = (): void => {
    if (!ledger.idle || idleWaiters.length === 0) return
    const waiting = idleWaiters
    idleWaiters = []
    for (const d of waiting) Deferred.doneUnsafe(d, Effect.void)
  }

  // A waiter reaching a slot with less time left than calls of its kind need is failed at once (it would hold an
  // engine slot until its deadline aborted it, while the waiters behind it ran out of time in turn). Only decided
  // here: the ledger is updated before any waiter is woken, since waking one runs its fiber in this very call.
  const shedError = (w: Waiter, now: number): ShedAtSlot | undefined => {
    if (w.deadline === undefined) return undefined
    const needMs = times.need(w.deadline.kind)
    const leftMs = w.start + w.deadline.ms - now
    if (!cannotFinish(leftMs, needMs)) return undefined
    const { kind, source } = w.deadline
    return new ShedAtSlot({
      kind,
      leftMs: Math.max(0, leftMs),
      needMs: needMs!,
      deadline: source,
      queuedMs: now - w.start
    })
  }

  // Synchronous so that no interruption can fall between the ledger update and the wake-up.
  const releaseSlot = (clock: Clock.Clock): void => {
    let next: Waiter | undefined
    let shed: Array<[Waiter, ShedAtSlot]> | undefined
    if (ledger.queued === 0) next = ledger.release()
    else {
      const now = clock.currentTimeMillisUnsafe()
      shed = []
      const found = shed
      next = ledger.release((w) => {
        const e = shedError(w, now)
        if (e !== undefined) found.push([w, e])
        return e !== undefined
      })
    }
    // The ledger is settled: mark everyone, then wake them (a woken fiber may come back into the ledger at once).
    if (shed !== undefined) for (const [w] of shed) w.outcome = "rejected"
    if (next !== undefined) next.outcome = "admitted"
    try {
      if (shed !== undefined) for (const [w, e] of shed) Deferred.doneUnsafe(w.wake, Effect.fail(e))
    } finally {
      if (next === undefined) notifyIfIdle()
      else Deferred.doneUnsafe(next.wake, Effect.void)
    }
  }
  // One finalizer for every holder (no allocation per call).
  const release: Effect.Effect<void> = Clock.clockWith((clock) => Effect.sync(() => releaseSlot(clock)))

  // The common case, a free slot, is one synchronous step: no generator and no log event per call (measured
  // with bench/per-call.ts: ~6% of the agent's CPU per call). Queueing and refusals are logged at debug.
  const logged = (outcome: string) =>
    Effect.logDebug("admission", { outcome, inflight: ledger.inflight, queued: ledger.queued })
  const admittedAt = (scope: Scope.Scope, at: number) =>
    Effect.as(Scope.addFinalizer(scope, release), { queuedMs: 0, at })

  const waitInQueue = (
    restore: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>,
    scope: Scope.Scope,
    waiter: Waiter,
    start: number
  ) =>
    restore(Deferred.await(waiter.wake)).pipe(
      Effect.onInterrupt(() =>
        Effect.suspend(() => {
          if (ledger.cancel(waiter)) notifyIfIdle()
          else if (waiter.outcome === "admitted") return release
          return Effect.void
        })
      ),
      Effect.andThen(Scope.addFinalizer(scope, release)),
      Effect.andThen(Clock.currentTimeMillis),
      Effect.map((now) => ({ queuedMs: now - start, at: now }))
    )

  const refuse = (outcome: string, e: AdmissionError) => Effect.andThen(logged(outcome), Effect.fail(e))

  const acquireWithin = (deadline: CallDeadline | undefined): ReturnType<AdmissionService["acquireWithin"]> =>
    Effect.uninterruptibleMask((restore) =>
      Effect.flatMap(Scope.Scope, (scope) =>
        Effect.flatMap(Clock.currentTimeMillis, (start): ReturnType<AdmissionService["acquireWithin"]> => {
          const waiter: Waiter = { wake: Deferred.makeUnsafe(), outcome: "queued", start, deadline }
          const needMs = deadline === undefined ? undefined : times.need(deadline.kind)
          const entered = ledger.enter(waiter, cannotFinish(deadline?.ms, needMs))
          switch (entered) {
            case "admitted":
              return admittedAt(scope, start)
            case "overloaded":
              return refuse(entered, new Overloaded({ maxInflight: ledger.maxInflight, maxQueue: ledger.maxQueue }))
            case "draining":
              return refuse(entered, new Draining())
            case "shed": {
              const { kind, ms, source } = deadline!
              const fields = { kind, leftMs: ms, needMs: needMs!, deadline: source, maxInflight: ledger.maxInflight }
              return refuse(entered, new ShedAtArrival(fields))
            }
            case "queued":
              return Effect.andThen(logged(entered), waitInQueue(restore, scope, waiter, start))
          }
        })
      )
    )

  const close: AdmissionService["close"] = (options) =>
    Effect.sync(() => {
      for (const w of ledger.close(options?.rejectQueued === true)) {
        w.outcome = "rejected"
        Deferred.doneUnsafe(w.wake, Effect.fail(new Draining()))
      }
      notifyIfIdle()
    })

  const awaitIdle: AdmissionService["awaitIdle"] = Effect.suspend(() => {
    if (ledger.idle) return Effect.void
    const d = Deferred.makeUnsafe<void>()
    idleWaiters.push(d)
    // A drain that times out must not leave its Deferred behind.
    return Deferred.await(d).pipe(
      Effect.onInterrupt(() =>
        Effect.sync(() => {
          idleWaiters = idleWaiters.filter((x) => x !== d)
        })
      )
    )
  })

  return Admission.of({
    acquire: acquireWithin(undefined),
    acquireWithin,
    observe: (kind, ms) => times.record(kind, ms),
    inflight: Effect.sync(() => ledger.inflight),
    queued: Effect.sync(() => ledger.queued),
    stats: Effect.sync(() => ({ ...ledger.stats(), needMs: times.snapshot() })),
    close,
    refuseDraining: () => {
      ledger.refuseDraining()
      return new Draining()
    },
    awaitIdle
  })
}

/** Admission with explicit limits (tests, embedding). */
export const layerWith = (limits: AdmissionLimits): Layer.Layer<Admission> => Layer.sync(Admission, () => make(limits))

/** Admission from `[agent].max_inflight` and `[agent].max_queue`; its refusals in /metrics when Metrics is there. */
export const layer: Layer.Layer<Admission, never, Config> = Layer.effect(
  Admission,
  Effect.gen(function* () {
    const config = yield* Config
    const admission = make({ maxInflight: config.agent.max_inflight, maxQueue: config.agent.max_queue })
    const metrics = yield* Effect.serviceOption(Metrics)
    if (metrics._tag === "Some") yield* registerMetrics(metrics.value, admission.stats)
    return admission
  })
)
