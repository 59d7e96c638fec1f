/**
 * The live EngineProcess: one supervisor fiber per agent runs the engine plan run after run (runOnce.ts: spawn
 * through the EngineHost, readiness within the startup budget, liveness with a failure threshold) and restarts
 * with backoff; it is the only writer of the state, which it derives through the pure table in
 * services/engine/EngineState.ts. `stop` (and closing the layer's scope) asks that fiber to stop; it tears the run
 * down and settles in Stopped. openai_compat (plan.spawns = false) runs the same loop with nothing spawned.
 * Every time is Effect's Clock and every wait Effect.sleep: with a fake EngineHost a TestClock drives it all.
 */
import { Clock, Deferred, Effect, Fiber, Layer, Option, Ref, Result, SubscriptionRef } from "effect"
import { Config } from "../../services/config/Config.ts"
import { EnginePlan, type LaunchPlan } from "../../services/engine/Engine.ts"
import { EngineHost } from "../../services/engine/EngineHost.ts"
import {
  EngineProcess,
  type EngineProcessError,
  type EngineState,
  type ExitRecord,
  fromRefs,
  type RestartOutcome,
  type RestartRequest,
  type RestartSource,
  RestartSources
} from "../../services/engine/EngineProcess.ts"
import {
  describeExit,
  Event,
  exitLogLevel,
  failingReason,
  nextRestart,
  noRestartYet,
  readyAfterFailuresMessage,
  State,
  type SupervisorEvent,
  stateChangeMessage,
  transition
} from "../../services/engine/EngineState.ts"
import { GpuGate } from "../../services/engine/GpuGate.ts"
import { AgentShortage } from "../../services/node/AgentShortage.ts"
import { MemoryCgroup } from "../../services/node/MemoryCgroup.ts"
import { Metrics } from "../../services/observability/Metrics.ts"
import { background } from "../observability/backgroundFiber.ts"
import { holdStateDir } from "../stateDir/stateLock.ts"
import { cpuCacheReport } from "./cpuCache.ts"
import { reclaim } from "./pidFile.ts"
import { keepExit, type Lingering, type RunRefs, runOnce } from "./runOnce.ts"
import { type SupervisorSettings, settingsFromConfig } from "./supervisorSettings.ts"
import type { Supervision } from "./watch.ts"

export { type SupervisorSettings, settingsFromConfig } from "./supervisorSettings.ts"

const LOG_TAIL = 10

/** A transition to log: a string for an ignored event (debug), else the states before and after. */
type StateLog = string | { readonly from: EngineState; readonly to: EngineState }

/**
 * The state's fields as log fields: nested values stay JSON, the exit's last lines (already logged) are left out, and
 * so is a Starting state's `failing`: it is news on the change to Restarting, logged beside each failed run's error
 * line; on the Starting lines of every attempt (spawning, loading, waiting for port) it was the same ~400 characters
 * again, three times per attempt of a crash loop. A run's end as data is the reason beside it in words: an Unhealthy
 * `ending` is logged as its kind alone, an exit's `endedBy` not at all.
 */
const stateFields = (state: EngineState): Record<string, unknown> => {
  const { _tag, ...all } = state as EngineState & Record<string, unknown>
  const { failing: _failing, ...rest } = all
  const fields = _tag === "Starting" ? rest : all
  const ending = fields.ending as { readonly kind: string } | undefined
  if (ending !== undefined) return { ...fields, ending: ending.kind }
  const lastExit = fields.lastExit as Record<string, unknown> | undefined
  if (lastExit === undefined) return fields
  const { lastLines: _, endedBy: _endedBy, ...exit } = lastExit
  return { ...fields, lastExit: exit }
}

