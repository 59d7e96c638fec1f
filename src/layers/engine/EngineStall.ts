/**
 * The live EngineStall: a SubscriptionRef written by the Generate stall watchdog, cleared when the supervisor
 * starts a new engine run (a restarted engine has not stalled). An engine still stalled engine.stall_restart_after
 * after it was taken as stalled is restarted through EngineProcess.restart: a wedged engine (a hung collective, a
 * scheduler stuck in a loop) often still answers its health endpoint, so liveness alone never ends it, and SGLang's
 * own watchdog likewise ends a server whose forward pass hangs (python/sglang/srt/server_args.py
 * watchdog_timeout, 300 s). Not while a stream older than the stall still moves (stallRestartAt), nor during a drain,
 * which stops the engine itself. A proxied server (openai_compat) is not the agent's to restart.
 */
import { Clock, Duration, Effect, Layer, Option, Stream, SubscriptionRef } from "effect"
import { Config } from "../../services/config/Config.ts"
import { EngineProcess } from "../../services/engine/EngineProcess.ts"
import {
  EngineStall,
  isStalled,
  noStall,
  onCompleted,
  onStall,
  type StallState,
  stallProblem,
  stallRestartAt
} from "../../services/engine/EngineStall.ts"
import { Drain } from "../../services/node/Drain.ts"

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
    const idleMs = Duration.toMillis(config.engine.stream_idle_timeout)
    const idleTimeout = Duration.format(config.engine.stream_idle_timeout)
    // optional: a drain stops the engine itself once its calls are done; a restart would only cut them short
    const drain = Option.getOrUndefined(yield* Effect.serviceOption(Drain))
    // When a stream older than the stall last read from the engine (a plain variable: it changes every watchdog tick
    // while streams move, and must not wake the state's subscribers).
    let preStallMovedAt: number | undefined
    const now = Clock.currentTimeMillis
    const restart = (s: StallState) =>
      Effect.gen(function* () {
        if (drain !== undefined && (yield* drain.draining)) return
        const reason = `${stallProblem(s, idleTimeout)}, for ${Duration.format(config.engine.stall_restart_after)} (engine.stall_restart_after)`
        if ((yield* engine.restart("stall", reason)) === "restarting")
          yield* Effect.logError(`restarting the engine: ${reason}`)
      }).pipe(Effect.uninterruptible) // the request and its log line together: a state change now must not split them
    // Each change replaces the pending restart: a completion (the stall cleared) or a new run cancels it.
    const restartWhenDue = (s: StallState) =>
      stallRestartAt(s, afterMs) === undefined
        ? Stream.empty
        : Stream.fromEffect(
            Effect.gen(function* () {
              for (;;) {
                const at = stallRestartAt(s, afterMs, idleMs, preStallMovedAt)
                if (at === undefined) return
                const wait = at - (yield* now)
                if (wait <= 0) return yield* restart(s)
                yield* Effect.sleep(wait)
              }
            })
          )
    if (afterMs > 0 && engine.plan.spawns)
      yield* SubscriptionRef.changes(ref).pipe(Stream.switchMap(restartWhenDue), Stream.runDrain, Effect.forkScoped)

    return EngineStall.of({
      stalled: (now) => SubscriptionRef.update(ref, (s) => onStall(s, now)),
      completed: (now) =>
        Effect.flatMap(SubscriptionRef.get(ref), (s) => {
          const next = onCompleted(s, now)
          return next === undefined ? Effect.void : SubscriptionRef.set(ref, next)
        }),
      moved: (at, oldestSince) =>
        Effect.flatMap(SubscriptionRef.get(ref), (s) =>
          Effect.sync(() => {
            if (isStalled(s) && s.stalledSince !== undefined && oldestSince < s.stalledSince) preStallMovedAt = at
          })
        ),
      state: SubscriptionRef.get(ref),
      changes: SubscriptionRef.changes(ref)
    })
  })
)
