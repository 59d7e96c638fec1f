/**
 * GrpcStatus: the one table from failures to gRPC statuses (engine errors and the agent's own).
 * The engine's message is kept in the status message and, with its HTTP status and error type, in
 * `cgn-engine-*` trailers, so a caller can act on it whatever engine or error-body shape was behind.
 * Pure: the gRPC layer turns a GrpcFailure into a nice-grpc ServerError and trailers.
 */
import { Status } from "nice-grpc-common"
import type { EngineError } from "../engine/EngineClient.ts"
import { GenerateRejected, type RejectCode } from "./Generate.ts"

/** A status to end a call with: code, message, trailers (ASCII metadata). */
export interface GrpcFailure {
  readonly code: Status
  readonly message: string
  readonly trailers: Readonly<Record<string, string>>
}

/** The engine's HTTP status as a gRPC code (also used for a mid-stream error that carries a numeric code). */
export const httpStatusToGrpc = (status: number): Status => {
  if (status === 400 || status === 422) return Status.INVALID_ARGUMENT
  if (status === 404) return Status.NOT_FOUND
  if (status === 413 || status === 429) return Status.RESOURCE_EXHAUSTED
  if (status === 408) return Status.DEADLINE_EXCEEDED
  if (status === 501) return Status.UNIMPLEMENTED
  if (status >= 500) return Status.UNAVAILABLE
  // 401/403/409/... mean the agent and engine disagree (config, auth): not the caller's fault.
  return Status.INTERNAL
}

const rejectCode: Readonly<Record<RejectCode, Status>> = {
  INVALID_ARGUMENT: Status.INVALID_ARGUMENT,
  NOT_FOUND: Status.NOT_FOUND,
  RESOURCE_EXHAUSTED: Status.RESOURCE_EXHAUSTED,
  UNAVAILABLE: Status.UNAVAILABLE,
  FAILED_PRECONDITION: Status.FAILED_PRECONDITION,
  DEADLINE_EXCEEDED: Status.DEADLINE_EXCEEDED,
  CANCELLED: Status.CANCELLED
}

/** Metadata values must be printable ASCII; the full text is in the status message anyway. */
export const asciiTrailer = (s: string): string => {
  const clean = s.replace(/[^\x20-\x7e]/g, "?")
  return clean.length > 1024 ? `${clean.slice(0, 1021)}...` : clean
}

/** The code for an engine error, by reason then status. */
export const engineErrorCode = (e: EngineError): Status => {
  switch (e.reason) {
    case "Http":
      return e.status === undefined ? Status.UNAVAILABLE : httpStatusToGrpc(e.status)
    case "Connect":
      return Status.UNAVAILABLE
    case "Timeout":
      return Status.DEADLINE_EXCEEDED
    case "Stream":
      // An error object with a numeric code maps like the HTTP status; a stream that broke off is UNAVAILABLE.
      return e.status === undefined ? Status.UNAVAILABLE : httpStatusToGrpc(e.status)
    case "Protocol":
      return Status.INTERNAL
  }
}

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
  }
}

export const engineFailure = (e: EngineError): GrpcFailure => {
  const trailers: Record<string, string> = {
    "cgn-error-source": "engine",
    "cgn-engine-reason": e.reason,
    "cgn-engine-message": asciiTrailer(e.message)
  }
  if (e.status !== undefined) trailers["cgn-engine-status"] = String(e.status)
  if (e.engineType !== undefined) trailers["cgn-engine-type"] = asciiTrailer(e.engineType)
  if (e.engineCode !== undefined) trailers["cgn-engine-code"] = asciiTrailer(e.engineCode)
  const type = e.engineType === undefined ? "" : ` (${e.engineType})`
  return { code: engineErrorCode(e), message: `${engineWhat(e)}${type}: ${e.message}`, trailers }
}

export const rejectedFailure = (e: GenerateRejected): GrpcFailure => {
  const trailers: Record<string, string> = { "cgn-error-source": "agent" }
  if (e.field !== undefined) trailers["cgn-field"] = e.field
  return { code: rejectCode[e.code], message: e.message, trailers }
}

const isEngineError = (e: unknown): e is EngineError =>
  typeof e === "object" && e !== null && (e as { _tag?: unknown })._tag === "EngineError"

/** Any failure of a call as a status; anything unexpected is INTERNAL with its text. */
export const toGrpcFailure = (e: unknown): GrpcFailure => {
  if (isEngineError(e)) return engineFailure(e)
  if (e instanceof GenerateRejected) return rejectedFailure(e)
  const message = e instanceof Error ? e.message : String(e)
  return { code: Status.INTERNAL, message: `agent error: ${message}`, trailers: { "cgn-error-source": "agent" } }
}

/** `INVALID_ARGUMENT` for 3, as grpcurl and logs print it. */
export const statusName = (code: number): string => Status[code] ?? `CODE_${code}`
