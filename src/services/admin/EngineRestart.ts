/**
 * EngineRestart: the pure part of `POST /engine/restart` (layers/admin/engineRestartRoute.ts), the operator's lever
 * for an engine the agent cannot see is wrong (new weights on disk, a wedge no probe catches) without restarting the
 * agent or its pod: the Ready run is stopped as any run is and the next one starts after the restart backoff. Calls in
 * flight end with the engine (UNAVAILABLE); cordon first and wait for them for a quiet restart. During a crash loop's
 * backoff it ends the wait, so a fix (the model file put in place) is tried now, not up to restart_backoff_max later.
 */
import type { EngineState, RestartOutcome } from "../engine/EngineProcess.ts"
import { adminStatus } from "./AdminAnswers.ts"

export const ENGINE_RESTART_PATH = "/engine/restart"

/** The reason the run's exit record and the log give for a restart asked for here. */
export const ADMIN_RESTART_REASON = `asked for over the admin API (POST ${ENGINE_RESTART_PATH})`

/**
 * Why a restart asked for now did nothing, in the operator's words: what the engine is doing, never the state's name
 * alone. A run an operator's restart is ending reads Unhealthy inside (its `ending` says it was asked for) while the
 * node reads `starting`, no fault: a second request then said "not ready (Unhealthy)", a fault that was not there.
 */
export const notRestartedWhy = (state: EngineState): string => {
  switch (state._tag) {
    case "Starting":
      // that run is already the attempt that picks a fix up (README, POST /engine/restart)
      return `the engine is starting (phase ${state.phase}, run ${state.run}): nothing was done; a starting run is not restarted`
    case "Unhealthy":
      if (state.ending?.kind === "requested")
        return `a restart is already under way (${state.ending.reason}): nothing was done`
      // torn down for a fault (the engine exited, liveness failed): its reason, and the restart that follows anyway
      return `the engine's run is ending (${state.reason}): nothing was done; the next run starts after the restart backoff`
    case "Restarting":
      return "the engine's next run is starting now: nothing was done"
    case "Stopping":
    case "Stopped":
      return "the agent is stopping the engine: nothing was done"
    case "Ready":
      // between a run's Ready and its watch taking requests, or a request that just ended it: a moment's window
      return "the engine's run is changing state: nothing was done; ask again"
  }
}

/**
 * What the route answers: the HTTP status and the JSON body, for each outcome (`draining`: refused before asking); a
 * refusal's status is the one table's (AdminAnswers.ts), the same as any other admin refusal of its kind.
 */
export const restartAnswer = (
  outcome: RestartOutcome | "draining",
  engineState: EngineState
): { readonly status: number; readonly body: Record<string, unknown> } => {
  switch (outcome) {
    case "restarting":
      return { status: 202, body: { restarting: true } }
    case "backoff-ended":
      // a crash loop's wait cut short: the next run starts now (the backoff's count is kept)
      return { status: 202, body: { restarting: true, backoffEnded: true } }
    case "not-ready":
      return { status: adminStatus.EngineNotReady, body: { error: notRestartedWhy(engineState) } }
    case "not-spawned":
      return {
        status: adminStatus.EngineNotSpawned,
        body: { error: "engine.kind = openai_compat: the agent does not run that server; restart it where it runs" }
      }
    case "draining":
      return {
        status: adminStatus.NodeDraining,
        body: { error: "the node is draining: the engine is stopped at the drain's end" }
      }
  }
}
