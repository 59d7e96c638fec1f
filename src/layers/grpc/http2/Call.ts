/**
 * One gRPC call on one HTTP/2 stream, in the shape grpc-js gives handlers (so grpc-health-check and
 * @grpc/reflection run on it unchanged): `request`, `metadata.get`, `write` (false when the stream's buffer
 * is full, then 'drain'), `end`, 'cancelled' when the caller reset the stream, its deadline passed or the
 * connection went first, and for request streams 'data' (held while a write waits for 'drain') and 'end'.
 * Ending with a status is `sendStatus` (or, for a status marked `reset`, RST_STREAM CANCEL).
 * Response headers go out with the first message, or earlier through `sendHeaders`; a call that ends before
 * either answers trailers-only.
 */
import { EventEmitter } from "node:events"
import * as http2 from "node:http2"
import { AgentDefect } from "../../../services/grpc/CallErrors.ts"
import { peerOf } from "../../../services/grpc/ConnectionCaps.ts"
import { type GrpcFailure, type HandlerError, okStatus, toGrpcFailure } from "../../../services/grpc/GrpcStatus.ts"
import { statusTrailers } from "../../../services/grpc/StatusMessage.ts"
import { frameMessage } from "../../../services/grpc/Wire.ts"
import type { CallTally } from "./Connections.ts"
import { MAX_TIMER_MS } from "./messageBound.ts"

/**
 * Why the caller reset a call `elapsedMs` after its headers: its own deadline ("deadline") when that reset came
 * within a slack of the grpc-timeout it sent ending the call here, else a cancel. A client's deadline
 * timer starts before its headers leave and its reset (RST_STREAM CANCEL, the same code as a cancel) arrives a
 * network trip later, so a client whose deadline passed most often resets the call just before the server's own
 * timer fires: counted as CANCELLED, half of a soak's expired deadlines were missing from
 * cgn_agent_requests_total{code="DEADLINE_EXCEEDED"}, which the error-ratio alert reads. The slack: 50 ms or 1% of
 * the timeout, at most 1 s, and at most a tenth of the timeout (a call of 50 ms cancelled at once is a cancel).
 */
export const resetWhy = (elapsedMs: number, timeoutMs: number | undefined): "cancelled" | "deadline" =>
  timeoutMs !== undefined && elapsedMs >= timeoutMs - Math.min(Math.max(50, timeoutMs * 0.01), 1000, timeoutMs / 10)
    ? "deadline"
    : "cancelled"

/** The request's metadata as grpc-js's Metadata.get reads it: every value under a key, `-bin` ones decoded. */
export class RequestMetadata {
  readonly #headers: http2.IncomingHttpHeaders
  constructor(headers: http2.IncomingHttpHeaders) {
    this.#headers = headers
  }
  get(key: string): Array<string | Buffer> {
    const k = key.toLowerCase()
    const v = this.#headers[k]
    if (v === undefined) return []
    // Several values of one key arrive comma-joined (HTTP/2 header rules) or as repeated fields.
    const values = Array.isArray(v) ? v : k.endsWith("-bin") ? v.split(",") : [v]
    return k.endsWith("-bin") ? values.map((s) => Buffer.from(s.trim(), "base64")) : values
  }
}

const noop = (): void => {}

/** The trailer that names the call's request id (README "Status codes"), on every failure of a call that has one. */
export const REQUEST_ID_TRAILER = "cgn-request-id"

/** `failure` naming the call's request id in its trailers. */
export const withRequestId = (failure: GrpcFailure, requestId: string): GrpcFailure => ({
  ...failure,
  trailers: { ...failure.trailers, [REQUEST_ID_TRAILER]: requestId }
})

/**
 * The request encodings decodeMessage.ts reads, in every response's headers, trailers-only ones included: a
 * call refused UNIMPLEMENTED for its compression must carry them (grpc/grpc doc/compression.md).
 */
const ACCEPT_ENCODING = "identity,deflate,gzip"

/**
 * What a unary handler answers through: an error (a GrpcFailure, or a library handler's grpc-js-style
 * `{ code, details }`) or the response.
 */
export type UnaryCallback<Res = unknown> = (error: HandlerError | null, value?: Res) => void

export class ServerCall<Req = unknown, Res = unknown> extends EventEmitter {
  /** The request message (unary and server-streaming methods). */
  request: Req = undefined as Req
  /** True once the caller reset the stream, its deadline passed or the connection closed before the end. */
  cancelled = false
  /**
   * Told the stream's receive window left when the server stops a request still arriving (#stopRequest): the bytes
   * the caller may yet send on it, which nobody reads (the server's flood rule counts them as the call's).
   */
  onUnread: ((windowLeft: number) => void) | undefined = undefined
  /**
   * Told the stream's RST_STREAM code (undefined when none) when the stream closes, however the call ended (the
   * server's flood rule reads the resets): from the call's own 'close' listener, one per stream.
   */
  onClosed: ((rstCode: number | undefined) => void) | undefined = undefined
  /**
   * The call's request id, set by its handler once it has one (Generate): the status the transport sends itself, the
   * caller's deadline (`endAt`), then names it as the handler's own failures do. A string, so setting it costs a
   * call nothing; the trailers are built only if the deadline passes.
   */
  requestId: string | undefined = undefined

