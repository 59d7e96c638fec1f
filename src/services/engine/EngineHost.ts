/**
 * EngineHost: what the supervisor does to the machine for one engine run, and nothing else: spawn the run (a
 * scoped resource whose release is the teardown) and probe the engine's HTTP endpoint once. It is the
 * supervisor's one seam: the live host (layers/engine/EngineHost.ts) spawns through the orphan guard and
 * fetches; a test passes a fake whose runs and probes it scripts, and drives the same supervisor on a TestClock.
 */
import { Context, Deferred, Effect, type Scope } from "effect"
import type { LaunchPlan, ReadinessProbe } from "./Engine.ts"
import type { StopOutcome } from "./GuardProtocol.ts"

export interface RunExit {
  readonly code: number | null
  readonly signal: string | null
  /** Set when the engine never started (e.g. ENOENT) or the guard died before reporting. */
  readonly problem: string | undefined
}

/**
 * Who holds the listening socket on the engine's port: a process of the run's group, another process (its
 * answers are not the engine's), or unknown (nothing to tell by: no /proc, the socket not visible).
 */
export type PortHolder = "engine" | "other" | "unknown"

/** One spawned run, alive for the scope it was spawned in. */
export interface EngineRun {
  /** When it was spawned (epoch ms, Effect Clock). */
  readonly startedAt: number
  readonly guardPid: number | undefined
  /** The engine's pid (= its process group id), once known; undefined when it could not be spawned. */
  readonly pid: Deferred.Deferred<number | undefined>
  readonly exited: Deferred.Deferred<RunExit>
  /** The last lines the engine printed, tagged `[stdout]` / `[stderr]`. */
  readonly lastLines: Effect.Effect<ReadonlyArray<string>>
  /** Stops the group (one TERM, grace, KILL, confirmed) and waits for it; idempotent and bounded. */
  readonly stop: Effect.Effect<StopOutcome>
  /** Waits (bounded) for the output pipes to deliver what is buffered, so lastLines is complete. */
  readonly drainOutput: (ms: number) => Effect.Effect<void>
  /** Who listens on `port` now; "unknown" until the pid is known. */
  readonly portHolder: (port: number) => Effect.Effect<PortHolder>
  /**
   * Whether a process of the run's group is alive now (false before its pid is known): after a stop that found the
   * group survived SIGKILL (a process stuck in the kernel), the next run waits until this is false.
   */
  readonly groupAlive: Effect.Effect<boolean>
}

export interface SpawnOptions {
  readonly run: number
  readonly graceMs: number
  readonly linesKept: number
}

export type ProbeResult =
  | { readonly ok: true }
  | {
      readonly ok: false
      readonly reason: string
      /** "waiting for port", "loading", "unauthorized" (401/403), "probe timeout", or "unreachable (<why>)". */
      readonly phase: string
      /**
       * The probe never reached the engine: the agent's host could not open its connection (HostShortage.ts), which
       * says nothing of the engine. Not Ready yet at start; neither a liveness failure nor a pass.
       */
      readonly inconclusive?: true
    }

export interface EngineHostService {
  /** Spawns one run of the plan; closing the scope tears it down (the group stopped and confirmed gone). */
  readonly spawn: (plan: LaunchPlan, options: SpawnOptions) => Effect.Effect<EngineRun, never, Scope.Scope>
  /** One readiness/liveness attempt; never fails ("not yet" carries a reason and a startup phase). */
  readonly probe: (probe: ReadinessProbe, timeoutMs: number) => Effect.Effect<ProbeResult>
}

export class EngineHost extends Context.Service<EngineHost, EngineHostService>()("cgn-agent/EngineHost") {}

/** A Deferred's value if it is already completed, else undefined: for reading what a run reported by now. */
export const valueIfDone = <A>(d: Deferred.Deferred<A>): Effect.Effect<A | undefined> =>
  Effect.flatMap(Deferred.isDone(d), (done) => (done ? Deferred.await(d) : Effect.undefined))
