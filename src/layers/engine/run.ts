/**
 * One run of the engine: spawns it through the orphan guard (src/programs/guard.ts), logs every output line
 * (annotated stream=stdout|stderr, run=N) and keeps the last lines for forensics, and turns the guard's reports
 * into a pid and an exit status. The run's scope owns the process: closing it has the guard stop the whole group
 * (one TERM, grace, KILL, confirmed gone) and waits for the guard, every step bounded; nothing waits on stdio.
 */
import { type ChildProcess, spawn } from "node:child_process"
import * as readline from "node:readline"
import type { Readable } from "node:stream"
import { Deferred, Effect, Fiber, Stream } from "effect"
import type { LaunchPlan } from "../../services/engine/Engine.ts"
import { buildGuardArgs, decodeReport, REPORT_FD } from "../../services/engine/GuardProtocol.ts"
import { engineOutput } from "../observability/Logging.ts"
import { groupAlive, KILL_WAIT_MS, pidAlive, pollUntil, type StopOutcome, signalGroup } from "./processGroup.ts"

/** The guard program, next to this module's tree in both layouts: src/ (run as .ts) and dist/ (built .js). */
export const guardEntry = (): string => {
  const ext = import.meta.url.endsWith(".ts") ? "ts" : "js"
  return new URL(`../../programs/guard.${ext}`, import.meta.url).pathname
}

export interface RunExit {
  readonly code: number | null
  readonly signal: string | null
  /** Set when the engine never started (e.g. ENOENT) or the guard died before reporting. */
  readonly problem: string | undefined
}

export interface EngineRun {
  readonly run: number
  readonly startedAt: number
  /** The engine's pid (= its process group id); undefined when it could not be spawned. */
  readonly pid: Deferred.Deferred<number | undefined>
  readonly guardPid: number | undefined
  readonly exited: Deferred.Deferred<RunExit>
  readonly lastLines: () => ReadonlyArray<string>
  /** Has the guard stop the group (one TERM, grace, KILL, confirmed) and waits for it; idempotent, bounded. */
  readonly stop: Effect.Effect<StopOutcome>
  /** Waits (bounded) for the output pipes to deliver what is buffered, so lastLines is complete. */
  readonly drainOutput: (ms: number) => Effect.Effect<void>
}

export interface RunOptions {
  readonly run: number
  readonly graceMs: number
  readonly linesKept: number
}

const lines = (input: Readable) =>
  Stream.fromAsyncIterable(readline.createInterface({ input, crlfDelay: Number.POSITIVE_INFINITY }), (e) => e)

/**
 * Stops the run: closing the lifeline asks the guard to stop the group, and the guard alone signals it (one
 * TERM, grace, KILL, confirmed), so the engine never gets a second SIGTERM, which llama-server and uvicorn take
 * as "exit now" (see stopGroup). The agent waits for the guard (bounded by the guard's own bounds) and only
 * if the guard died or hangs does it SIGKILL the guard and the group itself, never TERM. Returns how the group
 * ended: the guard's report, else what the agent saw.
 */
const teardown = async (
  child: ChildProcess,
  pid: number | undefined,
  graceMs: number,
  guardOutcome: () => StopOutcome | undefined
): Promise<StopOutcome> => {
  child.stdin?.destroy()
  const guardPid = child.pid
  const guardGone = () => guardPid === undefined || !pidAlive(guardPid)
  if (!(await pollUntil(guardGone, graceMs + KILL_WAIT_MS + 1_000)) && guardPid !== undefined) {
    signalGroup(guardPid, "SIGKILL")
    await pollUntil(guardGone, 1_000)
  }
  if (pid === undefined || !groupAlive(pid)) return guardOutcome() ?? "gone"
  signalGroup(pid, "SIGKILL")
  return (await pollUntil(() => !groupAlive(pid), KILL_WAIT_MS)) ? "killed" : "survived"
}

