/**
 * One run of the supervisor's loop, in its own scope: wait for the GPUs, spawn (the run and its pid file are
 * resources of the scope), watch it until it must end, tear it down, and describe how it ended. Closing the scope
 * early (a stop) tears the run down through the same releases and still records it as "stopped".
 */
import * as process from "node:process"
import { Clock, Deferred, Effect, Option, Ref } from "effect"
import type { Counter } from "prom-client"
import { type EngineRun, valueIfDone } from "../../services/engine/EngineHost.ts"
import { type ExitRecord, type RunEnd, RunEndWords } from "../../services/engine/EngineProcess.ts"
import { describeExit, describeStatus, Event, exitLogLevel } from "../../services/engine/EngineState.ts"
import { exitHint } from "../../services/engine/ExitHints.ts"
import type { GpuGateService } from "../../services/engine/GpuGate.ts"
import { type MemoryCgroupService, oomKillsDuring } from "../../services/node/MemoryCgroup.ts"
import { redactArgv, redactEnv } from "./backends/redact.ts"
import { pidFileOfRun, pidFilePath } from "./pidFile.ts"
import { type Supervision, watchRun } from "./watch.ts"

const EXITS_KEPT = 20

/** The refs the loop keeps across runs. */
export interface RunRefs {
  readonly exits: Ref.Ref<ReadonlyArray<ExitRecord>>
  readonly currentPid: Ref.Ref<number | undefined>
  /** cgn_agent_engine_oom_kills_total, when the agent has metrics. */
  readonly oomKillsTotal: Counter | undefined
  /** A run whose group survived SIGKILL at its stop, while it may still be alive: the next spawn waits for it. */
  readonly lingering: Ref.Ref<Lingering | undefined>
}

export interface Lingering {
  readonly run: number
  readonly pid: number
  readonly alive: Effect.Effect<boolean>
}

/** How often a group that survived SIGKILL is looked at, and how often the wait for it is logged again. */
const LINGER_POLL_MS = 1_000
const LINGER_LOG_EVERY_MS = 60_000

/** How long a spawned run's pid is waited for (the guard reports it once its group leader exists). */
const PID_WAIT_MS = 10_000
/**
 * How long a run ended by the agent's stop waits for the guard's exit report, which can trail the group's death by a
 * moment. It runs after the stop, within the shutdown (programs/shutdownBound.ts counts it).
 */
export const EXIT_REPORT_WAIT_MS = 1_000
/** The same wait after a stop of the run's own (its engine exited or failed): the next run waits on it. */
const STOPPED_EXIT_WAIT_MS = 2_000
/** How long the engine's last output lines are waited for, for the exit record's hint. */
const OUTPUT_DRAIN_MS = 1_000

/**
 * The last run's group survived SIGKILL (a process in uninterruptible sleep: a GPU driver hang, a dead network
 * mount) and may still hold the engine's port and GPU memory: a run started now would fail at bind or load, again and
 * again, counted as a crash loop that says "another process holds that port". The next run waits for it instead,
 * in its phase and in a log line a minute, however long it takes: no second engine on the same GPUs, as at the
 * agent's start (pidFile.ts reclaim refuses a group that survives SIGKILL).
 */
const awaitLingering = (s: Supervision, refs: RunRefs) =>
  Effect.gen(function* () {
    const l = yield* Ref.get(refs.lingering)
    if (l === undefined) return
    let loggedAt: number | undefined
    while (yield* l.alive) {
      const at = yield* Clock.currentTimeMillis
      if (loggedAt === undefined) {
        const phase = `waiting for run ${l.run}'s engine group ${l.pid} to exit (it survived SIGKILL)`
        yield* s.publish(Event.Phase({ phase, at }))
      }
      if (loggedAt === undefined || at - loggedAt >= LINGER_LOG_EVERY_MS) {
        loggedAt = at
        yield* Effect.logError(
          `engine group ${l.pid} of run ${l.run} survived SIGKILL and is still alive; the next run waits for it to exit (a process stuck in the kernel, state D in ps -o pid,stat,wchan -g ${l.pid}: often a GPU driver hang, see dmesg and nvidia-smi)`
        )
      }
      yield* Effect.sleep(LINGER_POLL_MS)
    }
    if (loggedAt !== undefined) {
      yield* Effect.logInfo(`engine group ${l.pid} of run ${l.run} is gone; starting the next run`)
      yield* s.publish(Event.Phase({ phase: "spawning", at: yield* Clock.currentTimeMillis }))
    }
    yield* Ref.set(refs.lingering, undefined)
  })

interface Spawned {
  readonly run: EngineRun
  readonly pid: number | undefined
  /** The memory cgroup's OOM kill count just before the spawn. */
  readonly oomKillsBefore: number | undefined
}

