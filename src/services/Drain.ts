/**
 * Drain: the trigger of the ordered drain (SIGTERM, SIGINT, POST /drain all pull the same lever).
 * Only the interface lives here; the lead's main program implements the ordered steps. `layerTest`
 * records the start and completes at once, for tests of the callers (admin HTTP, signal handling).
 */
import { Context, Deferred, Effect, Layer } from "effect"

export interface DrainService {
  /** Begins the drain and returns at once; idempotent (a second call changes nothing). */
  readonly start: Effect.Effect<void>
  /** True once a drain has begun. */
  readonly draining: Effect.Effect<boolean>
  /** Completes when a drain has begun (at once if it has): NodeStatus turns it into a `changes` event. */
  readonly awaitStarted: Effect.Effect<void>
  /** Completes when the drain has finished (engine stopped, lease revoked). */
  readonly awaitDone: Effect.Effect<void>
}

export class Drain extends Context.Service<Drain, DrainService>()("cgn-agent/Drain") {
  /** A drain that does nothing but remember it started; `awaitDone` completes right after `start`. */
  static readonly layerTest: Layer.Layer<Drain> = Layer.effect(
    Drain,
    Effect.gen(function* () {
      const started = yield* Deferred.make<void>()
      const done = yield* Deferred.make<void>()
      return {
        start: Deferred.succeed(started, undefined).pipe(
          Effect.andThen(Deferred.succeed(done, undefined)),
          Effect.asVoid
        ),
        draining: Deferred.isDone(started),
        awaitStarted: Deferred.await(started),
        awaitDone: Deferred.await(done)
      }
    })
  )
}
