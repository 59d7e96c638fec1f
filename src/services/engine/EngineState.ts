/**
 * EngineState: the pure lifecycle of the engine supervisor. One transition function over the EngineState
 * tagged enum and the supervisor's events (a closed table: anything not listed is an InvalidTransition),
 * the restart backoff (exponential, capped, reset after a stable Ready period) with crash-loop detection,
 * and the liveness failure counter. No I/O and no clock: every time comes in on an event.
 */
import { Data, Duration, Result } from "effect"
import { formatBytes } from "../node/MemoryCgroup.ts"
import type { EngineState, ExitRecord, UnhealthyEnding } from "./EngineProcess.ts"

/** Constructors and matchers for the states. */
export const State = Data.taggedEnum<EngineState>()

/** What the supervisor observed or decided. Times are epoch milliseconds. */
export type SupervisorEvent = Data.TaggedEnum<{
  /** The engine process exists (pid known); it is loading. */
  Spawned: { readonly run: number; readonly pid: number | undefined; readonly at: number }
  /** A new startup phase to show (e.g. "loading", "waiting for probe"). */
  Phase: { readonly phase: string; readonly at: number }
  /** Readiness or liveness probe answered. */
  ProbeOk: { readonly at: number }
  /** Liveness failed `threshold` times in a row. */
  LivenessLost: { readonly reason: string; readonly at: number; readonly ending?: UnhealthyEnding }
  /** Not ready within the startup budget. */
  StartupTimedOut: { readonly budgetMs: number; readonly at: number }
  /** The run ended (exit, or killed after Unhealthy); the next run waits until `nextAt`; `failing`: see `failingReason`. */
  Exited: { readonly exit: ExitRecord; readonly attempt: number; readonly nextAt: number; readonly failing?: string }
  /** The backoff is over: start run `run`, shown in `phase` ("spawning", or "probing" for a proxied server). */
  RestartDue: { readonly run: number; readonly phase: string; readonly at: number }
  StopRequested: { readonly at: number }
  StopCompleted: { readonly lastExit: ExitRecord | undefined }
}>

export const Event = Data.taggedEnum<SupervisorEvent>()

export class InvalidTransition extends Data.TaggedError("InvalidTransition")<{
  readonly from: EngineState["_tag"]
  readonly event: SupervisorEvent["_tag"]
}> {
  override get message(): string {
    return `invalid engine state transition: ${this.event} in ${this.from}`
  }
}

/** The `failing` field to spread into a state (absent, not undefined, when there is none). */
const failingField = (failing: string | undefined): { readonly failing?: string } =>
  failing === undefined ? {} : { failing }

/** Why the engine is shown as failed, while it is (Starting or Restarting after a run of failures). */
export const failingOf = (s: EngineState): string | undefined =>
  s._tag === "Starting" || s._tag === "Restarting" ? s.failing : undefined

const runOf = (s: EngineState): number | undefined =>
  s._tag === "Starting" || s._tag === "Ready" || s._tag === "Unhealthy" ? s.run : undefined

/**
 * The transition table. A result equal (===) to the input means "no change, publish nothing".
 * Stopping absorbs nothing but StopCompleted (and repeated stop requests): late events of a run that is being
 * torn down are rejected, which is what keeps a concurrent observer from resurrecting a stopping engine.
 */
export const transition = (
  state: EngineState,
  event: SupervisorEvent
): Result.Result<EngineState, InvalidTransition> => {
  const ok = Result.succeed
  const invalid = () => Result.fail(new InvalidTransition({ from: state._tag, event: event._tag }))
  switch (event._tag) {
    case "Spawned":
      return state._tag === "Starting" && state.run === event.run
        ? ok(State.Starting({ phase: "loading", since: state.since, run: state.run, ...failingField(state.failing) }))
        : invalid()
    case "Phase":
      return state._tag === "Starting"
        ? ok(state.phase === event.phase ? state : State.Starting({ ...state, phase: event.phase }))
        : invalid()
    case "ProbeOk":
      if (state._tag === "Ready") return ok(state)
      // Not from Unhealthy: every way into it ends the run (layers/engine/watch.ts), so a probe that answers during the
      // teardown is late news of a run that is going, and must not show it Ready again.
      return state._tag === "Starting" ? ok(State.Ready({ since: event.at, run: state.run })) : invalid()
    case "LivenessLost":
      return state._tag === "Ready"
        ? ok(
            State.Unhealthy({
              reason: event.reason,
              since: event.at,
              run: state.run,
              ...(event.ending === undefined ? {} : { ending: event.ending })
            })
          )
        : invalid()
    case "StartupTimedOut":
      return state._tag === "Starting"
        ? ok(State.Unhealthy({ reason: `not ready within ${event.budgetMs} ms`, since: event.at, run: state.run }))
        : invalid()
    case "Exited": {
      const run = runOf(state)
      return run !== undefined && run === event.exit.run
        ? ok(
            State.Restarting({
              attempt: event.attempt,
              nextAt: event.nextAt,
              lastExit: event.exit,
              ...failingField(event.failing)
            })
          )
        : invalid()
    }
    case "RestartDue":
      return state._tag === "Restarting" && event.run === state.lastExit.run + 1
        ? ok(State.Starting({ phase: event.phase, since: event.at, run: event.run, ...failingField(state.failing) }))
        : invalid()
    case "StopRequested":
      if (state._tag === "Stopping" || state._tag === "Stopped") return ok(state)
      return ok(State.Stopping({ since: event.at }))
    case "StopCompleted":
      if (state._tag === "Stopped") return ok(state)
      return state._tag === "Stopping" ? ok(State.Stopped({ lastExit: event.lastExit })) : invalid()
  }
}