/** Keeps an ended run's record (bounded) and counts the OOM kills made during it. */
export const keepExit = (refs: RunRefs, record: ExitRecord) =>
  Ref.update(refs.exits, (xs) => [record, ...xs].slice(0, EXITS_KEPT)).pipe(
    Effect.andThen(
      Effect.sync(() => {
        if (record.oomKills !== undefined && record.oomKills > 0) refs.oomKillsTotal?.inc(record.oomKills)
      })
    )
  )

/** The OOM kills in the memory cgroup since the spawn (read now, the run being over), and the cgroup's limit. */
const memoryForensics = (memory: MemoryCgroupService | undefined, spawned: Spawned | undefined) =>
  Effect.gen(function* () {
    if (memory === undefined || spawned === undefined) return { oomKills: undefined, memoryLimitBytes: undefined }
    const [after, limit] = yield* Effect.all([memory.oomKills, memory.limit])
    return {
      oomKills: oomKillsDuring(spawned.oomKillsBefore, after),
      memoryLimitBytes: typeof limit === "number" ? limit : undefined
    }
  })

/**
 * How a run ended, from what its host reported by now (a run that never spawned has no status), with the backend's
 * hint when the engine died of one of its well-known start failures.
 */
const exitRecord = (
  run: number,
  since: number,
  spawned: Spawned | undefined,
  ended: RunEnd,
  s: Pick<Supervision, "plan" | "memory">,
  /** The run became ready at some point: no start-failure hint then (ExitHints.exitHint). */
  wasReady = false
) =>
  Effect.gen(function* () {
    const ex = spawned === undefined ? undefined : yield* valueIfDone(spawned.run.exited)
    const startedAt = spawned?.run.startedAt ?? since
    const endedAt = yield* Clock.currentTimeMillis
    const code = ex?.code ?? null
    const signal = ex?.signal ?? null
    const lastLines = spawned === undefined ? [] : yield* spawned.run.lastLines
    // From the end as the watch gave it: `exited`, the engine ended by itself.
    const hint = exitHint(s.plan.exitHints, { endedBy: ended, code, signal, lastLines, wasReady })
    // an engine that ended with no exit status (not spawned, its exit unreported) says why instead
    const endedBy: RunEnd =
      ended.kind === "exited" && ex?.problem !== undefined ? { kind: "failed", problem: ex.problem } : ended
    const record: ExitRecord = {
      run,
      pid: spawned?.pid,
      code,
      signal,
      startedAt,
      endedAt,
      runtimeMs: endedAt - startedAt,
      reason: RunEndWords.record(endedBy),
      endedBy,
      lastLines,
      ...(yield* memoryForensics(s.memory, spawned)),
      ...(hint === undefined ? {} : { hint })
    }
    return record
  })

/** Spawns run `run` into the current scope, records its pid (pid file, refs, gate) and publishes Spawned. */
const spawn = (
  s: Supervision,
  refs: RunRefs,
  gate: Option.Option<GpuGateService>,
  run: number,
  spawned: Ref.Ref<Spawned | undefined>
) =>
  Effect.gen(function* () {
    const { plan, settings } = s
    yield* awaitLingering(s, refs)
    // A restart onto GPUs still held by the last run's leftovers would fail at load: wait for them first.
    if (Option.isSome(gate)) yield* gate.value.awaitFree
    // GPUs chosen after the agent's start (NVML silent then) reach the run here; [engine].env keeps the last word.
    const env = Option.isSome(gate) ? { ...(yield* gate.value.runEnv), ...plan.env } : plan.env
    const launch = { run, graceMs: settings.stopGraceMs, linesKept: settings.linesKept }
    // What an operator checks first when an engine will not start; secrets never reach the log.
    yield* Effect.logInfo(`engine run ${run}: spawning`, { argv: redactArgv(plan.argv), env: redactEnv(env) })
    // Acquired before the run, so removed after the run's teardown has confirmed the group gone.
    const pidFile = yield* pidFileOfRun(pidFilePath(settings.stateDir))
    // The OOM kill count at the spawn, read just before it: a kill in the run's first moments counts too.
    const oomKillsBefore = s.memory === undefined ? undefined : yield* s.memory.oomKills
    // Known to the stop record at once: a stop while the pid is awaited still reports this run.
    const er = yield* s.host.spawn({ ...plan, env }, launch).pipe(
      Effect.tap((er) => Ref.set(spawned, { run: er, pid: undefined, oomKillsBefore })),
      Effect.uninterruptible
    )
    const pid = yield* Deferred.await(er.pid).pipe(
      Effect.timeoutOrElse({ duration: PID_WAIT_MS, orElse: () => Effect.undefined })
    )
    yield* Ref.set(spawned, { run: er, pid, oomKillsBefore })
    if (pid !== undefined) {
      const record = { agentPid: process.pid, guardPid: er.guardPid, pgid: pid, host: plan.host, port: plan.port }
      yield* pidFile.write({ ...record, startedAt: er.startedAt })
      yield* Ref.set(refs.currentPid, pid)
      if (Option.isSome(gate)) yield* gate.value.spawned(pid)
      yield* s.publish(Event.Spawned({ run, pid, at: yield* Clock.currentTimeMillis }))
    }
    return { run: er, pid, oomKillsBefore } satisfies Spawned
  })

