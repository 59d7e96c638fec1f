/**
 * The live EngineProcess: one supervisor fiber per agent runs the engine plan run after run (spawn through the
 * orphan guard, readiness within the startup budget, liveness with a failure threshold, restart with backoff)
 * and is the only writer of the state, which it derives through the pure table in services/engine/EngineState.ts.
 * `stop` (and closing the layer's scope) asks that fiber to stop; it tears the run down and settles in Stopped.
 * openai_compat (plan.spawns = false) runs the same loop with nothing spawned.
 */
import { Deferred, Duration, Effect, Fiber, Layer, Option, Ref, Result, SubscriptionRef } from "effect"
import type { AgentConfig } from "../../services/config/Config.ts"
import { Config } from "../../services/config/Config.ts"
import { EnginePlan, type LaunchPlan } from "../../services/engine/Engine.ts"
import {
  EngineProcess,
  type EngineProcessError,
  type EngineState,
  type ExitRecord,
  fromRefs
} from "../../services/engine/EngineProcess.ts"
import {
  type BackoffPolicy,
  describeExit,
  Event,
  failingReason,
  livenessStep,
  nextRestart,
  State,
  type SupervisorEvent,
  transition
} from "../../services/engine/EngineState.ts"
import { GpuGate } from "../../services/engine/GpuGate.ts"
import { redactArgv, redactEnv } from "./backends/redact.ts"
import { pidFilePath, reclaim, removePidFile, writePidFile } from "./pidFile.ts"
import { probeOnce } from "./probe.ts"
import { type EngineRun, type RunExit, spawnRun } from "./run.ts"

export { EngineProcessControl, layerTest, testPlan } from "../../testing/EngineProcess.ts"

/** Everything the supervisor reads from the config, in milliseconds. */
export interface SupervisorSettings {
  readonly startupTimeoutMs: number
  readonly stopGraceMs: number
  readonly livenessIntervalMs: number
  readonly livenessFailures: number
  readonly backoff: BackoffPolicy
  /** [agent].state_dir: where the engine pid file lives. */
  readonly stateDir: string
  readonly probeIntervalMs: number
  readonly progressEveryMs: number
  readonly linesKept: number
}

export const settingsFromConfig = (config: AgentConfig): SupervisorSettings => ({
  startupTimeoutMs: Duration.toMillis(config.engine.startup_timeout),
  stopGraceMs: Duration.toMillis(config.engine.stop_grace),
  livenessIntervalMs: Duration.toMillis(config.engine.liveness_interval),
  livenessFailures: config.engine.liveness_failures,
  backoff: {
    initialMs: Duration.toMillis(config.engine.restart_backoff_initial),
    maxMs: Duration.toMillis(config.engine.restart_backoff_max),
    stableAfterMs: Duration.toMillis(config.engine.restart_stable_after),
    crashLoopAfter: 3
  },
  stateDir: config.agent.state_dir,
  probeIntervalMs: 500,
  progressEveryMs: 5_000,
  linesKept: 50
})

const EXITS_KEPT = 20
const LOG_TAIL = 10

const exitFrom = (run: number, er: EngineRun | undefined, pid: number | undefined, reason: string) => {
  const ex: RunExit | undefined =
    er !== undefined && Deferred.isDoneUnsafe(er.exited) ? Effect.runSync(Deferred.await(er.exited)) : undefined
  const startedAt = er?.startedAt ?? Date.now()
  const endedAt = Date.now()
  const record: ExitRecord = {
    run,
    pid,
    code: ex?.code ?? null,
    signal: ex?.signal ?? null,
    startedAt,
    endedAt,
    runtimeMs: endedAt - startedAt,
    reason: reason === "exited" && ex?.problem !== undefined ? ex.problem : reason,
    lastLines: er?.lastLines() ?? []
  }
  return record
}

/** Builds the supervisor for a plan; fails only when the start is refused (stale agent, busy port, state dir). */
/** A transition's log line: a string for an ignored event (debug), else the message and the new state's fields. */
type StateLog = string | readonly [string, Record<string, unknown>]

/** The state's fields as log fields: nested values stay JSON, the exit's last lines (already logged) are left out. */
const stateFields = (state: EngineState): Record<string, unknown> => {
  const { _tag, ...fields } = state as EngineState & Record<string, unknown>
  const lastExit = fields.lastExit as Record<string, unknown> | undefined
  if (lastExit === undefined) return fields
  const { lastLines: _, ...exit } = lastExit
  return { ...fields, lastExit: exit }
}

