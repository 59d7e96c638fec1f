/**
 * EngineProcess: the supervisor of the one engine. Owns the process group, readiness and liveness
 * probes, restarts with backoff, the kill sequence and the orphan guard; it alone writes the state.
 * openai_compat runs the same state machine with nothing spawned.
 */
import { Context, type Data, type Effect, Ref, Schema, Stream, SubscriptionRef } from "effect"
import type { LaunchPlan } from "./Engine.ts"

/**
 * How a run ended, as data: the supervisor writes it (layers/engine/runOnce.ts, watch.ts) into ExitRecord.endedBy, and
 * readers switch on it (services/grpc/EngineCut.ts tells a caller why its engine request broke off); RunEndWords
 * renders it for /status and the log. `exited`: the engine ended by itself (the record's code and signal say how);
 * `failed`: the run ended with no exit status (the guard or the engine could not be spawned, or the guard ended
 * without reporting the engine's exit), `problem` says which; the others: the agent ended it (a restart asked for,
 * failed liveness, the startup budget spent, its stop).
 */
export type RunEnd =
  | { readonly kind: "exited" }
  | { readonly kind: "failed"; readonly problem: string }
  | RequestedEnd
  | { readonly kind: "unhealthy"; readonly reason: string }
  | { readonly kind: "startupTimeout" }
  | { readonly kind: "stopped" }

/** A restart asked for (EngineProcess.restart) ending the Ready run: its Unhealthy ending, then the run's end. */
export interface RequestedEnd extends RestartRequest {
  readonly kind: "requested"
}

/**
 * Why a Ready run is being torn down when no probe said so (the Unhealthy state's `ending`): the engine exited (its
 * status as EngineState.describeStatus words it without the OOM killer's part, read only once the group is gone), or
 * a restart was asked for.
 */
export type UnhealthyEnding = { readonly kind: "exited"; readonly status: string } | RequestedEnd

/**
 * The words of a run's end, for rendering only: what /status, the log and a cut call say. The data is RunEnd and
 * UnhealthyEnding; nothing reads these words back.
 */
export const RunEndWords = {
  /** ExitRecord.reason: "exited", "restarted: <the request's reason>", "unhealthy: <the probes' verdict>", ... */
  record: (end: RunEnd): string => {
    switch (end.kind) {
      case "exited":
        return "exited"
      case "failed":
        return end.problem
      case "requested":
        return `restarted: ${end.reason}`
      case "unhealthy":
        return `unhealthy: ${end.reason}`
      case "startupTimeout":
        return "startup timeout"
      case "stopped":
        return "stopped"
    }
  },
  /** The Unhealthy state's reason while the run is torn down. */
  ending: (ending: UnhealthyEnding): string =>
    ending.kind === "requested"
      ? `restart requested: ${ending.reason}`
      : `${RunEndWords.exited(ending.status)}; stopping its process group`,
  /**
   * An engine that ended by itself, its status as EngineState.describeStatus words it ("exit code 137", "signal
   * SIGKILL", and the OOM killer's part when known): the Unhealthy reason while its group is stopped (then "; stopping
   * its process group") and a cut call's words, so both read the same.
   */
  exited: (status: string): string => `the engine exited (${status})`
} as const

/** How one run of the engine ended; kept for forensics (/status) and crash-loop logs. */
export interface ExitRecord {
  /** 0 for the first run, +1 per restart. */
  readonly run: number
  readonly pid: number | undefined
  readonly code: number | null
  readonly signal: string | null
  readonly startedAt: number
  readonly endedAt: number
  readonly runtimeMs: number
  /** Why the run ended, in words (RunEndWords.record of `endedBy`): "exited", "unhealthy: ...", "stopped". */
  readonly reason: string
  /** Why the run ended, as data (what readers switch on; `reason` renders it). */
  readonly endedBy: RunEnd
  /** The last lines the engine printed (stdout and stderr, tagged). */
  readonly lastLines: ReadonlyArray<string>
  /**
   * The kills the kernel's OOM killer made in the agent's memory cgroup (the engine's too) from the run's spawn to
   * its end; undefined when unknown (no cgroup found, the count unreadable) or nothing was spawned.
   */
  readonly oomKills: number | undefined
  /** The memory cgroup's limit at the run's end, bytes; undefined when there is none or it is unknown. */
  readonly memoryLimitBytes: number | undefined
  /**
   * What to change in the agent's config when the engine died of one of its well-known start failures (the backend's
   * LaunchPlan.exitHints matched a last line); undefined when none matched or the run did not end by itself.
   */
  readonly hint?: string | undefined
}

/**
 * Why the supervisor cannot start (or keep) the engine; only layer construction fails with it. `reason` is for code
 * and tests to switch on; the message is `detail` alone, which says it in the operator's words: it ends `run` as its
 * fatal log line (programs/fatal.ts), where the tag ("engine process: AnotherAgent: ...") read as internal jargon.
 */
export class EngineProcessError extends Schema.TaggedError<EngineProcessError>()("EngineProcessError", {
  reason: Schema.Literals(["StateDir", "PortBusy", "AnotherAgent", "StaleEngine"]),
  detail: Schema.String
}) {
  override get message(): string {
    return `engine process: ${this.detail}`
  }
}

