/**
 * One run of the engine, spawned through the orphan guard (the program at `guardEntry`, which the daemon passes
 * in: layers never reach programs): logs its output lines, each at the level the engine marked it with (annotated
 * stream=stdout|stderr, run=N; a flood's past a budget counted, services/engine/OutputLines.ts) and keeps the last
 * lines for forensics, and turns the guard's reports into a pid and an exit status. The run is a resource of the caller's scope: its release has the guard
 * stop the whole group (one TERM, grace, KILL, confirmed gone) and waits for it, every step bounded on Effect's
 * Clock; nothing waits on stdio. The pumps and the child's event handlers run as fibers of one FiberSet of that
 * scope, so nothing outlives the run.
 */
import { type ChildProcess, spawn } from "node:child_process"
import type { Readable } from "node:stream"
import { Clock, Deferred, Duration, Effect, FiberSet, Ref, Schedule, type Scope, Stream } from "effect"
import type { Severity } from "effect/LogLevel"
import type { LaunchPlan } from "../../services/engine/Engine.ts"
import { engineEnvironment } from "../../services/engine/EngineEnvironment.ts"
import { type EngineRun, type RunExit, type SpawnOptions, valueIfDone } from "../../services/engine/EngineHost.ts"
import { type KeptLine, keepLine } from "../../services/engine/ExitHints.ts"
import { buildGuardArgs, decodeReport, REPORT_FD, type StopOutcome } from "../../services/engine/GuardProtocol.ts"
import { type EngineLineLevel, lineLevelReader } from "../../services/engine/LineLevels.ts"
import { lineRedactor } from "../../services/engine/LineRedactor.ts"
import {
  LineSplitter,
  LOGGED_LINES_BURST,
  LOGGED_LINES_PER_SEC,
  MAX_LINE_CHARS,
  OutputBudget,
  type OutputLine
} from "../../services/engine/OutputLines.ts"
import { secretValues } from "../../services/engine/Secrets.ts"
import { shownLine } from "../../services/engine/ShownLine.ts"
import { descriptorRemedy, descriptorShortage } from "../../services/node/HostShortage.ts"
import { pollUntil } from "./groupWait.ts"
import { portHolder } from "./portHolder.ts"
import { groupAlive, KILL_WAIT_MS, pidAlive, signalGroup } from "./processGroup.ts"

/**
 * `input`'s lines, each at most `maxChars` characters (services/engine/OutputLines.ts), those of each chunk read
 * together (one step per chunk, not per line: a flood of short lines is thousands a chunk); a stream error ends them.
 */
const lines = (input: Readable, maxChars: number) =>
  Stream.fromAsyncIterable(
    (async function* () {
      // A byte-order mark is text the engine printed: kept, as readline kept it.
      const decoder = new TextDecoder("utf-8", { ignoreBOM: true })
      const splitter = new LineSplitter(maxChars)
      for await (const chunk of input) yield splitter.push(decoder.decode(chunk as Buffer, { stream: true }))
      yield [...splitter.push(decoder.decode()), ...splitter.end()]
    })(),
    (e) => e
  )

/** An engine line's level as the agent logs it. */
const AT: Readonly<Record<EngineLineLevel, Severity>> = { debug: "Debug", info: "Info", warn: "Warn", error: "Error" }

const notLogged = (n: number) =>
  Effect.logWarning(
    `engine output: ${n} line(s) not logged (more than ${LOGGED_LINES_PER_SEC} a second after ${LOGGED_LINES_BURST} at once); /status keeps the last lines`
  )

/**
 * Stops the run: closing the lifeline asks the guard to stop the group, and the guard alone signals it (one
 * TERM, grace, KILL, confirmed), so the engine never gets a second SIGTERM, which llama-server and uvicorn take
 * as "exit now" (see programs/guard.ts stopGroup). The agent waits for the guard (bounded by the guard's own
 * bounds) and only if the guard died or hangs does it SIGKILL the guard and the group itself, never TERM.
 * Returns how the group ended: the guard's report, else what the agent saw.
 */
