/**
 * GrpcStatus: every way a Generate call can fail (GenerateError, a closed union of tagged errors; the other
 * methods' failures are members too) and the one table from each to its gRPC status and trailers
 * (`statusTable`): a new error without a row fails the type check. No other module names a status code but
 * EngineStatus.ts, whose one table decides everything about an engine's failure by its status. The engine's message
 * is kept in the status message and, with its HTTP status and error type, in `cgn-engine-*` trailers, so a caller
 * can act on it whatever engine or error-body shape was behind.
 * Pure: the gRPC layer sends a GrpcFailure as the call's status.
 */
import { Status } from "nice-grpc-common"
import type { EngineError } from "../engine/EngineClient.ts"
import type { ClientNotAllowed } from "../tls/ClientNames.ts"
import type { Draining, Overloaded, ShedAtArrival, ShedAtSlot } from "./Admission.ts"
import type {
  AgentDefect,
  ClientNotReading,
  EngineRunEnded,
  EngineStalled,
  LegDeadline,
  NodeCordoned,
  NotServing,
  ServerShuttingDown,
  StreamAborted
} from "./CallErrors.ts"
import { engineAnswerDecisions, engineDecisions, engineStatus } from "./EngineStatus.ts"
import type { GenerateRejected, RejectReason } from "./Generate.ts"
import type { InvalidHandoff } from "./Handoff.ts"
import type { TransportError } from "./TransportErrors.ts"

/** Everything a Generate call can end with other than OK or the caller's own cancel. */
export type GenerateError =
  | GenerateRejected
  | InvalidHandoff
  | NotServing
  | NodeCordoned
  | Overloaded
  | Draining
  | ShedAtArrival
  | ShedAtSlot
  | EngineError
  | LegDeadline
  | EngineStalled
  | EngineRunEnded
  | StreamAborted
  | ClientNotReading
  | ServerShuttingDown
  | AgentDefect
  | TransportError
  | ClientNotAllowed

export type GenerateErrorTag = GenerateError["_tag"]

/** A status to end a call with: code, message, trailers (ASCII metadata). */
export interface GrpcFailure {
  readonly code: Status
  readonly message: string
  readonly trailers: Readonly<Record<string, string>>
  /**
   * Whether the call may go to another node, provided it sent nothing (the call adds `cgn-retryable`, true only
   * when no message went out: a client that has text would see a retry's repeated). Absent: no opinion (a library
   * handler's status).
   */
  readonly retryElsewhere?: boolean
  /**
   * The message is sent followed by the advice that agrees with `cgn-retryable` ("; retry on another node", or what
   * replaces it once the call wrote or on a leg bound to its pair: StatusMessage.ts asSent, the one place that words
   * it); the message itself carries none. Only with retryElsewhere true; absent: the message is sent as it is.
   */
  readonly advised?: true
  /**
   * The call was a P/D leg bound to its other leg (Handoff.ts boundToPair): a failure another node could take is then
   * not retried alone there (the handoff may be spent, the SGLang room taken) but as a new pair: `cgn-retryable`
   * false, `cgn-retry-pair` true (StatusMessage.ts asSent).
   */
  readonly pairBound?: true
  /**
   * Sent as RST_STREAM CANCEL instead of trailers (which would wait behind output the caller is not reading); a gRPC
   * client reads it as CANCELLED (grpc/grpc doc/PROTOCOL-HTTP2.md, "Errors"), so the row's code must be CANCELLED.
   */
  readonly reset?: true
}

/**
 * The engine's HTTP status as a gRPC code (also used for a mid-stream error that carries a numeric code): its row of
 * EngineStatus.ts's table, which decides everything else about that status too.
 */
export const httpStatusToGrpc = (status: number): Status => engineStatus(status).code