/** Builds the supervisor for a plan; fails only when the start is refused (another agent, busy port, state dir). */
export const make = Effect.fn("EngineProcess.make")(function* (plan: LaunchPlan, settings: SupervisorSettings) {
  const now = Clock.currentTimeMillis
  const host = yield* EngineHost
  for (const warning of plan.warnings ?? []) yield* Effect.logWarning(warning)
  if (plan.spawns) {
    // Held for the supervisor's lifetime and released last (acquired first): after the stop below has torn the
    // engine down and removed its pid file. Only the holder may read and act on the pid file.
    yield* holdStateDir(settings.stateDir)
    yield* reclaim(plan, settings.stateDir, settings.stopGraceMs)
  }
  // optional: no gate in tests that do not build one, or on a host without NVML it is open anyway
  const gate = yield* Effect.serviceOption(GpuGate)
  // optional too: without them (tests, a host without cgroups) exits say nothing about the OOM killer
  const memory = Option.getOrUndefined(yield* Effect.serviceOption(MemoryCgroup))
  // Said once at start, as `cgn-agent check` says it: a tier that outgrows the shared limit is killed every run.
  if (memory !== undefined && plan.cpuCache !== undefined) {
    const limit = yield* memory.limit
    const { size, warning } = yield* cpuCacheReport(plan, limit)
    if (warning !== undefined) yield* Effect.logWarning(warning)
    else if (size?.kind === "unknown" && typeof limit === "number")
      yield* Effect.logInfo(`the engine's CPU KV-cache tier is not checked against the memory limit: ${size.why}`)
  }
  const metrics = Option.getOrUndefined(yield* Effect.serviceOption(Metrics))
  // A proxied server is not started, only probed: each run, the first included, begins there.
  const firstPhase = plan.spawns ? "spawning" : "probing"

  const state = yield* SubscriptionRef.make<EngineState>(
    State.Starting({ phase: firstPhase, since: yield* now, run: 0 })
  )
  const refs: RunRefs = {
    exits: yield* Ref.make<ReadonlyArray<ExitRecord>>([]),
    currentPid: yield* Ref.make<number | undefined>(undefined),
    oomKillsTotal: metrics?.engineOomKills,
    lingering: yield* Ref.make<Lingering | undefined>(undefined)
  }
  const restarts = yield* Ref.make(0)
  // The runs in a row that ended before being stable when the current run began: its Ready ends that series (logged).
  const failedInARow = yield* Ref.make(0)
  const stopRequested = yield* Deferred.make<void>()
  const stopped = yield* Deferred.make<void>()

  const publish = (event: SupervisorEvent) =>
    SubscriptionRef.modifySome(state, (s): readonly [StateLog | undefined, Option.Option<EngineState>] => {
      const r = transition(s, event)
      if (Result.isFailure(r)) return [`ignored: ${r.failure.message}`, Option.none()]
      if (r.success === s) return [undefined, Option.none()]
      return [{ from: s, to: r.success }, Option.some(r.success)]
    }).pipe(Effect.flatMap(logChange))
  const logChange = (log: StateLog | undefined): Effect.Effect<void> => {
    if (log === undefined) return Effect.void
    if (typeof log === "string") return Effect.logDebug(log)
    const { from, to } = log
    const line = Effect.logInfo(stateChangeMessage(from, to), stateFields(to))
    // The one line that says a series of failed runs (a crash loop) is over: the state line alone only stops
    // carrying `failing`. Read and cleared here, so it is said once, by the run that made it.
    if (from._tag !== "Starting" || to._tag !== "Ready") return line
    return Effect.andThen(
      line,
      Effect.flatMap(Ref.getAndSet(failedInARow, 0), (failed) =>
        failed === 0
          ? Effect.void
          : Effect.logInfo(
              readyAfterFailuresMessage(to.run, failed, settings.backoff.crashLoopAfter, settings.backoff.stableAfterMs)
            )
      )
    )
  }
  const endReadyRun = yield* Ref.make<Deferred.Deferred<RestartRequest> | undefined>(undefined)
  // Set while the loop waits out a restart backoff: completing it (an operator's restart) ends the wait.
  const endBackoff = yield* Ref.make<Deferred.Deferred<RestartRequest> | undefined>(undefined)
  // optional: told of the probes the agent's host could not send (absent in tests that do not build it)
  const shortage = Option.getOrUndefined(yield* Effect.serviceOption(AgentShortage))
  const supervision: Supervision = { plan, settings, host, publish, memory, endReadyRun, shortage }
  const requested = metrics?.engineRestartRequests
  // 0 samples from the start, so that increase() sees the first request (prom-client writes a labelled series only
  // once it is incremented)
  for (const source of RestartSources) requested?.labels({ source }).inc(0)
  const restart = (source: RestartSource, reason: string): Effect.Effect<RestartOutcome> =>
    Effect.gen(function* () {
      if (!plan.spawns) return "not-spawned" as const
      const end = yield* Ref.get(endReadyRun)
      if (end !== undefined) return yield* Effect.as(Deferred.succeed(end, { source, reason }), "restarting" as const)
      // An operator who fixed a crash-looping engine (the model file put in place) retries now instead of waiting
      // out up to restart_backoff_max. Only an operator's: a stall restart is about a Ready run, never a backoff. A
      // run that is starting is not ended: it is already the attempt that picks the fix up.
      const wait = source === "admin" ? yield* Ref.get(endBackoff) : undefined
      if (wait !== undefined)
        return yield* Effect.as(Deferred.succeed(wait, { source, reason }), "backoff-ended" as const)
      return "not-ready" as const
    })

  const loop = Effect.gen(function* () {
    let previous = noRestartYet
    for (let run = 0; ; run++) {
      yield* Ref.set(failedInARow, previous.unstableRuns)
      const { record, readyAt } = yield* Effect.scoped(runOnce(supervision, refs, gate, run))
      yield* keepExit(refs, record)
      // counted here, once the request has ended the run (not when the engine's own exit or liveness won the race)
      const by = record.endedBy?.kind === "requested" ? record.endedBy.source : undefined
      if (by !== undefined) requested?.labels({ source: by }).inc()
      const next = nextRestart(settings.backoff, previous, readyAt, record.endedAt, by === "admin")
      previous = next
      const attempt = next.attempt
      const failing = failingReason(next, record)
      const nextAt = (yield* now) + next.delayMs
      // Set before the state says Restarting: a request from an operator who sees it finds the wait to end.
      const asked = yield* Deferred.make<RestartRequest>()
      yield* Ref.set(endBackoff, asked)
      yield* publish(Event.Exited({ exit: record, attempt, nextAt, ...(failing ? { failing } : {}) }))
      const tail = record.lastLines.slice(-LOG_TAIL).join("\n")
      const line =
        `${describeExit(record)}; restart attempt ${attempt} in ${next.delayMs} ms` +
        `${next.crashLoop ? " (crash loop)" : ""}${tail === "" ? "" : `; last lines:\n${tail}`}`
      yield* Effect.logWithLevel(exitLogLevel(record, failing))(line)
      // `previous` is kept: the next run's end counts on from this attempt, so retrying a still-broken engine does
      // not reset its backoff or its crash-loop count (only a stable run does). Not a restart request either (no run
      // was ended): engine_restart_requests_total stays as it is.
      const early = yield* Effect.raceFirst(
        Effect.as(Effect.sleep(next.delayMs), undefined),
        Deferred.await(asked)
      ).pipe(Effect.ensuring(Ref.set(endBackoff, undefined)))
      if (early !== undefined)
        yield* Effect.logInfo(
          `restart backoff ended ${Math.max(0, nextAt - (yield* now))} ms early: ${early.reason}; run ${run + 1} starts now`
        )
      yield* Ref.update(restarts, (n) => n + 1)
      yield* publish(Event.RestartDue({ run: run + 1, phase: firstPhase, at: yield* now }))
    }
  })

  const main = Effect.gen(function* () {
    // A defect of the loop (a bug) would leave the state where it was, "spawning" (or Ready, its run torn down by its
    // scope) for good, with nothing said. Not restarted: a new loop would not know the runs, their exits or the pid
    // file of the one that died. Said, and the state Stopped, which no router or probe takes as servable.
    const fiber = yield* Effect.forkChild(
      loop.pipe(
        background("the engine supervisor", "the engine is no longer supervised (restarts, liveness, stop)"),
        Effect.andThen(
          Effect.gen(function* () {
            yield* publish(Event.StopRequested({ at: yield* now }))
            const [last] = yield* Ref.get(refs.exits)
            yield* publish(Event.StopCompleted({ lastExit: last }))
          })
        )
      )
    )
    yield* Deferred.await(stopRequested)
    yield* publish(Event.StopRequested({ at: yield* now }))
    // Interrupting the loop closes the current run's scope: teardown, then the pid file, then the exit record.
    yield* Fiber.interrupt(fiber)
    const [last] = yield* Ref.get(refs.exits)
    yield* publish(Event.StopCompleted({ lastExit: last }))
  }).pipe(
    Effect.ensuring(Deferred.succeed(stopped, undefined)),
    Effect.annotateLogs({ component: "EngineProcess", engine: plan.kind })
  )
  yield* Effect.forkScoped(main)

  const stop = Deferred.succeed(stopRequested, undefined).pipe(Effect.andThen(Deferred.await(stopped)))
  yield* Effect.addFinalizer(() => stop)

  return EngineProcess.of(fromRefs({ plan, state, restarts, exits: refs.exits, pid: refs.currentPid, restart, stop }))
})

/** The supervisor for a hand-built plan on the given host: the test seam, and what `layer` uses once rendered. */
export const layerFromPlan = (
  plan: LaunchPlan,
  settings: SupervisorSettings
): Layer.Layer<EngineProcess, EngineProcessError, EngineHost> => Layer.effect(EngineProcess, make(plan, settings))

/** The supervisor of the configured engine; the daemon provides the EngineHost (layers/engine/EngineHost.ts). */
export const layer: Layer.Layer<EngineProcess, EngineProcessError, Config | EnginePlan | EngineHost> = Layer.effect(
  EngineProcess,
  Effect.gen(function* () {
    const config = yield* Config
    return yield* make(yield* EnginePlan, settingsFromConfig(config))
  })
)