/** Past the guard's own bounds (graceMs, then its SIGKILL and confirmation), how long it is waited for to exit. */
const GUARD_EXIT_WAIT_MS = 1_000
/** How long a guard that hung, SIGKILLed by the agent, is given to be gone. */
const GUARD_KILL_WAIT_MS = 1_000
/** How long the guard's last report, and then the engine's last output lines, are each waited for. */
const LAST_WORDS_MS = 250

/**
 * The longest a stop takes past engine.stop_grace (programs/shutdownBound.ts adds it up): the guard waited for
 * (its SIGKILL's confirmation and GUARD_EXIT_WAIT_MS), then killed (GUARD_KILL_WAIT_MS), then either the group
 * SIGKILLed and confirmed or the guard's last report read, then the output drained.
 */
export const STOP_SLACK_MS =
  KILL_WAIT_MS + GUARD_EXIT_WAIT_MS + GUARD_KILL_WAIT_MS + Math.max(KILL_WAIT_MS, LAST_WORDS_MS) + LAST_WORDS_MS

const teardown = (
  child: ChildProcess,
  pid: Effect.Effect<number | undefined>,
  graceMs: number,
  guardOutcome: Effect.Effect<StopOutcome | undefined>
): Effect.Effect<StopOutcome> =>
  Effect.gen(function* () {
    child.stdin?.destroy()
    const guardPid = child.pid
    const guardGone = () => guardPid === undefined || !pidAlive(guardPid)
    if (!(yield* pollUntil(guardGone, graceMs + KILL_WAIT_MS + GUARD_EXIT_WAIT_MS)) && guardPid !== undefined) {
      signalGroup(guardPid, "SIGKILL")
      yield* pollUntil(guardGone, GUARD_KILL_WAIT_MS)
    }
    const pgid = yield* pid
    if (pgid === undefined || !groupAlive(pgid)) return (yield* guardOutcome) ?? "gone"
    signalGroup(pgid, "SIGKILL")
    return (yield* pollUntil(() => !groupAlive(pgid), KILL_WAIT_MS)) ? "killed" : "survived"
  })

const noExit = (problem: string): RunExit => ({ code: null, signal: null, problem })

/** A run whose guard could not be spawned: `pid` and `exited` are settled already, there is nothing to stop. */
const notStarted = (
  startedAt: number,
  pid: Deferred.Deferred<number | undefined>,
  exited: Deferred.Deferred<RunExit>
): EngineRun => ({
  startedAt,
  guardPid: undefined,
  pid,
  exited,
  stop: Effect.succeed("gone"),
  lastLines: Effect.succeed([]),
  drainOutput: () => Effect.void,
  portHolder: () => Effect.succeed("unknown"),
  groupAlive: Effect.succeed(false)
})