/** A refusal's status, and whether another node may take the call (a model it serves); its reason is `cgn-reason`. */
const rejectStatus: Readonly<Record<RejectReason, readonly [Status, boolean]>> = {
  invalid_argument: [Status.INVALID_ARGUMENT, false],
  model_not_served: [Status.NOT_FOUND, true],
  request_too_large: [Status.RESOURCE_EXHAUSTED, false]
}

/** Metadata values must be printable ASCII; the full text is in the status message anyway. */
export const asciiTrailer = (s: string): string => {
  const clean = s.replace(/[^\x20-\x7e]/g, "?")
  return clean.length > 1024 ? `${clean.slice(0, 1021)}...` : clean
}

/**
 * The code for an engine error, by its status where the engine answered with one, else by its reason
 * (EngineStatus.ts), an output fault's mark aside.
 */
export const engineErrorCode = (e: EngineError): Status => engineAnswerDecisions(e).code

/** Whether an engine failure ends the call UNAVAILABLE (retry on another node). */
export const endsUnavailable = (e: EngineError): boolean => engineErrorCode(e) === Status.UNAVAILABLE

const engineWhat = (e: EngineError): string => {
  switch (e.reason) {
    case "Http":
      return `engine answered HTTP ${e.status ?? "?"}`
    case "Connect":
      return "engine unreachable"
    case "Timeout":
      return "engine did not answer in time"
    case "Stream":
      return "engine failed mid-stream"
    case "Protocol":
      return "engine sent an invalid answer"
    case "Local":
      return "the agent could not connect to the engine"
  }
}

export const engineFailure = (e: EngineError): GrpcFailure => {
  // code, retry and whose failure it is: the row of EngineStatus.ts for its fault, status or reason (a connection the
  // agent's own host could not open is the agent's: services/node/HostShortage.ts)
  const { code, retryElsewhere, agentReason } = engineDecisions(e)
  const trailers: Record<string, string> = {
    "cgn-error-source": agentReason === undefined ? "engine" : "agent",
    // an output fault is the request's, whatever the engine's status (EngineError.fault)
    "cgn-reason": agentReason ?? (e.fault === "output" ? "engine_output" : `engine_${e.reason.toLowerCase()}`),
    "cgn-engine-reason": e.reason,
    "cgn-engine-message": asciiTrailer(e.message)
  }
  if (e.status !== undefined) trailers["cgn-engine-status"] = String(e.status)
  if (e.engineType !== undefined) trailers["cgn-engine-type"] = asciiTrailer(e.engineType)
  if (e.engineCode !== undefined) trailers["cgn-engine-code"] = asciiTrailer(e.engineCode)
  const type = e.engineType === undefined ? "" : ` (${e.engineType})`
  return { code, message: `${engineWhat(e)}${type}: ${e.message}`, trailers, retryElsewhere }
}

export const rejectedFailure = (e: GenerateRejected): GrpcFailure => {
  const [code, retryElsewhere] = rejectStatus[e.reason]
  const trailers: Record<string, string> = { "cgn-error-source": "agent", "cgn-reason": e.reason }
  if (e.field !== undefined) trailers["cgn-field"] = e.field
  return { code, message: e.message, trailers, retryElsewhere }
}

/**
 * A refusal or ending decided by the agent: its message, marked as the agent's, with its `cgn-reason` and whether
 * another node may take the call (this node's state, not the request, was the cause).
 */
const agent =
  (code: Status, reason: string, retryElsewhere: boolean) =>
  (e: { readonly message: string }): GrpcFailure => ({
    code,
    message: e.message,
    trailers: { "cgn-error-source": "agent", "cgn-reason": reason },
    retryElsewhere
  })

/**
 * A row whose failure is sent with the retry advice (GrpcFailure.advised): the agent's refusals and endings for this
 * node's state, a P/D leg past its deadline (this node was too slow for it: the advice says whether its pair must be
 * retried with it) and the transport's memory refusal. Other rows keep their words: an engine's failure is the
 * engine's (README quotes those too), a slot reached too late or a defect says what happened.
 */
