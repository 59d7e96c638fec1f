/**
 * The undici dispatch handler behind every whole answer read of an engine (engineHttp.ts `sendWhole`: the
 * EngineClient's non-streamed completions and metrics, ServedContext's model list, the supervisor's probe): `Exchange`
 * buffers a bounded answer for a pull; the streaming one is streamExchange.ts. Both abort on close, so the engine
 * sees the disconnect; how a transport failure reads (`errorCode`, `transportError`) is here, for both.
 */
import { Effect } from "effect"
import type { Dispatcher } from "undici"
import { EngineError } from "../../services/engine/EngineClient.ts"
import { hostShortage } from "../../services/node/HostShortage.ts"

/**
 * What is kept of an answer read only for its message (an error status, a 200 that is no event stream): the
 * message is cut to a few hundred characters anyway, and such a body may be an endless page from a proxy.
 */
export const MAX_ERROR_BODY_BYTES = 64 * 1024
/** The largest whole answer read (a non-streamed completion, /v1/models, /metrics). */
export const MAX_WHOLE_BODY_BYTES = 16 * 1024 * 1024
export const closedByClient = () => new Error("request closed by the client")

/** The most of a body read at a status; past it the exchange is aborted. */
export type BodyBound = (status: number) => number
/** The EngineClient's: a whole answer up to MAX_WHOLE_BODY_BYTES, an error status's up to MAX_ERROR_BODY_BYTES. */
export const clientBound: BodyBound = (status) => (status >= 400 ? MAX_ERROR_BODY_BYTES : MAX_WHOLE_BODY_BYTES)

/** One HTTP exchange; the undici handler and the state the pull reads. */
export class Exchange implements Dispatcher.DispatchHandler {
  controller: Dispatcher.DispatchController | undefined = undefined
  status = 0
  chunks: Array<Buffer> = []
  ended = false
  error: Error | undefined = undefined
  /** The request was written whole: a failure from here on is the engine's answer breaking off (transportError). */
  sent = false
  /** The body passed its bound (by default clientBound's): aborted. */
  overflowed = false
  /** Bytes of the body so far; it is aborted past `limit`, set by `bound` at the status. */
  private received = 0
  private limit = MAX_WHOLE_BODY_BYTES
  private readonly bound: BodyBound
  private closed = false
  private waiter: (() => void) | undefined = undefined
  /**
   * Something changed while nobody waited: the next wait returns at once. A reader checks the state, then waits;
   * Effect's run loop may yield between the two, and an undici callback in that gap would otherwise be lost and the
   * reader wait for ever.
   */
  private unseen = false
  constructor(bound: BodyBound = clientBound) {
    this.bound = bound
  }

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.controller = controller
    if (this.closed) controller.abort(closedByClient())
  }
  onRequestSent(): void {
    this.sent = true
  }
  onResponseStart(_c: Dispatcher.DispatchController, statusCode: number): void {
    this.status = statusCode
    this.limit = this.bound(statusCode)
    this.wake()
  }
  onResponseData(controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (this.closed) return
    this.received += chunk.length
    if (this.received > this.limit) {
      // What came so far is kept (an error body's message); the rest is not read.
      this.overflowed = true
      this.closed = true
      controller.abort(closedByClient())
      this.wake()
      return
    }
    this.chunks.push(chunk)
    this.wake()
  }
  onResponseEnd(): void {
    this.ended = true
    this.wake()
  }
  onResponseError(_c: Dispatcher.DispatchController, error: Error): void {
    this.error = error
    this.wake()
  }

  /** Everything buffered so far. */
  take(): Array<Buffer> {
    const out = this.chunks
    this.chunks = []
    return out
  }
  private wake(): void {
    const w = this.waiter
    if (w === undefined) {
      this.unseen = true
      return
    }
    this.waiter = undefined
    w()
  }
  /** Waits until something changed (headers, data, end, error) since the last wait. */
  readonly changed: Effect.Effect<void> = Effect.callback<void>((resume) => {
    if (this.unseen) {
      this.unseen = false
      return resume(Effect.void)
    }
    this.waiter = () => resume(Effect.void)
    return Effect.sync(() => {
      this.waiter = undefined
    })
  })
  get settled(): boolean {
    return this.ended || this.error !== undefined
  }
  /** Aborts unless finished. */
  close(): void {
    if (this.closed || this.settled) return
    this.closed = true
    this.chunks = []
    this.controller?.abort(closedByClient())
  }
}

/**
 * undici's code of a transport failure: the socket's own (ECONNREFUSED, ECONNRESET, ENOTFOUND...) or one of its
 * UND_ERR_* codes, on the error or else on its cause; undefined when neither has one.
 */
export const errorCode = (e: unknown): string | undefined => {
  const c = (e as { code?: unknown } | undefined)?.code
  const cause = (e as { cause?: { code?: unknown } } | undefined)?.cause
  return typeof c === "string" ? c : typeof cause?.code === "string" ? cause.code : undefined
}

const EOF_MID_BODY = /\(Invalid EOF state\)$/
const CLOSED_MID_BODY = "the engine closed the connection before the end of its answer"

/**
 * A transport failure; `reached` when the engine had the request (written whole, or its answer begun): then it is an
 * answer that broke off (an engine killed mid-prefill, before a whole answer's headers), not an unreachable engine. No
 * connection within the connect timeout is an unreachable engine (UNAVAILABLE: retry elsewhere), not one that
 * did not answer in time.
 */
export const transportError = (e: Error, reached: boolean): EngineError => {
  const code = errorCode(e) ?? ""
  if (code.endsWith("TIMEOUT") && code !== "UND_ERR_CONNECT_TIMEOUT")
    return new EngineError({ reason: "Timeout", message: `${code}: ${e.message}` })
  // undici's HTTP/1.1 parser, at a connection closed within an answer the engine closes its connection after
  // (llama-server's streams; a killed engine's FIN): "Response does not match the HTTP/1.1 protocol (Invalid EOF
  // state)" reached callers as the cause, which reads as a protocol bug rather than the cut it is
  if (EOF_MID_BODY.test(e.message)) return new EngineError({ reason: "Stream", message: CLOSED_MID_BODY })
  const message = `${code === "" ? "" : `${code}: `}${e.message}`
  const shortage = reached ? undefined : hostShortage(code)
  if (shortage !== undefined) return new EngineError({ reason: "Local", message: `${shortage}: ${message}` })
  return new EngineError({ reason: reached ? "Stream" : "Connect", message })
}

export const bodyText = (chunks: ReadonlyArray<Buffer>): string =>
  chunks.length === 1 ? (chunks[0] as Buffer).toString("utf8") : Buffer.concat(chunks).toString("utf8")