  /** The caller's address (an IPv4-mapped IPv6 one as IPv4), what per-peer bounds count by; "unknown" once gone. */
  get peer(): string {
    try {
      return peerOf(this.#stream.session?.socket?.remoteAddress)
    } catch {
      return peerOf(undefined) // node:http2 has let the socket go
    }
  }
  readonly metadata: RequestMetadata
  readonly #stream: http2.ServerHttp2Stream
  readonly #serialize: (message: Res) => Buffer
  #headersSent = false
  /** A write found the stream's buffer full; 'drain' not seen yet. */
  #full = false
  /** Request messages waiting for that 'drain' (request-streaming methods), and the request's end after them. */
  #held: Array<Req> | undefined
  #heldEnd = false
  #done = false
  /** A message went out: a failure after it is no longer the caller's to retry elsewhere (`cgn-retryable`). */
  #wrote = false
  #trailers: http2.OutgoingHttpHeaders | undefined
  #deadline: ReturnType<typeof setTimeout> | undefined
  /** When the request's headers came (performance.now()): what its grpc-timeout counts from. */
  readonly #startedAt = performance.now()

  constructor(
    stream: http2.ServerHttp2Stream,
    headers: http2.IncomingHttpHeaders,
    serialize: (message: Res) => Buffer,
    /** The connection's count of open calls (close() closes one with none at once); this one in until 'close'. */
    tally: CallTally
  ) {
    super()
    this.#stream = stream
    this.#serialize = serialize
    this.metadata = new RequestMetadata(headers)
    tally.open++
    // Stream errors (a reset, a session torn down) also close the stream: 'close' is where they are handled.
    stream.on("error", noop)
    stream.once("close", () => {
      tally.open--
      this.onClosed?.(stream.rstCode)
      if (this.#done) return
      this.#done = true
      clearTimeout(this.#deadline)
      this.cancelled = true
      this.emit("cancelled", resetWhy(performance.now() - this.#startedAt, this.timeoutMs))
    })
  }

  /** True once a status was sent or the call was cancelled: nothing more goes out. */
  get done(): boolean {
    return this.#done
  }

  /** The caller's grpc-timeout in ms, counted from the request's headers; undefined: it sent none. */
  timeoutMs: number | undefined = undefined

  /** What is left of the caller's grpc-timeout now, in ms (at least 0); undefined: it sent none. */
  remainingMs(): number | undefined {
    return this.timeoutMs === undefined
      ? undefined
      : Math.max(0, this.timeoutMs - (performance.now() - this.#startedAt))
  }

  /** Ends the call with `failure` at `ms` from now unless it ended before (the caller's grpc-timeout). */
  endAt(ms: number, failure: GrpcFailure): void {
    this.timeoutMs = ms
    // setTimeout's limit is 2^31-1 ms (~24.8 days); a longer deadline is no deadline in practice.
    if (ms > MAX_TIMER_MS) return
    this.#deadline = setTimeout(() => {
      if (this.#done) return
      this.sendStatus(this.requestId === undefined ? failure : withRequestId(failure, this.requestId))
      this.cancelled = true
      this.emit("cancelled", "deadline")
    }, ms)
  }

  /**
   * Writes one message; false when the stream's buffer is full (wait for 'drain') or the call is over. One that cannot
   * be encoded (a uint32 field of 2^32: "invalid uint32") ends the call INTERNAL (false): thrown, it went to whatever
   * callback wrote it (a unary answer made later, a stream's last message), which ended nothing, and the call stayed
   * open until the caller's deadline.
   */
  write(message: Res): boolean {
    let frame: Uint8Array
    try {
      frame = frameMessage(this.#serialize(message), Buffer.allocUnsafe)
    } catch (e) {
      const why = e instanceof Error ? e.message : String(e)
      const f = toGrpcFailure(new AgentDefect({ detail: `the response could not be encoded: ${why}` }))
      this.sendStatus(this.requestId === undefined ? f : withRequestId(f, this.requestId))
      return false
    }
    return this.writeFrame(frame)
  }

  /** `write` for a message already framed (prefix and body), e.g. services/grpc/DeltaFrame.ts's. */
  writeFrame(frame: Uint8Array): boolean {
    // A stream the caller just reset is destroyed before its 'close' (next tick) makes the call cancelled.
    if (this.#done || this.#stream.destroyed) return false
    this.#respond()
    this.#wrote = true
    const ok = this.#stream.write(frame)
    if (!ok && !this.#full) {
      // One 'drain' listener per wait: a handler that writes on without waiting (reflection, Watch) would
      // add one per write.
      this.#full = true
      this.#stream.once("drain", this.#onDrain)
      // Until the caller reads, what it still sends waits as well (receive): paused, the request's HTTP/2
      // flow-control window closes and the caller stops sending.
      if (!this.#stream.readableEnded) this.#stream.pause()
    }
    return ok
  }

  /**
   * Hands the handler one request message ('data') of a request-streaming method, or holds it while a write
   * waits for 'drain': a handler answering each message (reflection) would otherwise buffer answers without
   * bound for a caller that sends many messages at once and never reads.
   */
  receive(message: Req): void {
    if (this.#held !== undefined) this.#held.push(message)
    else if (this.#full) this.#held = [message]
    else if (!this.#done) this.emit("data", message)
  }

  /** The end of a request-streaming method's request ('end'), after the messages held. */
  endRequest(): void {
    if (this.#held === undefined) this.emit("end")
    else this.#heldEnd = true
  }

  /** Sends the response headers now (else they go with the first message). */
  sendHeaders(): void {
    if (this.#done || this.#stream.destroyed) return
    this.#respond()
  }

  /** Ends the call with OK. */
  end(): void {
    this.sendStatus(okStatus)
  }

  /** Ends the call with `status` (its code, message and trailers); once, later calls are ignored. */
  sendStatus(status: GrpcFailure): void {
    if (this.#done) return
    this.#done = true
    clearTimeout(this.#deadline)
    const stream = this.#stream
    if (stream.closed || stream.destroyed) return
    // A caller that stopped reading would never get trailers queued behind what it did not read: the stream is reset,
    // which frees it at once (GrpcFailure.reset).
    if (status.reset === true) {
      if (!stream.readableEnded) this.onUnread?.(stream.state.localWindowSize ?? 0)
      stream.close(http2.constants.NGHTTP2_CANCEL)
      return
    }
    // Every value bounded to what any client's header limit takes (StatusMessage.ts): one call's overlong status
    // made a grpc-js client close the connection, ending every other call on it. cgn-retryable and the message's
    // advice are decided together by what went out (StatusMessage.ts asSent).
    const trailers: http2.OutgoingHttpHeaders = statusTrailers(status, this.#wrote)
    if (!this.#headersSent) {
      // Trailers-only: the response headers and the status in the one HEADERS frame, which ends the stream.
      this.#headersSent = true
      stream.respond(
        { ":status": 200, "content-type": "application/grpc", "grpc-accept-encoding": ACCEPT_ENCODING, ...trailers },
        { endStream: true }
      )
      this.#stopRequest()
      return
    }
    this.#trailers = trailers
    stream.once("wantTrailers", this.#sendTrailers)
    stream.end()
  }

  #respond(): void {
    if (this.#headersSent) return
    this.#headersSent = true
    this.#stream.respond(
      { ":status": 200, "content-type": "application/grpc", "grpc-accept-encoding": ACCEPT_ENCODING },
      { waitForTrailers: true }
    )
  }

  readonly #onDrain = (): void => {
    this.#full = false
    const held = this.#held
    if (held !== undefined) {
      // In order until a write fills the buffer again: the rest, and the request, wait for the next 'drain'.
      while (held.length > 0 && !this.#full && !this.#done) this.emit("data", held.shift())
      if (this.#full && !this.#done) return
      this.#held = undefined
      if (this.#heldEnd && !this.#done) this.emit("end")
    }
    if (this.#stream.isPaused()) this.#stream.resume()
    this.emit("drain")
  }

  readonly #sendTrailers = (): void => {
    if (this.#trailers === undefined || this.#stream.destroyed) return
    this.#stream.sendTrailers(this.#trailers)
    // node:http2 submits the trailers on setImmediate (nodejs/node lib/internal/http2/core.js, sendTrailers): a reset
    // submitted now went out first, and a client still sending its request got RST_STREAM without a status.
    setImmediate(() => this.#stopRequest())
  }

  /**
   * After the status, a request the caller is still sending (a deadline or a bad message cut it short) is
   * stopped with RST_STREAM NO_ERROR, queued behind the status (RFC 9113 8.1: a server that answered may ask
   * the client to stop sending this way; grpc-go's server does the same). Else the stream, and what the
   * caller sends on it, stays open until the caller gives up.
   */
  #stopRequest(): void {
    const stream = this.#stream
    if (stream.readableEnded || stream.destroyed) return
    this.onUnread?.(stream.state.localWindowSize ?? 0)
    stream.close(http2.constants.NGHTTP2_NO_ERROR)
  }
}