const advising =
  <E>(row: (e: E) => GrpcFailure) =>
  (e: E): GrpcFailure => ({ ...row(e), advised: true })

type Row<T extends GenerateErrorTag> = (e: Extract<GenerateError, { readonly _tag: T }>) => GrpcFailure

/** The one table from a Generate error to its status: one row per tag, checked exhaustive by its type. */
export const statusTable: { readonly [T in GenerateErrorTag]: Row<T> } = {
  GenerateRejected: rejectedFailure,
  EngineError: engineFailure,
  // The handoff cannot happen as asked: the caller (router) must fix the leg's inputs.
  InvalidHandoff: agent(Status.FAILED_PRECONDITION, "invalid_handoff", false),
  // Retryable elsewhere: this node is not taking calls now.
  NotServing: advising(agent(Status.UNAVAILABLE, "not_serving", true)),
  // Retryable elsewhere too: an operator took the node out of traffic, the engine behind it still runs.
  NodeCordoned: advising(agent(Status.UNAVAILABLE, "cordoned", true)),
  Overloaded: advising(agent(Status.RESOURCE_EXHAUSTED, "overloaded", true)),
  Draining: advising(agent(Status.UNAVAILABLE, "draining", true)),
  // A call that would have to wait with less time left than calls here need: refused at once, as Overloaded is, so
  // the router retries on another node while there is still time.
  ShedAtArrival: advising(agent(Status.RESOURCE_EXHAUSTED, "shed_at_arrival", true)),
  // A queued call that reached its slot too late to finish before its deadline: failed there, never sent.
  ShedAtSlot: agent(Status.DEADLINE_EXCEEDED, "shed_at_slot", true),
  LegDeadline: advising(agent(Status.DEADLINE_EXCEEDED, "leg_deadline", true)),
  EngineStalled: advising(agent(Status.UNAVAILABLE, "engine_stalled", true)),
  // The engine run ended under the call (services/grpc/EngineCut.ts): UNAVAILABLE as the transport failure was, its
  // engine trailers kept (none when the agent aborted the request as it ended the run); the agent's doing unless the
  // engine exited by itself.
  EngineRunEnded: (e) => ({
    code: Status.UNAVAILABLE,
    message: e.message,
    trailers: {
      ...(e.engine === undefined ? {} : engineFailure(e.engine).trailers),
      "cgn-error-source": e.by === "exit" ? "engine" : "agent",
      "cgn-reason": "engine_run_ended"
    },
    retryElsewhere: true,
    advised: true
  }),
  StreamAborted: advising(agent(Status.UNAVAILABLE, "stream_aborted", true)),
  // The caller held the stream back past agent.client_send_timeout: the stream is reset (CANCEL), which is all a caller
  // that is not reading can still receive; the code is what a gRPC client makes of that reset. Its own doing: no retry.
  ClientNotReading: (e) => ({ ...agent(Status.CANCELLED, "client_not_reading", false)(e), reset: true }),
  ServerShuttingDown: agent(Status.UNAVAILABLE, "shutting_down", true),
  AgentDefect: agent(Status.INTERNAL, "agent_defect", true),
  // The transport's own endings (layers/grpc/http2), on any method.
  UnknownMethod: agent(Status.UNIMPLEMENTED, "unknown_method", false),
  MessageTooLarge: agent(Status.RESOURCE_EXHAUSTED, "message_too_large", false),
  // Memory the agent will not spend, as an admission refusal: retryable once others' requests have arrived.
  RequestsOverBudget: advising(agent(Status.RESOURCE_EXHAUSTED, "requests_over_budget", true)),
  // Time the agent will not give a request that does not arrive (agent.request_read_timeout), as bytes above; not the
  // caller's deadline (DEADLINE_EXCEEDED: counted and alerted on as such). The caller's or its link's stall: no retry.
  RequestReadTimeout: agent(Status.RESOURCE_EXHAUSTED, "request_read_timeout", false),
  // The caller's bytes are not the message: its fault, as a field it got wrong would be.
  UndecodableRequest: agent(Status.INVALID_ARGUMENT, "undecodable_request", false),
  // gRPC's status-code guide: framing and flow-control violations are INTERNAL.
  ProtocolViolation: agent(Status.INTERNAL, "protocol_violation", false),
  UnsupportedEncoding: agent(Status.UNIMPLEMENTED, "unsupported_encoding", false),
  CallDeadlineExceeded: agent(Status.DEADLINE_EXCEEDED, "deadline_exceeded", false),
  CallCancelled: agent(Status.CANCELLED, "cancelled", false),
  // A client certificate of the CA that security.allowed_client_names does not name, on every call of its
  // connection: who the caller is, not what it asked; every agent of the cluster has the same list, so no retry.
  ClientNotAllowed: agent(Status.PERMISSION_DENIED, "client_not_allowed", false)
}

