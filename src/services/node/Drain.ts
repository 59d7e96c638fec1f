/**
 * Drain: the lever of the ordered drain (SIGTERM, SIGINT and POST /drain all pull it). It only records
 * that a drain began; the daemon (programs/main.ts) awaits that and runs the ordered steps. The one
 * implementation is a deferred, so tests use it as it is (`Drain.layer`).
 */
import { Context, Deferred, Effect, Layer } from "effect"

export interface DrainService {
  /**
   * Begins the drain and returns at once; idempotent (a second call changes nothing). True for the one call that
   * began it: two POST /drain at once must not both answer `alreadyDraining: false`, which a read before the
   * start could not rule out.
   */
  readonly start: Effect.Effect<boolean>
  /** True once a drain has begun. */
  readonly draining: Effect.Effect<boolean>
  /** Completes when a drain has begun (at once if it has): NodeStatus turns it into a `changes` event. */
  readonly awaitStarted: Effect.Effect<void>
}

export class Drain extends Context.Service<Drain, DrainService>()("cgn-agent/Drain") {
  static readonly layer: Layer.Layer<Drain> = Layer.effect(
    Drain,
    Effect.map(Deferred.make<void>(), (started) => ({
      start: Deferred.succeed(started, undefined),
      draining: Deferred.isDone(started),
      awaitStarted: Deferred.await(started)
    }))
  )
}
