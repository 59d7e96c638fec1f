/**
 * requestReadTimeoutMs on a request-streaming call (reflection, bidi), whose handler runs at the headers: each request
 * message must arrive whole within the bound of its first bytes, else the call ends with request_read_timeout's
 * status (RESOURCE_EXHAUSTED, cgn-reason request_read_timeout). A message begun and never finished held its bytes
 * (up to the receive limit) and its stream for good. The time between messages is not bounded: grpcurl keeps its
 * reflection stream open, idle, while the call it looked up runs (jhump/protoreflect grpcreflect/client.go opens it
 * again when the server ended it), and an idle stream holds no more than a Health Watch does (one of the
 * connection's concurrent streams).
 */
import type * as http2 from "node:http2"
import type { GrpcFailure } from "../../../services/grpc/GrpcStatus.ts"

/**
 * How long a request that ended inside a message, or with none, waits for a reset before it is answered INTERNAL.
 * node:http2's client (so grpc-js) cancels a call whose request is still open by ending it (an empty DATA frame
 * with END_STREAM) and then resetting it (RST_STREAM CANCEL), in two writes (nodejs/node lib/internal/http2/core.js,
 * closeStream): the server reads the end first and sees no reset yet, and its INTERNAL answer then closed the
 * stream before the reset came. Only broken requests wait.
 */
export const RESET_AFTER_END_MS = 100

/** setTimeout's limit (2^31-1 ms): past it Node fires at once, so a longer bound is none. */
export const MAX_TIMER_MS = 2_147_483_647

/** request_read_timeout's status (`readTimeout`), worded for one message of a request stream. */
export const messageTimeout = (readTimeout: GrpcFailure, ms: number): GrpcFailure => ({
  ...readTimeout,
  message: `a request message did not arrive in full within ${ms} ms of its first bytes (agent.request_read_timeout)`
})

export class MessageBound {
  #timer: ReturnType<typeof setTimeout> | undefined
  readonly #ms: number
  readonly #expire: () => void

  constructor(ms: number, expire: () => void) {
    this.#ms = ms
    this.#expire = expire
  }

  /** After a chunk was read: `pending` bytes of a message begun are held (0: the chunk ended its messages). */
  after(pending: number): void {
    if (pending > 0) this.#timer ??= setTimeout(this.#expire, this.#ms)
    else this.stop()
  }

  stop(): void {
    clearTimeout(this.#timer)
    this.#timer = undefined
  }
}

/** The bound for `stream`'s messages (stopped at its close), or none when `ms` is 0 or past setTimeout's limit. */
export const messageBound = (
  stream: http2.ServerHttp2Stream,
  ms: number,
  expire: () => void
): MessageBound | undefined => {
  if (ms <= 0 || ms > MAX_TIMER_MS) return undefined
  const bound = new MessageBound(ms, expire)
  stream.once("close", () => bound.stop())
  return bound
}