/** The status a Generate call ends with for `e`. */
export const toGrpcFailure = (e: GenerateError): GrpcFailure =>
  (statusTable[e._tag] as (e: GenerateError) => GrpcFailure)(e)

/**
 * The status message of a call the engine itself failed, undefined for any other ending: an engine error whose row
 * (EngineStatus.ts `failsCall`) counts it: an HTTP 5xx but 501 and 503, a 401/403, a refused or reset connection, a
 * stream broken off. Not what the request caused, an engine too busy, no answer in time, an output fault, nor the
 * agent's own endings; nor an engine run that ended under the call (EngineRunEnded: the supervisor's state already
 * says so). EngineStall counts these in a row (engine.failed_calls_unhealthy).
 */
export const engineFailedCall = (e: GenerateError): string | undefined =>
  e._tag === "EngineError" && engineDecisions(e).failsCall ? engineFailure(e).message : undefined

/**
 * The status message of a call the agent's own host failed on its way to the engine (a row with an `agentReason`:
 * no descriptor, socket buffer or local port for the connection), undefined for any other ending. AgentShortage
 * counts these in a row (services/node/AgentShortage.ts).
 */
export const agentFailedCall = (e: GenerateError): string | undefined =>
  e._tag === "EngineError" && engineDecisions(e).agentReason !== undefined ? engineFailure(e).message : undefined

/** A call's normal end. */
export const okStatus: GrpcFailure = { code: Status.OK, message: "", trailers: {} }

/**
 * An error a unary handler passes to its callback, as a status: a GrpcFailure as it is; a library handler's
 * (grpc-health-check) by grpc-js's convention, a `code` and `details`, UNKNOWN when it has no code.
 */
export interface HandlerError {
  readonly code?: number | undefined
  readonly details?: string | undefined
  readonly message?: string | undefined
  readonly trailers?: Readonly<Record<string, string>> | undefined
}

export const handlerFailure = (e: HandlerError): GrpcFailure => ({
  code: typeof e.code === "number" ? e.code : Status.UNKNOWN,
  message: e.details ?? e.message ?? "",
  trailers: e.trailers ?? {}
})

/** `INVALID_ARGUMENT` for 3, as grpcurl and logs print it. */
export const statusName = (code: number): string => Status[code] ?? `CODE_${code}`

/** A call its caller ended (its cancel, or its deadline passed): a normal end, not a fault to report. */
export const endedByCaller = (f: GrpcFailure): boolean =>
  f.code === Status.CANCELLED || f.code === Status.DEADLINE_EXCEEDED

/**
 * The statuses of grpc.health.v1's refusals (services/grpc/HealthRequests.ts), beside Generate's table: a name
 * over its bound, a name the agent does not report (grpc-go health/server.go answers Check so), and a Watch past
 * the server's bound of open Watch streams.
 */
export const healthStatus = {
  nameTooLong: Status.INVALID_ARGUMENT,
  unknownService: Status.NOT_FOUND,
  tooManyWatches: Status.RESOURCE_EXHAUSTED
} as const