/** One run, to be run in its own scope: how it ended, and when it was Ready (undefined if never). */
export const runOnce = (s: Supervision, refs: RunRefs, gate: Option.Option<GpuGateService>, run: number) =>
  Effect.gen(function* () {
    const since = yield* Clock.currentTimeMillis
    const spawned = yield* Ref.make<Spawned | undefined>(undefined)
    const readyAt = yield* Deferred.make<number>()
    // How the run ended, once known: a stop that interrupts its teardown (the group stopped after the engine
    // exited) is not its end
    const known = yield* Ref.make<RunEnd | undefined>(undefined)
    yield* Effect.addFinalizer(() => Ref.set(refs.currentPid, undefined))
    // Registered before the spawn so it runs after the run's teardown: a stopped run still leaves its record.
    yield* Effect.addFinalizer((exit) =>
      exit._tag === "Failure"
        ? Effect.gen(function* () {
            const sp = yield* Ref.get(spawned)
            // The guard's exit report can trail the group's death by a moment.
            if (sp !== undefined)
              yield* Deferred.await(sp.run.exited).pipe(Effect.timeout(EXIT_REPORT_WAIT_MS), Effect.ignore)
            const ended = yield* Ref.get(known)
            const record = yield* exitRecord(run, since, sp, ended ?? { kind: "stopped" }, s)
            yield* keepExit(refs, record)
            // an engine that crashed during a drain was filed as stopped, at info (a lifecycle review)
            if (ended !== undefined)
              yield* Effect.logWithLevel(exitLogLevel(record, undefined))(
                `${describeExit(record)}; not restarted: its supervision is ending (the agent stopping, or a defect said apart)`
              )
          })
        : Effect.void
    )
    const sp = s.plan.spawns ? yield* spawn(s, refs, gate, run, spawned) : undefined
    // engine.startup_timeout is the engine's own load budget: it runs from the spawn, not from before the
    // wait for free GPUs (a long wait used up the budget and the run was killed as it began to load).
    const spawnedAt = yield* Clock.currentTimeMillis
    // Nothing spawned (openai_compat), nothing to tell the engine's listener by; or an engine.command that runs the
    // engine outside our process group (a container runtime), whose listener is never the group's: trust the probe.
    const holder =
      sp === undefined || !s.settings.verifyListener
        ? Effect.succeed("unknown" as const)
        : sp.run.portHolder(s.plan.port)
    const watching = watchRun(s, { run, since: spawnedAt, readyAt, holder })
    const ended: RunEnd =
      sp === undefined
        ? yield* watching
        : yield* Effect.raceFirst(Deferred.await(sp.run.exited).pipe(Effect.as({ kind: "exited" } as const)), watching)
    yield* Ref.set(known, ended)
    if (sp !== undefined) {
      // The engine is gone once its leader exits: not Ready while the rest of its group is stopped (up to
      // stop_grace and the kill's wait), or routers and /readyz would take a dead engine as ready meanwhile.
      if (ended.kind === "exited") {
        const ex = yield* valueIfDone(sp.run.exited)
        // the OOM killer's part is read once the group is gone (exitRecord); the status is worded as there
        const how = describeStatus({
          code: ex?.code ?? null,
          signal: ex?.signal ?? null,
          endedBy: { kind: "exited" },
          oomKills: undefined,
          memoryLimitBytes: undefined
        })
        const at = yield* Clock.currentTimeMillis
        const ending = { kind: "exited", status: how } as const
        yield* s.publish(Event.LivenessLost({ reason: RunEndWords.ending(ending), at, ending }))
      }
      if ((yield* sp.run.stop) === "survived" && sp.pid !== undefined)
        yield* Ref.set(refs.lingering, { run, pid: sp.pid, alive: sp.run.groupAlive })
      yield* Deferred.await(sp.run.exited).pipe(Effect.timeout(STOPPED_EXIT_WAIT_MS), Effect.ignore)
      // The exit record's last lines are what its hint is read from, and an engine dying at start prints its cause
      // just before it exits: give the output pumps, which may lag on a loaded host, up to a second to reach the
      // pipes' end (it comes as soon as the group is gone; only an escaped process holding a pipe waits it out).
      yield* sp.run.drainOutput(OUTPUT_DRAIN_MS)
    }
    const readyAtMs = yield* valueIfDone(readyAt)
    return { record: yield* exitRecord(run, since, sp, ended, s, readyAtMs !== undefined), readyAt: readyAtMs }
  })
