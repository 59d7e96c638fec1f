/**
 * EngineStatus: every decision about an engine's failure, made once, in one row: the engine's HTTP status (or a
 * stream's error object's numeric code, read the same) picks its row in `engineStatusTable`, a status of no row its
 * range's; a failure with no status to go by, its reason's row (`noStatusTable`); an output fault, whatever its
 * status, `outputFault`. Each row gives at once:
 *
 * - `code`: the gRPC code the call ends with (README, "Situation | Status").
 * - `retryElsewhere`: whether another node may take the call (`cgn-retryable` when nothing went out yet,
 *   StatusMessage.ts asSent): true for what another node may well not have (its engine down, slow, overloaded or
 *   broken), false for the request's own faults and what the engine does not do, which another engine would refuse
 *   too.
 * - `failsCall`: whether the call counts as one the engine failed, against the node (engine.failed_calls_unhealthy:
 *   ActiveCalls, EngineStall): an engine that is broken, not one the request made fail, one too busy for now, no
 *   answer in time (the stall watchdog's), nor an output fault.
 *
 * Changing how a status is treated is changing its row; GrpcStatus.ts (httpStatusToGrpc, engineFailure,
 * engineFailedCall) only reads them. Not here: what depends on the error's kind and not its status (`cgn-reason`,
 * the message, GrpcStatus.ts), nor which errors are output faults (EngineErrors.ts markOutputFault: by the engine's
 * message, never by status). Pure, no I/O.
 */
import { Status } from "nice-grpc-common"
import type { EngineError } from "../engine/EngineClient.ts"

/** What the agent does with one engine failure. */
export interface EngineDecisions {
  readonly code: Status
  readonly retryElsewhere: boolean
  readonly failsCall: boolean
  /** Set where the failure is the agent's own and not the engine's: `cgn-error-source` agent with this `cgn-reason`. */
  readonly agentReason?: string
}

/** The statuses with a row of their own; every other status falls in its range's row. */
export const EXPLICIT_STATUSES = [400, 401, 403, 404, 408, 413, 422, 429, 501, 503] as const
export type ExplicitStatus = (typeof EXPLICIT_STATUSES)[number]

/**
 * "5xx": 500 and above (anything an engine answers there is its server failing); "other": any other status without
 * a row of its own (another 4xx such as 405 or 409, a 1xx-3xx sent as an error, a stream error's odd code).
 */
export type StatusRange = "5xx" | "other"
export type EngineStatusKey = ExplicitStatus | StatusRange

/** One row per explicit status and per range, checked exhaustive by its type. */
export const engineStatusTable: { readonly [K in EngineStatusKey]: EngineDecisions } = {
  // The request's own fault (vLLM's BadRequestError, FastAPI's validation): another engine refuses it too (README,
  // `cgn-retryable`: "not the request (invalid, too large, an engine's 400/404/413/422 or 501)").
  400: { code: Status.INVALID_ARGUMENT, retryElsewhere: false, failsCall: false },
  422: { code: Status.INVALID_ARGUMENT, retryElsewhere: false, failsCall: false },
  // The engine refuses the agent's key (engine.api_key unset, or not the engine's), and so every call: the node's
  // fault, never the caller's (INTERNAL: the agent and engine disagree), so counted; another node's agent and engine
  // may well agree. llama-server's and SGLang's readiness (/health) needs no key, so calls alone can show it.
  401: { code: Status.INTERNAL, retryElsewhere: true, failsCall: true },
  403: { code: Status.INTERNAL, retryElsewhere: true, failsCall: true },
  // A model or path the engine does not have: the request's.
  404: { code: Status.NOT_FOUND, retryElsewhere: false, failsCall: false },
  // The engine gave up waiting: slow here, maybe not elsewhere; no answer in time is the stall watchdog's to judge.
  408: { code: Status.DEADLINE_EXCEEDED, retryElsewhere: true, failsCall: false },
  // Too large for the engine: the request's size, which another engine of the cluster refuses too.
  413: { code: Status.RESOURCE_EXHAUSTED, retryElsewhere: false, failsCall: false },
  // Overloaded here, maybe not elsewhere; busy, not broken.
  429: { code: Status.RESOURCE_EXHAUSTED, retryElsewhere: true, failsCall: false },
  // What the engine does not do: no other engine of the cluster does it either.
  501: { code: Status.UNIMPLEMENTED, retryElsewhere: false, failsCall: false },
  // An engine turning calls away for now, not one that is broken: vLLM's admission with --max-queued-requests ("The
  // request queue is full.", HTTP 503, or a stream's first error event with code 503), llama-server while it loads.
  // Counted, a busy engine's refusals between two completions would flap the node.
  503: { code: Status.UNAVAILABLE, retryElsewhere: true, failsCall: false },
  // The engine's server failing: another node's may not be; counted.
  "5xx": { code: Status.UNAVAILABLE, retryElsewhere: true, failsCall: true },
  // 409 and the rest mean the agent and engine disagree (config, auth): not the caller's fault, so INTERNAL; another
  // node's may not. Not counted (README, engine.failed_calls_unhealthy: "Not another 4xx").
  other: { code: Status.INTERNAL, retryElsewhere: true, failsCall: false }
}