export const spawnRun = Effect.fn("EngineProcess.spawnRun")(function* (plan: LaunchPlan, options: RunOptions) {
  const pidDeferred = yield* Deferred.make<number | undefined>()
  const exited = yield* Deferred.make<RunExit>()
  const ring: Array<string> = []
  const keep = (line: string) => {
    ring.push(line)
    if (ring.length > options.linesKept) ring.shift()
  }
  const startedAt = Date.now()
  let guardOutcome: StopOutcome | undefined
  let stopping: Promise<StopOutcome> | undefined
  const pumps: Array<Fiber.Fiber<void>> = []
  // Fiber.await, not join: a pump that was interrupted must not interrupt the caller.
  const drain = (ms: number) => Effect.timeout(Effect.forEach(pumps, Fiber.await), ms).pipe(Effect.ignore)

  const child = yield* Effect.acquireRelease(
    Effect.sync(() =>
      spawn(process.execPath, [guardEntry(), ...buildGuardArgs({ graceMs: options.graceMs, argv: plan.argv })], {
        detached: true,
        stdio: ["pipe", "pipe", "pipe", "pipe"],
        env: { ...process.env, ...plan.env }
      })
    ),
    // The pumps outlive the teardown, so what the engine prints while it stops still reaches the log.
    () => stop.pipe(Effect.andThen(drain(250)), Effect.andThen(Fiber.interruptAll(pumps)))
  )
  const stop: Effect.Effect<StopOutcome> = Effect.gen(function* () {
    const first = stopping === undefined
    const pid = Deferred.isDoneUnsafe(pidDeferred) ? yield* Deferred.await(pidDeferred) : undefined
    stopping ??= teardown(child, pid, options.graceMs, () => guardOutcome)
    const outcome = yield* Effect.promise(() => stopping!)
    if (first && outcome === "survived") yield* Effect.logError(`engine group ${pid} survived SIGKILL`)
    else if (first && pid !== undefined) yield* Effect.logInfo(`engine group ${pid} stopped: ${outcome}`)
    return outcome
  })

  child.once("error", (err) => {
    Deferred.doneUnsafe(pidDeferred, Effect.succeed(undefined))
    Deferred.doneUnsafe(exited, Effect.succeed({ code: null, signal: null, problem: `guard: ${err.message}` }))
  })
  const report = child.stdio[REPORT_FD] as Readable | null
  let reportClosed = report === null
  report?.once("close", () => {
    reportClosed = true
  })
  child.once("exit", (code, signal) => {
    // The guard's last report may still be in the pipe: read it first (bounded) before falling back.
    const fallback = () => {
      Deferred.doneUnsafe(pidDeferred, Effect.succeed(undefined))
      const problem = `the guard exited (${signal ?? `code ${code}`}) without reporting the engine's exit`
      Deferred.doneUnsafe(exited, Effect.succeed({ code: null, signal: null, problem }))
    }
    if (reportClosed) fallback()
    else {
      const timer = setTimeout(fallback, 250)
      report?.once("close", () => {
        clearTimeout(timer)
        fallback()
      })
    }
  })
  if (report) {
    readline.createInterface({ input: report }).on("line", (line) => {
      const r = decodeReport(line)
      if (r?.t === "spawned") Deferred.doneUnsafe(pidDeferred, Effect.succeed(r.pid))
      else if (r?.t === "spawn-error") {
        Deferred.doneUnsafe(pidDeferred, Effect.succeed(undefined))
        Deferred.doneUnsafe(exited, Effect.succeed({ code: null, signal: null, problem: `spawn failed: ${r.message}` }))
      } else if (r?.t === "exit") {
        Deferred.doneUnsafe(exited, Effect.succeed({ code: r.code, signal: r.signal, problem: undefined }))
      } else if (r?.t === "stopped") guardOutcome = r.outcome
    })
    report.on("error", () => {})
  }
  child.stdin?.on("error", () => {})

  const pump = (stream: "stdout" | "stderr", input: Readable | null) =>
    input === null
      ? Effect.void
      : lines(input).pipe(
          Stream.runForEach((line) => {
            keep(`[${stream}] ${line}`)
            return Effect.logInfo(...engineOutput(line)).pipe(Effect.annotateLogs({ stream, run: options.run }))
          }),
          Effect.ignore
        )
  pumps.push(
    yield* Effect.forkDetach(pump("stdout", child.stdout)),
    yield* Effect.forkDetach(pump("stderr", child.stderr))
  )

  const run: EngineRun = {
    run: options.run,
    startedAt,
    pid: pidDeferred,
    guardPid: child.pid,
    exited,
    stop,
    lastLines: () => [...ring],
    drainOutput: drain
  }
  return run
})