/**
 * The log line of a state change. The tags alone read an operator's `POST /engine/restart` as a fault
 * (`engine Ready -> Unhealthy`) and a new start-up phase as no change (`engine Starting -> Starting`), so an
 * Unhealthy state says why (its reason: `restart requested: ...`, `the engine exited (...)`, a liveness failure),
 * and a change within Starting names the phases (`engine Starting: phase loading -> waiting for port`). The other
 * lines stay the tags alone: their why is the next line (an exit's) or needs no words (`engine Starting -> Ready`).
 */
export const stateChangeMessage = (from: EngineState, to: EngineState): string => {
  if (from._tag === "Starting" && to._tag === "Starting") return `engine Starting: phase ${from.phase} -> ${to.phase}`
  const line = `engine ${from._tag} -> ${to._tag}`
  return to._tag === "Unhealthy" ? `${line}: ${to.reason}` : line
}

/**
 * The line that ends a series of failed runs: run `run` became Ready after `failed` runs in a row that ended before
 * being stable (a crash loop from `crashLoopAfter` on: the node is no longer shown failing). Without it the end of a
 * crash loop showed only as a `Starting -> Ready` line that no longer carried `failing`. The backoff's count is kept
 * until the run has been Ready for `stableAfterMs` (engine.restart_stable_after), so the line says so: it said "the
 * crash loop is over", and an end of the run minutes later was logged `(crash loop)` with a long wait (a soak review).
 */
export const readyAfterFailuresMessage = (
  run: number,
  failed: number,
  crashLoopAfter: number,
  stableAfterMs: number
): string =>
  `engine run ${run} ready after ${failed} failed ${failed === 1 ? "run" : "runs"} in a row` +
  (failed >= crashLoopAfter ? "; no longer failing" : "") +
  `; the restart backoff starts over once it has been ready ${Duration.format(Duration.millis(stableAfterMs))} (engine.restart_stable_after)`

/** Restart policy, from [engine].restart_backoff_initial / restart_backoff_max / restart_stable_after. */
export interface BackoffPolicy {
  readonly initialMs: number
  readonly maxMs: number
  readonly stableAfterMs: number
  /** Consecutive unstable runs from which the restarts are reported as a crash loop. */
  readonly crashLoopAfter: number
}

export interface RestartPlan {
  /** The backoff's step: 1 for the first restart after a stable run, +1 for each unstable run after it. */
  readonly attempt: number
  /**
   * Runs in a row that ended before being stable (0 when this one was stable): the crash loop's count. Not the
   * attempt, which is already 1 after a stable run, so the third restart after one counted three runs where two
   * had failed (a soak against llama-server reported the crash loop one crash early).
   */
  readonly unstableRuns: number
  readonly delayMs: number
  readonly crashLoop: boolean
}

/** Before the first restart. */
export const noRestartYet: Pick<RestartPlan, "attempt" | "unstableRuns"> = { attempt: 0, unstableRuns: 0 }

/** Whether a run counts as stable: it was Ready for at least stableAfterMs before it ended. */
export const wasStable = (policy: BackoffPolicy, readyAt: number | undefined, endedAt: number): boolean =>
  readyAt !== undefined && endedAt - readyAt >= policy.stableAfterMs

/** The delay of restart attempt `attempt` (1-based): initial * 2^(attempt-1), capped at max. */
export const backoffDelay = (policy: BackoffPolicy, attempt: number): number => {
  const exp = Math.min(Math.max(attempt - 1, 0), 52)
  return Math.min(policy.initialMs * 2 ** exp, policy.maxMs)
}

