/**
 * The live EngineStall: a SubscriptionRef written by the Generate stall watchdog, cleared when the supervisor
 * starts a new engine run (a restarted engine has not stalled). An engine still stalled engine.stall_restart_after
 * after it was taken as stalled is restarted through EngineProcess.restart: a wedged engine (a hung collective, a
 * scheduler stuck in a loop) often still answers its health endpoint, so liveness alone never ends it, and SGLang's
 * own watchdog likewise ends a server whose forward pass hangs (python/sglang/srt/server_args.py
 * watchdog_timeout, 300 s). A proxied server (openai_compat) is not the agent's to restart.
 */
import { Clock, Duration, Effect, Layer, Stream, SubscriptionRef } from "effect"
import { Config } from "../../services/config/Config.ts"
import { EngineProcess } from "../../services/engine/EngineProcess.ts"
import {
  EngineStall,
  noStall,
  onCompleted,
  onStall,
  type StallState,
  stallProblem,
  stallRestartAt
} from "../../services/engine/EngineStall.ts"

export const layer: Layer.Layer<EngineStall, never, EngineProcess | Config> = Layer.effect(
  EngineStall,
  Effect.gen(function* () {
    const engine = yield* EngineProcess
    const config = yield* Config
    const ref = yield* SubscriptionRef.make<StallState>(noStall)
    yield* Stream.runForEach(engine.changes, (s) =>
      s._tag === "Starting" ? SubscriptionRef.set(ref, noStall) : Effect.void
    ).pipe(Effect.forkScoped)

    const afterMs = Duration.toMillis(config.engine.stall_restart_after)
    const idleTimeout = Duration.format(config.engine.stream_idle_timeout)
    // Each change replaces the pending restart: a completion (the stall cleared) or a new run cancels it.
    const restartWhenDue = (s: StallState) => {
      const at = stallRestartAt(s, afterMs)
      if (at === undefined) return Stream.empty
      return Stream.fromEffect(
        Effect.gen(function* () {
          yield* Effect.sleep(Math.max(0, at - (yield* Clock.currentTimeMillis)))
          const reason = `${stallProblem(s, idleTimeout)}, for ${Duration.format(config.engine.stall_restart_after)} (engine.stall_restart_after)`
          const outcome = yield* engine.restart("stall", reason)
          if (outcome === "restarting") yield* Effect.logError(`restarting the engine: ${reason}`)
        })
      )
    }
    if (afterMs > 0 && engine.plan.spawns)
      yield* SubscriptionRef.changes(ref).pipe(Stream.switchMap(restartWhenDue), Stream.runDrain, Effect.forkScoped)

    return EngineStall.of({
      stalled: (now) => SubscriptionRef.update(ref, (s) => onStall(s, now)),
      completed: (now) =>
        Effect.flatMap(SubscriptionRef.get(ref), (s) => {
          const next = onCompleted(s, now)
          return next === undefined ? Effect.void : SubscriptionRef.set(ref, next)
        }),
      state: SubscriptionRef.get(ref),
      changes: SubscriptionRef.changes(ref)
    })
  })
)