/** Spawns one run through the guard at `guardEntry`; the run lives until the caller's scope closes. */
export const spawnRun =
  (guardEntry: string) =>
  (plan: LaunchPlan, options: SpawnOptions): Effect.Effect<EngineRun, never, Scope.Scope> =>
    Effect.gen(function* () {
      const startedAt = yield* Clock.currentTimeMillis
      const pid = yield* Deferred.make<number | undefined>()
      const exited = yield* Deferred.make<RunExit>()
      const reportDone = yield* Deferred.make<void>()
      const guardOutcome = yield* Ref.make<StopOutcome | undefined>(undefined)
      const ring = yield* Ref.make<ReadonlyArray<KeptLine>>([])
      // Acquired before the child, so released after its teardown: the pumps still log what the engine prints
      // while it stops. Node's event handlers complete the run's Deferreds as fibers of this set.
      const fibers = yield* FiberSet.make<unknown>()
      const runFork = yield* FiberSet.runtime(fibers)<never>()
      const drain = (ms: number) => FiberSet.awaitEmpty(fibers).pipe(Effect.timeout(ms), Effect.ignore)
      const env = engineEnvironment(process.env, plan.env)
      // The engine may print its secrets (vLLM logs its non-default args, `api_key` and `hf_token` among them):
      // each line is scrubbed of the run's secret values before it is logged or kept for /status.
      const redact = lineRedactor(secretValues(env, plan.argv))
      // Each line is logged at the level the engine marked it with (a chaos soak: every line at info, so log_level =
      // "warn" hid llama-server's warnings and errors with its per-request chatter); unmarked lines at info.
      const levelOf = lineLevelReader(plan.logLevels)

      const settle = (exit: RunExit) =>
        Deferred.succeed(pid, undefined).pipe(Effect.andThen(Deferred.succeed(exited, exit)), Effect.asVoid)
      const launched = yield* Effect.acquireRelease(
        Effect.gen(function* () {
          let child: ChildProcess
          try {
            child = spawn(
              process.execPath,
              [guardEntry, ...buildGuardArgs({ graceMs: options.graceMs, argv: plan.argv })],
              { detached: true, stdio: ["pipe", "pipe", "pipe", "pipe"], env }
            )
          } catch (e) {
            // Node emits 'error' for EACCES, EAGAIN, EMFILE, ENFILE and ENOENT only and throws the other spawn
            // failures (nodejs/node lib/internal/child_process.js, ChildProcess.prototype.spawn): E2BIG for an
            // engine argument past the kernel's MAX_ARG_STRLEN (128 KiB), ENOMEM. Thrown, it ended the supervisor's
            // loop as a defect nobody awaited: the engine "spawning" for good, never retried, nothing logged.
            yield* settle(noExit(`guard: ${e instanceof Error ? e.message : String(e)}`))
            return undefined
          }
          // Node emits EACCES, EAGAIN, EMFILE, ENFILE and ENOENT a tick later, the child without a pid; on EMFILE and
          // ENFILE without stdio at all, as it gives up before it sets the pipes up (lib/internal/child_process.js):
          // read as a started one, it threw on its pipes and ended the supervisor's loop (the engine "spawning" for
          // good, nothing logged).
          if (child.stdio === undefined || child.pid === undefined) {
            const err = yield* Effect.callback<Error>((resume) => {
              child.once("error", (e) => resume(Effect.succeed(e)))
            })
            // EACCES, EAGAIN or ENOENT come the same way after the pipes were made: no process holds their ends
            for (const s of child.stdio ?? []) s?.destroy()
            const shortage = descriptorShortage(err)
            yield* settle(
              noExit(`guard: ${err.message}${shortage === undefined ? "" : `: ${descriptorRemedy(shortage)}`}`)
            )
            return undefined
          }
          // Memoized: the supervisor's explicit stop and the scope's release share one teardown.
          const stop = yield* Effect.cached(
            Effect.gen(function* () {
              // The pid the guard reported by now; a stop never waits for it.
              const pgid = yield* valueIfDone(pid)
              // The guard's "stopped" report, read to the pipe's end: a poll can see the guard gone before its
              // last report is read (under load the log said "stopped: gone" for an engine that was terminated).
              const reported = Deferred.await(reportDone).pipe(
                Effect.timeout(LAST_WORDS_MS),
                Effect.ignore,
                Effect.andThen(Ref.get(guardOutcome))
              )
              const outcome = yield* teardown(child, valueIfDone(pid), options.graceMs, reported)
              if (outcome === "survived") yield* Effect.logError(`engine group ${pgid} survived SIGKILL`)
              else if (pgid !== undefined) yield* Effect.logInfo(`engine group ${pgid} stopped: ${outcome}`)
              return outcome
            })
          )
          return { child, stop }
        }),
        (l) =>
          l === undefined
            ? Effect.void
            : l.stop.pipe(
                Effect.andThen(drain(LAST_WORDS_MS)),
                // A process that left the engine's group (setsid) with its stdout/stderr outlives the stop and
                // holds the pipes' write ends: no end of file comes, and the agent's ends stayed open for as long
                // as it lived, two fds per restart. The drain had its chance; what it left is closed here.
                Effect.andThen(
                  Effect.sync(() => {
                    for (const s of l.child.stdio) s?.destroy()
                  })
                )
              )
      )
      // Not started: a run that ended at once, with why (the supervisor logs it and retries with backoff).
      if (launched === undefined) return notStarted(startedAt, pid, exited)
      const { child, stop } = launched

      child.once("error", (err) => runFork(settle(noExit(`guard: ${err.message}`))))
      child.once("exit", (code, signal) =>
        // The guard's last report may still be in the pipe: read it first (bounded) before falling back.
        runFork(
          Deferred.await(reportDone).pipe(
            Effect.timeout(250),
            Effect.ignore,
            Effect.andThen(
              settle(noExit(`the guard exited (${signal ?? `code ${code}`}) without reporting the engine's exit`))
            )
          )
        )
      )
      child.stdin?.on("error", () => {})

      const report = child.stdio[REPORT_FD] as Readable | null
      report?.on("error", () => {})
      const onReport = ({ text }: OutputLine) => {
        const r = decodeReport(text)
        if (r?.t === "spawned") return Deferred.succeed(pid, r.pid)
        if (r?.t === "spawn-error") return settle(noExit(`spawn failed: ${r.message}`))
        if (r?.t === "exit") return Deferred.succeed(exited, { code: r.code, signal: r.signal, problem: undefined })
        if (r?.t === "stopped") return Ref.set(guardOutcome, r.outcome)
        return Effect.void
      }
      const reports =
        report === null
          ? Effect.void
          : lines(report, MAX_LINE_CHARS).pipe(
              Stream.runForEach((batch) => Effect.forEach(batch, onReport, { discard: true })),
              Effect.ignore
            )
      yield* FiberSet.run(fibers, Effect.ensuring(reports, Deferred.succeed(reportDone, undefined)))

      const pump = (stream: "stdout" | "stderr", input: Readable | null) => {
        if (input === null) return Effect.void
        const budget = new OutputBudget()
        const batchDone = (batch: ReadonlyArray<OutputLine>) =>
          Effect.flatMap(Clock.currentTimeMillis, (now) => {
            const shown = batch.map((raw) => shownLine(raw, redact))
            const logs: Array<Effect.Effect<void>> = []
            for (const line of shown) {
              const { log, dropped } = budget.take(now)
              if (dropped !== undefined) logs.push(notLogged(dropped))
              if (!log) continue
              const logAt = Effect.logWithLevel(AT[levelOf(line.text)])
              logs.push(
                line.fields === undefined ? logAt(line.message) : logAt(line.message, { engine_fields: line.fields })
              )
            }
            return Ref.update(ring, (xs) =>
              shown.reduce((kept, l) => keepLine(kept, `[${stream}] ${l.text}`, options.linesKept, plan.exitHints), xs)
            ).pipe(Effect.andThen(Effect.all(logs, { discard: true })))
          })
        // lines not logged are counted once a second also while the engine is quiet after a flood
        const countDue = Effect.flatMap(Clock.currentTimeMillis, (now) => {
          const dropped = budget.due(now)
          return dropped === undefined ? Effect.void : notLogged(dropped)
        }).pipe(Effect.repeat(Schedule.spaced(Duration.seconds(1))))
        return lines(input, MAX_LINE_CHARS + redact.longest).pipe(
          Stream.mergeEffect(countDue),
          Stream.runForEach(batchDone),
          // what was not logged when the output ends (the engine went quiet, or exited)
          Effect.ensuring(
            Effect.suspend(() => {
              const dropped = budget.flush()
              return dropped > 0 ? notLogged(dropped) : Effect.void
            })
          ),
          Effect.annotateLogs({ stream, run: options.run }),
          Effect.ignore
        )
      }
      yield* FiberSet.run(fibers, pump("stdout", child.stdout))
      yield* FiberSet.run(fibers, pump("stderr", child.stderr))

      return {
        startedAt,
        guardPid: child.pid,
        pid,
        exited,
        stop,
        lastLines: Effect.map(Ref.get(ring), (xs) => xs.map((l) => l.text)),
        drainOutput: drain,
        // Waits for the guard's pid report (runOnce stops waiting for it after 10 s, readiness does not): while
        // the group is not known, an answer on the port cannot be told from a foreign listener's, and "unknown"
        // (trust the probe) let one make the run Ready. No pid at all means no engine: nothing on the port is its.
        portHolder: (port) =>
          Effect.map(Deferred.await(pid), (pgid) => (pgid === undefined ? "other" : portHolder(port, pgid))),
        groupAlive: Effect.map(valueIfDone(pid), (pgid) => pgid !== undefined && groupAlive(pgid))
      } satisfies EngineRun
    })
