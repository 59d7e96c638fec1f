/**
 * The live Drain: the lever SIGTERM, SIGINT and POST /drain all pull. It only records that a drain
 * began and when it finished; the ordered steps themselves are the daemon's (programs/main.ts), which
 * awaits `awaitStarted`, runs them, then calls `DrainControl.markDone`.
 */
import { Context, Deferred, Effect, Layer } from "effect"
import { Drain } from "../services/Drain.ts"

/** The daemon's side of the lever: declares the drain finished. */
export class DrainControl extends Context.Service<DrainControl, { readonly markDone: Effect.Effect<void> }>()(
  "cgn-agent/DrainControl"
) {}

/** Drain and its control, sharing one pair of deferreds. */
export const layer: Layer.Layer<Drain | DrainControl> = Layer.effectContext(
  Effect.gen(function* () {
    const started = yield* Deferred.make<void>()
    const done = yield* Deferred.make<void>()
    const drain = Drain.of({
      start: Effect.asVoid(Deferred.succeed(started, undefined)),
      draining: Deferred.isDone(started),
      awaitStarted: Deferred.await(started),
      awaitDone: Deferred.await(done)
    })
    const control = DrainControl.of({ markDone: Effect.asVoid(Deferred.succeed(done, undefined)) })
    return Context.make(Drain, drain).pipe(Context.add(DrainControl, control))
  })
)
