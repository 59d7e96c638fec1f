/**
 * Live Admission: drives the pure AdmissionLedger with fibers. A queued caller waits on its own Deferred; a
 * releasing holder hands its slot to the oldest waiter and completes that Deferred. All ledger updates run
 * synchronously inside uninterruptible regions, so an interruption at any point leaks neither a slot nor a
 * queue entry. `layer` reads `[agent].max_inflight` / `max_queue`; `layerWith` takes the limits (tests).
 */
import { Clock, Deferred, Effect, Layer, Scope } from "effect"
import { Config } from "../../services/config/Config.ts"
import {
  Admission,
  AdmissionLedger,
  type AdmissionService,
  Draining,
  Overloaded
} from "../../services/grpc/Admission.ts"

interface Waiter {
  readonly wake: Deferred.Deferred<void, Draining>
  /** Set by whoever takes the waiter out of the queue, read by the waiter when it is interrupted. */
  outcome: "queued" | "admitted" | "rejected"
}

export interface AdmissionLimits {
  readonly maxInflight: number
  readonly maxQueue: number
}

/** An Admission service over fresh counters. */
export const make = (limits: AdmissionLimits): AdmissionService => {
  const ledger = new AdmissionLedger<Waiter>(limits.maxInflight, limits.maxQueue)
  let idleWaiters: Array<Deferred.Deferred<void>> = []

  const notifyIfIdle = (): void => {
    if (!ledger.idle || idleWaiters.length === 0) return
    const waiting = idleWaiters
    idleWaiters = []
    for (const d of waiting) Deferred.doneUnsafe(d, Effect.void)
  }

  // Synchronous so that no interruption can fall between the ledger update and the wake-up.
  const releaseSlot = (): void => {
    const next = ledger.release()
    if (next === undefined) {
      notifyIfIdle()
      return
    }
    next.outcome = "admitted"
    Deferred.doneUnsafe(next.wake, Effect.void)
  }

  // The common case, a free slot, is one synchronous step: no generator and no log event per call (measured
  // with bench/per-call.ts: ~6% of the agent's CPU per call). Queueing and refusals are logged at debug.
  const logged = (outcome: string) =>
    Effect.logDebug("admission", { outcome, inflight: ledger.inflight, queued: ledger.queued })
  const admittedAt = (scope: Scope.Scope) =>
    Effect.as(Scope.addFinalizer(scope, Effect.sync(releaseSlot)), { queuedMs: 0 })

  const waitInQueue = (
    restore: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>,
    scope: Scope.Scope,
    waiter: Waiter,
    start: number
  ) =>
    restore(Deferred.await(waiter.wake)).pipe(
      Effect.onInterrupt(() =>
        Effect.sync(() => {
          if (ledger.cancel(waiter)) notifyIfIdle()
          else if (waiter.outcome === "admitted") releaseSlot()
        })
      ),
      Effect.andThen(Scope.addFinalizer(scope, Effect.sync(releaseSlot))),
      Effect.andThen(Clock.currentTimeMillis),
      Effect.map((now) => ({ queuedMs: now - start }))
    )

  const acquire: AdmissionService["acquire"] = Effect.uninterruptibleMask((restore) =>
    Effect.flatMap(Scope.Scope, (scope) =>
      Effect.flatMap(Clock.currentTimeMillis, (start): Effect.Effect<{ queuedMs: number }, Overloaded | Draining> => {
        const waiter: Waiter = { wake: Deferred.makeUnsafe<void, Draining>(), outcome: "queued" }
        const entered = ledger.enter(waiter)
        switch (entered) {
          case "admitted":
            return admittedAt(scope)
          case "overloaded":
            return Effect.andThen(
              logged(entered),
              Effect.fail(new Overloaded({ maxInflight: ledger.maxInflight, maxQueue: ledger.maxQueue }))
            )
          case "draining":
            return Effect.andThen(logged(entered), Effect.fail(new Draining()))
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
    acquire,
    inflight: Effect.sync(() => ledger.inflight),
    queued: Effect.sync(() => ledger.queued),
    stats: Effect.sync(() => ledger.stats()),
    close,
    awaitIdle
  })
}

/** Admission with explicit limits (tests, embedding). */
export const layerWith = (limits: AdmissionLimits): Layer.Layer<Admission> => Layer.sync(Admission, () => make(limits))

/** Admission from `[agent].max_inflight` and `[agent].max_queue`. */
export const layer: Layer.Layer<Admission, never, Config> = Layer.effect(
  Admission,
  Effect.map(Config, (config) => make({ maxInflight: config.agent.max_inflight, maxQueue: config.agent.max_queue }))
)