export const make = Effect.fn("EngineProcess.make")(function* (plan: LaunchPlan, settings: SupervisorSettings) {
  const now = () => Date.now()
  const pidFile = plan.spawns ? pidFilePath(settings.stateDir) : undefined
  if (plan.spawns) yield* reclaim(plan, settings.stateDir, settings.stopGraceMs)
  // optional: no gate in tests that do not build one, or on a host without NVML it is open anyway
  const gate = yield* Effect.serviceOption(GpuGate)

  const state = yield* SubscriptionRef.make<EngineState>(
    State.Starting({ phase: plan.spawns ? "spawning" : "probing", since: now(), run: 0 })
  )
  const exits = yield* Ref.make<ReadonlyArray<ExitRecord>>([])
  const restarts = yield* Ref.make(0)
  const currentPid = yield* Ref.make<number | undefined>(undefined)
  const stopRequested = yield* Deferred.make<void>()
  const stopped = yield* Deferred.make<void>()

  const publish = (event: SupervisorEvent) =>
    SubscriptionRef.modifySome(state, (s): readonly [StateLog | undefined, Option.Option<EngineState>] => {
      const r = transition(s, event)
      if (Result.isFailure(r)) return [`ignored: ${r.failure.message}`, Option.none()]
      if (r.success === s) return [undefined, Option.none()]
      return [[`engine ${s._tag} -> ${r.success._tag}`, stateFields(r.success)] as const, Option.some(r.success)]
    }).pipe(
      Effect.flatMap((log) =>
        log === undefined ? Effect.void : typeof log === "string" ? Effect.logDebug(log) : Effect.logInfo(...log)
      )
    )

  const readiness = (run: number, since: number) =>
    Effect.gen(function* () {
      const deadline = since + settings.startupTimeoutMs
      let lastLog = since
      for (;;) {
        const remaining = deadline - now()
        if (remaining <= 0) {
          yield* publish(Event.StartupTimedOut({ budgetMs: settings.startupTimeoutMs, at: now() }))
          return undefined
        }
        const r = yield* probeOnce(plan.probe, Math.min(remaining, 10_000))
        yield* Effect.logDebug("engine readiness probe", { run, url: plan.probe.url, ...r })
        if (r.ok) {
          const at = now()
          yield* publish(Event.ProbeOk({ at }))
          return at
        }
        yield* publish(Event.Phase({ phase: r.phase, at: now() }))
        if (now() - lastLog >= settings.progressEveryMs) {
          lastLog = now()
          yield* Effect.logInfo(
            `engine run ${run} starting: phase=${r.phase} elapsed=${Math.round((lastLog - since) / 1000)}s ` +
              `budget=${Math.round(settings.startupTimeoutMs / 1000)}s (${r.reason})`
          )
        }
        yield* Effect.sleep(Math.max(0, Math.min(settings.probeIntervalMs, deadline - now())))
      }
    })

  const liveness = Effect.gen(function* () {
    let failures = 0
    for (;;) {
      yield* Effect.sleep(settings.livenessIntervalMs)
      const live = plan.liveness ?? plan.probe
      const r = yield* probeOnce(live, Math.min(settings.livenessIntervalMs, 5_000))
      yield* Effect.logDebug("engine liveness probe", { url: live.url, ...r })
      const step = livenessStep(failures, r.ok, settings.livenessFailures)
      if (!r.ok)
        yield* Effect.logWarning(`liveness probe failed (${step.failures}/${settings.livenessFailures}): ${r.reason}`)
      else if (failures > 0) yield* Effect.logInfo("liveness probe recovered")
      failures = step.failures
      if (step.lost && !r.ok) {
        const reason = `${failures} liveness probes failed in a row, last: ${r.reason}`
        yield* publish(Event.LivenessLost({ reason, at: now() }))
        return `unhealthy: ${reason}`
      }
    }
  })

  const runOnce = (run: number) =>
    Effect.gen(function* () {
      let er: EngineRun | undefined
      let pid: number | undefined
      let readyAt: number | undefined
      yield* Effect.addFinalizer(() => Ref.set(currentPid, undefined))
      // Registered first so it runs last: after the group teardown, a stopped run still leaves its record.
      yield* Effect.addFinalizer((exit) =>
        exit._tag === "Failure"
          ? Effect.gen(function* () {
              // The guard's exit report can trail the group's death by a moment.
              if (er !== undefined) yield* Deferred.await(er.exited).pipe(Effect.timeout(1_000), Effect.ignore)
              yield* Ref.update(exits, (xs) => [exitFrom(run, er, pid, "stopped"), ...xs].slice(0, EXITS_KEPT))
            })
          : Effect.void
      )
      const since = now()
      if (plan.spawns) {
        // A restart onto GPUs still held by the last run's leftovers would fail at load: wait for them first.
        if (Option.isSome(gate)) yield* gate.value.awaitFree
        // What an operator checks first when an engine will not start; secrets never reach the log.
        yield* Effect.logInfo(`engine run ${run}: spawning`, { argv: redactArgv(plan.argv), env: redactEnv(plan.env) })
        er = yield* spawnRun(plan, { run, graceMs: settings.stopGraceMs, linesKept: settings.linesKept })
        pid = yield* Deferred.await(er.pid).pipe(
          Effect.timeoutOrElse({ duration: 10_000, orElse: () => Effect.undefined })
        )
        if (pid !== undefined && pidFile !== undefined) {
          writePidFile(pidFile, {
            agentPid: process.pid,
            guardPid: er.guardPid,
            pgid: pid,
            host: plan.host,
            port: plan.port,
            startedAt: er.startedAt
          })
        }
        if (pid !== undefined) {
          yield* Ref.set(currentPid, pid)
          if (Option.isSome(gate)) yield* gate.value.spawned(pid)
          yield* publish(Event.Spawned({ run, pid, at: now() }))
        }
      }
      // Readiness, then liveness: completes only with the reason the run must end.
      const watching = Effect.flatMap(readiness(run, since), (at) => {
        readyAt = at
        return at === undefined ? Effect.succeed("startup timeout") : liveness
      })
      const reason =
        er === undefined
          ? yield* watching
          : yield* Effect.raceFirst(Deferred.await(er.exited).pipe(Effect.as("exited")), watching)
      if (er !== undefined) {
        yield* er.stop
        yield* Deferred.await(er.exited).pipe(Effect.timeout(2_000), Effect.ignore)
        yield* er.drainOutput(250)
      }
      return { record: exitFrom(run, er, pid, reason), readyAt }
    })

  const loop = Effect.gen(function* () {
    let attempt = 0
    for (let run = 0; ; run++) {
      const { record, readyAt } = yield* Effect.scoped(runOnce(run))
      yield* Ref.update(exits, (xs) => [record, ...xs].slice(0, EXITS_KEPT))
      const next = nextRestart(settings.backoff, attempt, readyAt, record.endedAt)
      attempt = next.attempt
      const failing = failingReason(next, record)
      yield* publish(
        Event.Exited({ exit: record, attempt, nextAt: now() + next.delayMs, ...(failing ? { failing } : {}) })
      )
      const tail = record.lastLines.slice(-LOG_TAIL).join("\n")
      const line =
        `${describeExit(record)}; restart attempt ${attempt} in ${next.delayMs} ms` +
        `${next.crashLoop ? " (crash loop)" : ""}${tail === "" ? "" : `; last lines:\n${tail}`}`
      yield* failing === undefined ? Effect.logWarning(line) : Effect.logError(line)
      yield* Effect.sleep(next.delayMs)
      yield* Ref.update(restarts, (n) => n + 1)
      yield* publish(Event.RestartDue({ run: run + 1, at: now() }))
    }
  })

  const main = Effect.gen(function* () {
    const fiber = yield* Effect.forkChild(loop)
    yield* Deferred.await(stopRequested)
    yield* publish(Event.StopRequested({ at: now() }))
    yield* Fiber.interrupt(fiber)
    if (pidFile !== undefined) removePidFile(pidFile)
    const [last] = yield* Ref.get(exits)
    yield* publish(Event.StopCompleted({ lastExit: last }))
  }).pipe(
    Effect.ensuring(Deferred.succeed(stopped, undefined)),
    Effect.annotateLogs({ component: "EngineProcess", engine: plan.kind })
  )
  yield* Effect.forkScoped(main)

  const stop = Deferred.succeed(stopRequested, undefined).pipe(Effect.andThen(Deferred.await(stopped)))
  yield* Effect.addFinalizer(() => stop)

  return EngineProcess.of(fromRefs({ plan, state, restarts, exits, pid: currentPid, stop }))
})

/** The supervisor for a hand-built plan: the test seam, and what `layer` uses once the plan is rendered. */
export const layerFromPlan = (
  plan: LaunchPlan,
  settings: SupervisorSettings
): Layer.Layer<EngineProcess, EngineProcessError> => Layer.effect(EngineProcess, make(plan, settings))

/** The supervisor of the configured engine. */
export const layer: Layer.Layer<EngineProcess, EngineProcessError, Config | EnginePlan> = Layer.effect(
  EngineProcess,
  Effect.gen(function* () {
    const config = yield* Config
    return yield* make(yield* EnginePlan, settingsFromConfig(config))
  })
)
