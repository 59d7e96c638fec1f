/**
 * TransportErrors: how the agent's gRPC server (layers/grpc/http2) ends a call before or around its handler,
 * on any method: no such method, a request it cannot read, one over the size limit, one compressed in a way
 * it does not speak, or the caller's deadline passed. Their statuses are rows of GrpcStatus.ts's table.
 */
import { Schema } from "effect"
import { quoteInput } from "./StatusMessage.ts"

/**
 * A path as grpc-js words it when it is an ordinary one (printable, at most 64 characters), else quoted shortened as
 * any caller's value is (quoteInput): a path is the caller's header, and its bytes are the caller's choice.
 */
const shownPath = (path: string): string => (/^[\x21-\x7e]{0,64}$/.test(path) ? path : quoteInput(path))

/** The path names no method this server has (health-only listener: everything but Health). */
export class UnknownMethod extends Schema.TaggedError<UnknownMethod>()("UnknownMethod", {
  path: Schema.String
}) {
  override get message(): string {
    return `the server does not implement the method ${shownPath(this.path)}`
  }
}

/** A request message announced longer than the receive limit ([agent].max_request_bytes plus room). */
export class MessageTooLarge extends Schema.TaggedError<MessageTooLarge>()("MessageTooLarge", {
  length: Schema.Number,
  limit: Schema.Number
}) {
  override get message(): string {
    return `received message larger than max (${this.length} vs ${this.limit})`
  }
}

/** The request's bytes are not the method's message (protobuf decoding failed). */
export class UndecodableRequest extends Schema.TaggedError<UndecodableRequest>()("UndecodableRequest", {
  method: Schema.String,
  detail: Schema.String
}) {
  override get message(): string {
    return `the request is not a valid ${this.method} message: ${this.detail}`
  }
}

/** The call broke the gRPC framing: no request message, two for a unary method, a truncated one, a bad header. */
export class ProtocolViolation extends Schema.TaggedError<ProtocolViolation>()("ProtocolViolation", {
  detail: Schema.String
}) {
  override get message(): string {
    return this.detail
  }
}

/** A grpc-timeout header that is not one (grpc/grpc doc/PROTOCOL-HTTP2.md: 1-8 digits and a unit), quoted. */
export const invalidTimeout = (value: string): ProtocolViolation =>
  new ProtocolViolation({ detail: `invalid grpc-timeout ${quoteInput(value)}` })

/** A compressed message in an encoding the server does not decode (it decodes gzip and deflate). */
export class UnsupportedEncoding extends Schema.TaggedError<UnsupportedEncoding>()("UnsupportedEncoding", {
  encoding: Schema.String
}) {
  override get message(): string {
    return `message compressed with ${quoteInput(this.encoding)}, which this server does not decode (identity, gzip, deflate)`
  }
}

/** The caller's grpc-timeout passed before the call ended. */
export class CallDeadlineExceeded extends Schema.TaggedError<CallDeadlineExceeded>()("CallDeadlineExceeded", {}) {
  override get message(): string {
    return "Deadline exceeded"
  }
}

/**
 * The requests still arriving on every connection (bytes received before their handlers run) would hold more
 * than the server's budget: one more would let slow or stalled senders grow the agent's memory without bound.
 */
export class RequestsOverBudget extends Schema.TaggedError<RequestsOverBudget>()("RequestsOverBudget", {
  limitBytes: Schema.Number
}) {
  override get message(): string {
    return `requests still arriving hold more than ${this.limitBytes} bytes`
  }
}

/**
 * The request (a method with one request message) had not arrived in full, its END_STREAM included, within
 * agent.request_read_timeout of its headers: bytes and streams per connection are bounded, this bounds the time a
 * caller that sends slowly, or stops halfway, holds its stream (nginx's client_body_timeout).
 */
export class RequestReadTimeout extends Schema.TaggedError<RequestReadTimeout>()("RequestReadTimeout", {
  timeoutMs: Schema.Number
}) {
  override get message(): string {
    return `the request did not arrive in full within ${this.timeoutMs} ms of its headers (agent.request_read_timeout)`
  }
}

/** The caller reset the stream before the call ended: a call the agent did not end, reported as the caller's. */
export class CallCancelled extends Schema.TaggedError<CallCancelled>()("CallCancelled", {}) {
  override get message(): string {
    return "Cancelled by the caller"
  }
}

export type TransportError =
  | UnknownMethod
  | CallCancelled
  | RequestsOverBudget
  | RequestReadTimeout
  | MessageTooLarge
  | UndecodableRequest
  | ProtocolViolation
  | UnsupportedEncoding
  | CallDeadlineExceeded
