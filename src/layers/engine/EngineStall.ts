/**
 * The live EngineStall: a SubscriptionRef written by the Generate stall watchdog (its streams, and its test completion
 * of an idle engine) and by the engine's metrics scrapes (their progress counters: EngineProgress.ts), cleared when
 * the supervisor starts a new engine run (a restarted engine has not stalled). The node's becoming stalled is logged (a warning with the reason) and so is its end (info,
 * with what ended it). An engine still stalled engine.stall_restart_after after it was taken as stalled is restarted
 * through EngineProcess.restart: a wedged engine (a hung collective, a scheduler stuck in a loop) often still answers
 * its health endpoint, so liveness alone never ends it, and SGLang's own watchdog likewise ends a server whose
 * forward pass hangs (python/sglang/srt/server_args.py watchdog_timeout, 300 s). Not while a stream older than the
 * stall still moves (stallRestartAt), nor during a drain, which stops the engine itself. A proxied server
 * (openai_compat) is not the agent's to restart.
 */
import { Clock, Duration, Effect, Layer, Option, Stream, SubscriptionRef } from "effect"
import { Config } from "../../services/config/Config.ts"
import { EngineProcess } from "../../services/engine/EngineProcess.ts"
import { noWatch, observeProgress, type ProgressWatch } from "../../services/engine/EngineProgress.ts"
import {
  EngineStall,
  isStalled,
  noStall,
  onCompleted,
  onNoProgress,
  onProgress,
  onStall,
  onTestFailed,
  type StallState,
  stallProblem,
  stallRestartAt,
  stallStart
} from "../../services/engine/EngineStall.ts"
import { Drain } from "../../services/node/Drain.ts"

export const layer: Layer.Layer<EngineStall, never, EngineProcess | Config> = Layer.effect(
  EngineStall,
  Effect.gen(function* () {
    const engine = yield* EngineProcess
    const config = yield* Config
    const ref = yield* SubscriptionRef.make<StallState>(noStall)
    // The progress rule's memory between scrapes, and what ended the last stall (for its log line): plain variables,
    // they change with every scrape or clear and must not wake the state's subscribers.
    let watch: ProgressWatch = noWatch
    let clearedBy = "a call completed"
    // Per data-parallel rank: its last figure (ProgressReading.ranks) and the scrape that last saw it change.
    const ranks = new Map<string, { readonly value: number; readonly changedAt: number | undefined }>()
    yield* Stream.runForEach(engine.changes, (s) =>
      s._tag === "Starting"
        ? Effect.suspend(() => {
            watch = noWatch
            ranks.clear()
            clearedBy = "a new engine run started"
            return SubscriptionRef.set(ref, noStall)
          })
        : Effect.void
    ).pipe(Effect.forkScoped)

    const afterMs = Duration.toMillis(config.engine.stall_restart_after)
    const idleMs = Duration.toMillis(config.engine.stream_idle_timeout)
    const idleTimeout = Duration.format(config.engine.stream_idle_timeout)
    const restartIn = afterMs > 0 && engine.plan.spawns ? Duration.format(config.engine.stall_restart_after) : "never"
    // optional: a drain stops the engine itself once its calls are done; a restart would only cut them short
    const drain = Option.getOrUndefined(yield* Effect.serviceOption(Drain))
    // When a stream older than the stall last read from the engine (a plain variable: it changes every watchdog tick
    // while streams move, and must not wake the state's subscribers).
    let preStallMovedAt: number | undefined
    const now = Clock.currentTimeMillis

    // One line when the node becomes stalled (from either source) and one when that ends; /readyz and NodeHealth say
    // it all along, but an operator reading the log saw nothing until the restart.
    let stalledAt: number | undefined
    yield* SubscriptionRef.changes(ref).pipe(
      Stream.runForEach((s) =>
        Effect.gen(function* () {
          const stalled = isStalled(s)
          if (stalled && stalledAt === undefined) {
            stalledAt = yield* now
            yield* Effect.logWarning(`the node is unhealthy: ${stallProblem(s, idleTimeout)}`, {
              restart_after: restartIn
            })
          } else if (!stalled && stalledAt !== undefined) {
            const lasted = Duration.format(Duration.millis((yield* now) - stalledAt))
            stalledAt = undefined
            yield* Effect.logInfo(`the engine is no longer stalled: ${clearedBy}`, { stalled_for: lasted })
          }
        })
      ),
      Effect.forkScoped
    )

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

    /** Applies `f` when it changes the state; `cause` names what cleared a stall, for the log line. */
    const change = (f: (s: StallState) => StallState | undefined, cause?: string) =>
      Effect.flatMap(SubscriptionRef.get(ref), (s) => {
        const next = f(s)
        if (next === undefined) return Effect.void
        if (cause !== undefined) clearedBy = cause
        return SubscriptionRef.set(ref, next)
      })

    return EngineStall.of({
      stalled: (now) => SubscriptionRef.update(ref, (s) => onStall(s, now)),
      completed: (now, cause, everyRank) =>
        change((s) => {
          const next = onCompleted(s, now, everyRank)
          // a completion is progress: the counters' run of stillness starts over
          if (next !== undefined) watch = { baseline: watch.baseline, stillSince: undefined }
          return next
        }, cause ?? "a call completed"),
      moved: (at, oldestSince) =>
        Effect.flatMap(SubscriptionRef.get(ref), (s) =>
          Effect.sync(() => {
            const start = stallStart(s)
            if (start !== undefined && oldestSince < start) preStallMovedAt = at
          })
        ),
      testFailed: (failure) => change((s) => onTestFailed(s, failure)),
      rankMoved: (rank, since) => Effect.sync(() => (ranks.get(String(rank))?.changedAt ?? -1) >= since),
      scraped: (reading) =>
        Effect.suspend(() => {
          for (const [rank, value] of Object.entries(reading?.ranks ?? {})) {
            const last = ranks.get(rank)
            if (last === undefined || last.value !== value)
              ranks.set(rank, { value, changedAt: last === undefined ? undefined : reading?.at })
          }
          const [next, verdict] = observeProgress(watch, reading, idleMs)
          watch = next
          switch (verdict._tag) {
            case "Moved":
              return change(onProgress, "the engine's progress counters moved")
            case "Stuck":
              return change((s) =>
                onNoProgress(s, { since: reading?.at ?? verdict.since, held: verdict.held, counters: verdict.counters })
              )
            default:
              return Effect.void
          }
        }),
      state: SubscriptionRef.get(ref),
      changes: SubscriptionRef.changes(ref)
    })
  })
)