/** The row a status falls in: its own, else its range's. */
export const engineStatusKey = (status: number): EngineStatusKey =>
  (EXPLICIT_STATUSES as ReadonlyArray<number>).includes(status)
    ? (status as ExplicitStatus)
    : status >= 500
      ? "5xx"
      : "other"

/** The decisions for an engine HTTP status, or a stream error object's numeric code. */
export const engineStatus = (status: number): EngineDecisions => engineStatusTable[engineStatusKey(status)]

/** A failure with no status to go by, by its reason (EngineError.reason). */
export const noStatusTable: { readonly [R in EngineError["reason"]]: EngineDecisions } = {
  // An error answer always has its status (EngineErrors.ts httpError); one without is taken as a broken answer.
  Http: { code: Status.UNAVAILABLE, retryElsewhere: true, failsCall: true },
  // A stream that broke off, or an error event without a numeric code: the engine's failure.
  Stream: { code: Status.UNAVAILABLE, retryElsewhere: true, failsCall: true },
  // A refused or reset connection: the engine is down here.
  Connect: { code: Status.UNAVAILABLE, retryElsewhere: true, failsCall: true },
  // No answer in time: slow here, maybe not elsewhere; the stall watchdog's to judge, not a failed call.
  Timeout: { code: Status.DEADLINE_EXCEEDED, retryElsewhere: true, failsCall: false },
  // An answer that is not the OpenAI API: an engine broken here may not be elsewhere; not among the failures
  // engine.failed_calls_unhealthy counts (README: those that end UNAVAILABLE, and 401/403).
  Protocol: { code: Status.INTERNAL, retryElsewhere: true, failsCall: false },
  // The agent's host could not open the connection (its descriptor limit): this node's state, not the engine's.
  Local: { code: Status.UNAVAILABLE, retryElsewhere: true, failsCall: false, agentReason: "agent_resources" }
}

/**
 * An output fault (EngineError.fault, EngineErrors.ts markOutputFault): the engine is fine and the same request
 * would fail so on another node (at temperature 0, every time): INTERNAL, the engine's error, not retried elsewhere
 * and not counted against the node, whatever its status.
 */
export const outputFault: EngineDecisions = { code: Status.INTERNAL, retryElsewhere: false, failsCall: false }

type EngineFailure = Pick<EngineError, "reason" | "status" | "fault">

/**
 * An engine failure's row, its fault aside: its status's where the engine answered with one (an HTTP error, a
 * stream's error object with a numeric code), else its reason's.
 */
export const engineAnswerDecisions = (e: Omit<EngineFailure, "fault">): EngineDecisions =>
  e.status !== undefined && (e.reason === "Http" || e.reason === "Stream")
    ? engineStatus(e.status)
    : noStatusTable[e.reason]

/** Every decision about an engine failure: an output fault's, else its status's or reason's row. */
export const engineDecisions = (e: EngineFailure): EngineDecisions =>
  e.fault === "output" ? outputFault : engineAnswerDecisions(e)
