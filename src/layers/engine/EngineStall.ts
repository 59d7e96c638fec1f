/**
 * The live EngineStall: a SubscriptionRef written by the engine's watch (engineWatch.ts: what the Generate stall
 * watchdog saw of the calls, and the test completion of an idle engine) and by the engine's metrics scrapes (their progress counters: EngineProgress.ts), cleared when
 * the supervisor starts a new engine run (a restarted engine has not stalled). The node's becoming stalled is logged (a warning with the reason) and so is its end (info,
 * with what ended it). An engine still stalled engine.stall_restart_after after it was taken as stalled is restarted
 * through EngineProcess.restart: a wedged engine (a hung collective, a scheduler stuck in a loop) often still answers
 * its health endpoint, so liveness alone never ends it, and SGLang's own watchdog likewise ends a server whose
 * forward pass hangs (python/sglang/srt/server_args.py watchdog_timeout, 300 s). Not while a stream older than the
 * stall still moves (stallRestartAt), nor during a drain, which stops the engine itself. A proxied server
 * (openai_compat) is not the agent's to restart.
 * The same holds for an engine taken as failing calls (services/engine/FailedCalls.ts): the watchdog reports the calls
 * the engine failed each tick, counted here in a row (a plain variable: it changes with every call) until a call or
 * the agent's test completes; the run reaching engine.failed_calls_unhealthy is a new source of the state, counted in
 * cgn_agent_engine_call_failure_streaks_total. Its trips are damped (services/engine/FlapDamping.ts, a plain variable
 * too): taken as failing again and again, it is held so (cgn_agent_engine_failing_holds_total) until the penalty has
 * decayed, and then cleared at once if calls or the test completed meanwhile.
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
  onFailing,
  onlyFailing,
  onNoProgress,
  onProgress,
  onStall,
  onTestFailed,
  type StallState,
  stallProblem,
  stallRestartAt,
  stallStart,
  withFailing
} from "../../services/engine/EngineStall.ts"
import { addFailed, type FailedRun, failingCleared, failingProblem } from "../../services/engine/FailedCalls.ts"
import {
  aboutUntil,
  type Damping,
  isHeld,
  onClear,
  onFailedRun,
  onRelease,
  onTrip,
  releaseAt,
  undamped
} from "../../services/engine/FlapDamping.ts"
import { Drain } from "../../services/node/Drain.ts"
import { Metrics } from "../../services/observability/Metrics.ts"
import { background, RESTART } from "../observability/backgroundFiber.ts"

/** How often a restart held back for an owed clear looks again whether it still is (the watchdog's tick). */
const OWED_RECHECK_MS = 1_000

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
    // Calls the engine failed since a call (or the agent's test) last completed (FailedCalls.ts).
    let failedRun: FailedRun | undefined
    // The failing state's flap damping (FlapDamping.ts): a new run starts without a penalty.
    let damping: Damping = undamped
    // Each follower below subscribes again after a defect (the streams start with the current state): said, not silent.
    const followed = (what: string, stops: string) => background(what, stops, { restart: RESTART })
    yield* Stream.runForEach(engine.changes, (s) =>
      s._tag === "Starting"
        ? Effect.suspend(() => {
            watch = noWatch
            ranks.clear()
            failedRun = undefined
            damping = undamped
            clearedBy = "a new engine run started"
            return SubscriptionRef.set(ref, noStall)
          })
        : Effect.void
    ).pipe(followed("the stall state's run follower", "a new engine run no longer clears a stall"), Effect.forkScoped)

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
    const failedCallsUnhealthy = config.engine.failed_calls_unhealthy
    const metrics = Option.getOrUndefined(yield* Effect.serviceOption(Metrics))
    const streaks = metrics?.engineCallFailureStreaks.labels({ model: config.model.served_name })
    streaks?.inc(0) // a series from the start, so increase() sees the first streak (StallWatchdog.ts says why)
    const holds = metrics?.engineFailingHolds.labels({ model: config.model.served_name })
    holds?.inc(0)

    // One line when the node becomes stalled (from any source) and one when that ends; /readyz and NodeHealth say
    // it all along, but an operator reading the log saw nothing until the restart. Failing calls that begin while the
    // engine is already stalled get their own line; the end says "failing calls" when no stall source took part.
    let stalledAt: number | undefined
    let wasFailing = false
    let wedged = false
    yield* SubscriptionRef.changes(ref).pipe(
      Stream.runForEach((s) =>
        Effect.gen(function* () {
          const stalled = isStalled(s)
          const failing = s.failing
          if (stalled && stalledAt === undefined) {
            stalledAt = yield* now
            yield* Effect.logWarning(`the node is unhealthy: ${stallProblem(s, idleTimeout)}`, {
              restart_after: restartIn
            })
          } else if (failing !== undefined && !wasFailing) {
            yield* Effect.logWarning(`the node is unhealthy: ${failingProblem(failing)}`, { restart_after: restartIn })
          }
          wasFailing = failing !== undefined
          if (stalled) wedged ||= isStalled({ ...s, failing: undefined })
          else if (stalledAt !== undefined) {
            const lasted = Duration.format(Duration.millis((yield* now) - stalledAt))
            stalledAt = undefined
            const what = wedged ? "stalled" : "failing calls"
            wedged = false
            yield* Effect.logInfo(`the engine is no longer ${what}: ${clearedBy}`, { stalled_for: lasted })
          }
        })
      ),
      followed("the stall log", "the node's becoming stalled and its end are no longer logged"),
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
                // An engine held for flapping whose calls or test completed since (a clear owed, FlapDamping.ts) has
                // recovered: the hold's end clears it, a restart would cut its calls. Looked at again each second: a
                // run of calls failed meanwhile (a re-trip) takes the clear back, and then it is restarted.
                if (wait <= 0 && !(onlyFailing(s) && damping.owed)) return yield* restart(s)
                yield* Effect.sleep(wait > 0 ? wait : OWED_RECHECK_MS)
              }
            })
          )
    if (afterMs > 0 && engine.plan.spawns)
      yield* SubscriptionRef.changes(ref).pipe(
        Stream.switchMap(restartWhenDue),
        Stream.runDrain,
        followed("the stall restart", "a stalled engine is no longer restarted (engine.stall_restart_after)"),
        Effect.forkScoped
      )

    // A hold for flapping ends when the penalty has decayed (re-trips move that on: read again after each sleep); the
    // clear owed from meanwhile is given then, else the engine stays failing until calls or the test clear it.
    // Whether it is done: false when a re-trip moved the end on meanwhile (the loop waits again).
    const release = (at: number): Effect.Effect<boolean> =>
      Effect.suspend(() => {
        if (isHeld(damping, at)) return Effect.succeed(false)
        const [clear, after] = onRelease(damping, at)
        damping = after
        // Read and written in one step (the ref's own lock): an engine run that starts meanwhile (noStall) is never
        // overwritten with the last run's failing state.
        const ended = SubscriptionRef.modifySome(ref, (s): readonly [boolean, Option.Option<StallState>] => {
          const failing = s.failing
          if (failing?.heldUntil === undefined) return [false, Option.none()]
          if (clear) clearedBy = "its hold for flapping ended, calls or the test having completed meanwhile"
          const { heldUntil: _, ...unheld } = failing
          return [!clear, Option.some(withFailing(s, clear ? undefined : unheld))]
        })
        // uninterruptible: the new state ends this fiber (switchMap) once the line is out
        return Effect.flatMap(ended, (stillFailing) =>
          stillFailing
            ? Effect.logInfo(
                "the engine's hold for flapping ended: still failing calls until calls or the test complete"
              )
            : Effect.void
        ).pipe(Effect.as(true))
      }).pipe(Effect.uninterruptible)
    const releaseWhenDue = (s: StallState) =>
      s.failing?.heldUntil === undefined
        ? Stream.empty
        : Stream.fromEffect(
            Effect.gen(function* () {
              for (;;) {
                const t = yield* now
                const at = releaseAt(damping)
                if (at === undefined) return
                if (t < at) yield* Effect.sleep(at - t)
                else if (yield* release(t)) return
              }
            })
          )
    yield* SubscriptionRef.changes(ref).pipe(
      Stream.switchMap(releaseWhenDue),
      Stream.runDrain,
      followed("the flapping hold's release", "a hold for flapping no longer ends"),
      Effect.forkScoped
    )

    /** Applies `f` when it changes the state; `cause` names what cleared a stall, for the log line. */
    const change = (f: (s: StallState) => StallState | undefined, cause?: string) =>
      // read and written in one step (the ref's own lock), as `release`
      SubscriptionRef.updateSome(ref, (s) => {
        const next = f(s)
        if (next === undefined) return Option.none()
        if (cause !== undefined) clearedBy = cause
        return Option.some(next)
      })

    return EngineStall.of({
      stalled: (now, streams) => SubscriptionRef.update(ref, (s) => onStall(s, now, streams)),
      completed: (now, cause, everyRank, inRow) =>
        change((s) => {
          // a completion ends the run of failed calls, whether or not it clears anything
          failedRun = undefined
          // calls (no cause: not the agent's test) clear failing calls only once enough completed in a row
          let keepFailing = cause === undefined && inRow !== undefined && !failingCleared(inRow, failedCallsUnhealthy)
          if (!keepFailing && s.failing !== undefined) {
            // held for flapping: not now, owed for the hold's end
            const cleared = onClear(damping, now)
            if (cleared !== true) {
              damping = cleared
              keepFailing = true
            }
          }
          const next = onCompleted(s, now, everyRank, keepFailing)
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
      callsFailed: (at, calls, last) =>
        Effect.suspend(() => {
          const [run, failing] = addFailed(failedRun, calls, last, failedCallsUnhealthy, at)
          failedRun = run
          if (failing === undefined) return Effect.void
          return change((s) => {
            if (s.failing !== undefined) {
              // already failing: a re-trip while held moves its end on (the reason's at most once a minute)
              const retrip = onFailedRun(damping, at)
              if (retrip === undefined) return undefined
              damping = retrip
              const heldUntil = aboutUntil(retrip)
              return heldUntil === s.failing.heldUntil ? undefined : withFailing(s, { ...s.failing, heldUntil })
            }
            damping = onTrip(damping, at)
            const held = isHeld(damping, at)
            const next = onFailing(s, held ? { ...failing, heldUntil: aboutUntil(damping) } : failing)
            if (next !== undefined) {
              streaks?.inc()
              if (held) holds?.inc()
            }
            return next
          })
        }),
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
