/**
 * FailedCalls: an engine that fails every call (HTTP 500 to each request, a refused connection, every stream broken
 * off) while its health endpoint answers. Each call's own status says so, but the node read `ready`: a node that
 * fails 100% of calls in milliseconds, lowest latency and no load, drew the routers' traffic. Calls the engine failed
 * (services/grpc/GrpcStatus.ts engineFailedCall: the one table decides which) are counted in a row; a call that
 * completes ends the run. At engine.failed_calls_unhealthy in a row the engine is taken as failing calls, a source of
 * EngineStall's state beside the stalled streams, the progress counters and the test completion: the node unhealthy
 * with the reason, the agent's test completion sent to clear it, and a restart after engine.stall_restart_after.
 * Calls clear it only once as many complete in a row (failingCleared): cleared by any one, an engine failing most of
 * the calls a router still sends took the node in and out of traffic many times a minute (16 episodes a minute at 80%
 * errors in a soak); the test, sent when no call is in flight (a router stopped sending), clears it at once.
 * Calls that end otherwise (4xx, the caller's cancel or deadline, the agent's refusals) neither count nor end the run.
 * Still it flapped at high error rates (7 episodes a minute at 80%, never restarted): trips are damped
 * (FlapDamping.ts), and an engine taken as failing again and again is held so (`heldUntil`), neither calls nor the
 * test clearing it.
 * Pure: the live EngineStall keeps the run between the watchdog's ticks.
 */

/** Calls the engine failed in a row since a call last completed, and the status message of the last of them. */
export interface FailedRun {
  readonly calls: number
  readonly last: string
}

/** The engine taken as failing calls (EngineStall's `failing`). */
export interface FailingCalls {
  /** When it was so taken (epoch ms): the tick that saw the run reach the threshold. */
  readonly since: number
  /** The run then. */
  readonly calls: number
  /** The last failed call's status message ("engine answered HTTP 500 (InternalServerError): ..."). */
  readonly last: string
  /**
   * Held for flapping (FlapDamping.ts) until about then (epoch ms, a whole minute: FlapDamping.aboutUntil), later if
   * it goes on flapping; absent or undefined: not held.
   */
  readonly heldUntil?: number | undefined
}

/**
 * `calls` more calls the engine failed after `run` (undefined: none since the last completion), the last of them
 * with `last`: the run, and the engine as failing calls when the run reaches `threshold` (engine.failed_calls_unhealthy;
 * 0: never) at `now`.
 */
export const addFailed = (
  run: FailedRun | undefined,
  calls: number,
  last: string,
  threshold: number,
  now: number
): readonly [FailedRun | undefined, FailingCalls | undefined] => {
  if (calls <= 0) return [run, undefined]
  const next = { calls: (run?.calls ?? 0) + calls, last }
  return [next, threshold > 0 && next.calls >= threshold ? { since: now, ...next } : undefined]
}

/** Decode legs the engine failed before their first text in a row (FailedRun), and the prefill nodes they read from. */
export interface HandoffRun extends FailedRun {
  readonly peers: ReadonlyArray<string>
}

/**
 * `calls` more such legs after `run`, reading from `peers`: the run, and once it reaches `threshold`
 * (engine.failed_calls_unhealthy; 0: never) what judges it, a new run beginning. From one prefill node they may be its
 * failures (crashed, restarted, drained): the engine's own test, which reads no KV, says whether they are this
 * engine's ("test"). From two or more, with no call completing between them, the prefill nodes are not all at fault:
 * this engine's KV path is ("engine"), which its test could not show.
 */
export const addHandoffFailed = (
  run: HandoffRun | undefined,
  calls: number,
  last: string,
  peers: ReadonlyArray<string>,
  threshold: number
): {
  readonly run: HandoffRun | undefined
  readonly due?: { readonly by: "test" | "engine"; readonly run: HandoffRun }
} => {
  if (calls <= 0) return { run }
  const next = { calls: (run?.calls ?? 0) + calls, last, peers: [...new Set([...(run?.peers ?? []), ...peers])] }
  if (threshold <= 0 || next.calls < threshold) return { run: next }
  return { run: undefined, due: { by: next.peers.length >= 2 ? "engine" : "test", run: next } }
}

/** A run of decode legs' failures taken as the engine's: the last one's words, and why. */
export const handoffsAsEngines = (run: HandoffRun): string =>
  `${run.last} (decode legs reading from ${run.peers.length} prefill nodes, ${run.peers.join(", ")}, failed before their first token with no call completing: this engine's KV transfer fails)`

/** The node's reason while the engine is taken as failing calls. */
export const failingProblem = (f: FailingCalls): string =>
  `engine failing calls${
    f.heldUntil === undefined
      ? ""
      : `, held for flapping until about ${new Date(f.heldUntil).toISOString().slice(11, 16)} UTC (taken as failing again and again: neither completed calls nor the test clear it before then)`
  }: the last ${f.calls} calls failed in the engine with none completed (engine.failed_calls_unhealthy), the last with: ${f.last}`

/**
 * Whether calls completed in a row (none failed by the engine after them: `completedInRow`) clear an engine taken as
 * failing calls: as many as made it failing (`threshold`, engine.failed_calls_unhealthy). The agent's test completion
 * clears it at once, not through this.
 */
export const failingCleared = (completedInRow: number, threshold: number): boolean => completedInRow >= threshold