/** The next restart after a run ended; `previous` is the last plan (noRestartYet before the first restart). */
export const nextRestart = (
  policy: BackoffPolicy,
  previous: Pick<RestartPlan, "attempt" | "unstableRuns">,
  readyAt: number | undefined,
  endedAt: number,
  /**
   * An operator ended the run (POST /engine/restart): no failure of the engine's, so it counts as a stable end (the
   * first delay, no crash loop), however soon after Ready it came. A stall restart is the engine's failure: counted.
   */
  operatorAsked = false
): RestartPlan => {
  const stable = operatorAsked || wasStable(policy, readyAt, endedAt)
  const attempt = stable ? 1 : previous.attempt + 1
  const unstableRuns = stable ? 0 : previous.unstableRuns + 1
  return {
    attempt,
    unstableRuns,
    delayMs: backoffDelay(policy, attempt),
    crashLoop: unstableRuns >= policy.crashLoopAfter
  }
}

/** "; hint: ..." when the run's exit has one (services/engine/ExitHints.ts), else nothing. */
const hintOf = (exit: Pick<ExitRecord, "hint">): string => (exit.hint === undefined ? "" : `; hint: ${exit.hint}`)

/**
 * Why the engine counts as failed after a run ended, or undefined: from the crash-loop threshold on (that many
 * runs in a row ended before being stable), so an engine that cannot be started (ENOENT) or keeps crashing is
 * reported, not only retried.
 */
export const failingReason = (plan: RestartPlan, exit: ExitRecord): string | undefined =>
  plan.crashLoop
    ? `engine failing: ${plan.unstableRuns} runs in a row ended before being stable, the last: ${exit.reason} ` +
      `(${describeStatus(exit)})${hintOf(exit)}; still retrying with backoff`
    : undefined

/** One liveness probe result folded into the consecutive-failure count. */
export const livenessStep = (
  failures: number,
  ok: boolean,
  threshold: number
): { readonly failures: number; readonly lost: boolean } => {
  const next = ok ? 0 : failures + 1
  return { failures: next, lost: next >= threshold }
}

/**
 * "exit code 1" / "signal SIGKILL" / "no exit status", and the OOM killer's part when its count in the agent's
 * memory cgroup rose during the run: an engine that exited on a SIGKILL was killed by it; any other end (a worker
 * killed and the leader exiting after it, a stop of a wedged engine) says only that kills happened. Nothing when
 * the count did not rise or is unknown.
 */
export const describeStatus = (
  exit: Pick<ExitRecord, "code" | "signal" | "endedBy" | "oomKills" | "memoryLimitBytes">
): string => {
  const status =
    exit.signal !== null ? `signal ${exit.signal}` : exit.code !== null ? `exit code ${exit.code}` : "no exit status"
  const kills = exit.oomKills ?? 0
  if (kills === 0) return status
  const limit = exit.memoryLimitBytes === undefined ? "" : `limit ${formatBytes(exit.memoryLimitBytes)}`
  if (exit.signal === "SIGKILL" && exit.endedBy.kind === "exited")
    return (
      `${status}, killed by the kernel's OOM killer ` +
      `(${kills} ${kills === 1 ? "kill" : "kills"} in the agent's memory cgroup${limit === "" ? "" : `, ${limit}`})`
    )
  return (
    `${status}, ${kills} OOM ${kills === 1 ? "kill" : "kills"} in the agent's memory cgroup during this run` +
    (limit === "" ? "" : ` (${limit})`)
  )
}

/** One log line for an ended run: reason, status, runtime, and the config key that fixes it when one is known. */
export const describeExit = (exit: ExitRecord): string =>
  `run ${exit.run} (pid ${exit.pid ?? "-"}) ended: ${exit.reason}, ${describeStatus(exit)}, after ${(exit.runtimeMs / 1000).toFixed(1)} s` +
  hintOf(exit)

/**
 * The level of a run's end line, from how it ended (its `endedBy`), not from its words: `Info` for a restart an
 * operator asked for (POST /engine/restart), an intended action and no fault, so that a warning stays worth reading;
 * `Error` once runs fail in a row (`failing`, see failingReason); `Warn` for any other end (the engine exited, failed
 * liveness, the stall restart).
 */
export const exitLogLevel = (
  exit: Pick<ExitRecord, "endedBy">,
  failing: string | undefined
): "Info" | "Warn" | "Error" =>
  exit.endedBy.kind === "requested" && exit.endedBy.source === "admin"
    ? "Info"
    : failing === undefined
      ? "Warn"
      : "Error"
