/**
 * EngineRestart: the pure part of `POST /engine/restart` (layers/admin/engineRestartRoute.ts), the operator's lever
 * for an engine the agent cannot see is wrong (new weights on disk, a wedge no probe catches) without restarting the
 * agent or its pod: the Ready run is stopped as any run is and the next one starts after the restart backoff. Calls in
 * flight end with the engine (UNAVAILABLE); cordon first and wait for them for a quiet restart. During a crash loop's
 * backoff it ends the wait, so a fix (the model file put in place) is tried now, not up to restart_backoff_max later.
 */
import type { RestartOutcome } from "../engine/EngineProcess.ts"

export const ENGINE_RESTART_PATH = "/engine/restart"

/** The reason the run's exit record and the log give for a restart asked for here. */
export const ADMIN_RESTART_REASON = `asked for over the admin API (POST ${ENGINE_RESTART_PATH})`

/** What the route answers: the HTTP status and the JSON body, for each outcome (`draining`: refused before asking). */
export const restartAnswer = (
  outcome: RestartOutcome | "draining",
  engineState: string
): { readonly status: number; readonly body: Record<string, unknown> } => {
  switch (outcome) {
    case "restarting":
      return { status: 202, body: { restarting: true } }
    case "backoff-ended":
      // a crash loop's wait cut short: the next run starts now (the backoff's count is kept)
      return { status: 202, body: { restarting: true, backoffEnded: true } }
    case "not-ready":
      return {
        status: 409,
        body: {
          error: `the engine is not ready (${engineState}): nothing was done; a run that is starting or ending is not restarted`
        }
      }
    case "not-spawned":
      return {
        status: 409,
        body: { error: "engine.kind = openai_compat: the agent does not run that server; restart it where it runs" }
      }
    case "draining":
      return { status: 409, body: { error: "the node is draining: the engine is stopped at the drain's end" } }
  }
}