/**
 * The lifecycle, one tagged value at a time. Times are epoch milliseconds. `failing` (Starting, Restarting):
 * set once several runs in a row ended before being stable (the command does not exist, the engine keeps
 * crashing): the supervisor still retries with the capped backoff, but the node shows as failed until a run
 * becomes Ready. It says why.
 */
export type EngineState = Data.TaggedEnum<{
  /** Spawned (or, for openai_compat, probing) and waiting for readiness. */
  Starting: {
    readonly phase: string
    readonly since: number
    readonly run: number
    readonly failing?: string
  }
  Ready: { readonly since: number; readonly run: number }
  /**
   * Ready before, now failing liveness; a restart follows unless it recovers. `ending`: not a probe's verdict but
   * a run being torn down for certain: the engine exited, or a restart was asked for (EngineProcess.restart).
   */
  Unhealthy: {
    readonly reason: string
    readonly since: number
    readonly run: number
    readonly ending?: UnhealthyEnding
  }
  /** Waiting out the backoff before the next run. */
  Restarting: {
    readonly attempt: number
    readonly nextAt: number
    readonly lastExit: ExitRecord
    readonly failing?: string
  }
  Stopping: { readonly since: number }
  Stopped: { readonly lastExit: ExitRecord | undefined }
}>

export interface EngineProcessService {
  readonly plan: LaunchPlan
  /** The state now. */
  readonly state: Effect.Effect<EngineState>
  /** The state now, then every change. */
  readonly changes: Stream.Stream<EngineState>
  /** Completes when the engine is Ready (at once if it is). */
  readonly awaitReady: Effect.Effect<void>
  /** Restarts since the agent started. */
  readonly restarts: Effect.Effect<number>
  /** The engine's pid (its process group) while a run is alive; undefined between runs and for openai_compat. */
  readonly pid: Effect.Effect<number | undefined>
  /** The most recent runs' exits, newest first (bounded). */
  readonly exits: Effect.Effect<ReadonlyArray<ExitRecord>>
  /**
   * Ends the Ready run (stopped as any run is: TERM to the group, KILL after stop_grace) with `reason` as its exit
   * reason; the supervisor starts the next run as after any exit, with the restart backoff. For an engine that is
   * there but no longer answering (wedged): a new run is the only cure the agent has. An operator's request while
   * the supervisor waits out a backoff ends the wait instead (the fix of a crash loop tried at once).
   */
  readonly restart: (source: RestartSource, reason: string) => Effect.Effect<RestartOutcome>
  /** Stops the engine (TERM to the group, KILL after stop_grace) and confirms the group is gone; idempotent. */
  readonly stop: Effect.Effect<void>
}

/**
 * What a restart request did: `restarting`: the Ready run is being ended (this request or one just before it);
 * `backoff-ended`: an operator's request (source `admin`) while the supervisor waited out a restart backoff (a crash
 * loop): the wait is over and the next run starts now, the backoff's count kept (a still-broken engine keeps backing
 * off); `not-ready`: no run is Ready and none is waited for (starting, already ending, stopping), or a stall restart
 * in a backoff: nothing was done; `not-spawned`: a proxied server (openai_compat), which the agent cannot restart.
 */
export type RestartOutcome = "restarting" | "backoff-ended" | "not-ready" | "not-spawned"

/** Who asked for a restart: the stall restart (engine.stall_restart_after) or an operator (POST /engine/restart). */
export const RestartSources = ["stall", "admin"] as const
export type RestartSource = (typeof RestartSources)[number]

/** A restart asked for: by whom, and the reason the run's exit record and the log give. */
export interface RestartRequest {
  readonly source: RestartSource
  readonly reason: string
}

/**
 * The service over the supervisor's refs: the one writer (live supervisor or test control) owns `state`,
 * `restarts` and `exits`; readers get snapshots and the change stream.
 */
export const fromRefs = (refs: {
  readonly plan: LaunchPlan
  readonly state: SubscriptionRef.SubscriptionRef<EngineState>
  readonly restarts: Ref.Ref<number>
  readonly exits: Ref.Ref<ReadonlyArray<ExitRecord>>
  readonly pid: Ref.Ref<number | undefined>
  readonly restart: (source: RestartSource, reason: string) => Effect.Effect<RestartOutcome>
  readonly stop: Effect.Effect<void>
}): EngineProcessService => ({
  plan: refs.plan,
  state: SubscriptionRef.get(refs.state),
  changes: SubscriptionRef.changes(refs.state),
  awaitReady: SubscriptionRef.changes(refs.state).pipe(
    Stream.filter((s) => s._tag === "Ready"),
    Stream.take(1),
    Stream.runDrain
  ),
  restarts: Ref.get(refs.restarts),
  exits: Ref.get(refs.exits),
  pid: Ref.get(refs.pid),
  restart: refs.restart,
  stop: refs.stop
})

export class EngineProcess extends Context.Service<EngineProcess, EngineProcessService>()("cgn-agent/EngineProcess") {}
