/**
 * One HTTP/1.1 request on one connection (the pool is http1.ts): writes the request, reads the response head
 * and body as they arrive and hands them to the handler, which may pause, resume or abort it. The framing
 * decisions are pure (services/engine/Http1Framing.ts); this module holds the socket and the timers.
 */
import type * as net from "node:net"
import { type Framing, parseChunkSize, parseResponseHead, requestHead } from "../../services/engine/Http1Framing.ts"
import type { Controller, Handler, Request } from "./http1.ts"

/** An error with a `code`, as Node's own socket errors have (transportError classifies by it). */
export const failure = (code: string, message: string): Error => Object.assign(new Error(message), { code })

const CRLF = Buffer.from("\r\n")
const HEAD_END = Buffer.from("\r\n\r\n")
const EMPTY = Buffer.alloc(0)
/** A head or chunk-size line longer than this is not an engine's: the exchange fails instead of buffering on. */
const MAX_LINE_BYTES = 64 * 1024

/** Where a chunked body is: a size line next, data (bytes left), the CRLF after data, or the trailers. */
type ChunkState = { at: "size" } | { at: "data"; left: number } | { at: "crlf" } | { at: "trailers" }

export class Http1Exchange implements Controller {
  paused = false
  private done = false
  private inHead = true
  private buf: Buffer = EMPTY
  private framing: Framing = { kind: "close" }
  /** Bytes left of a length-framed body. */
  private left = 0
  private chunk: ChunkState = { at: "size" }
  private reusable = true
  private timer: NodeJS.Timeout | undefined = undefined
  private resumeQueued = false
  private readonly socket: net.Socket
  private readonly handler: Handler
  private readonly req: Request
  private readonly release: (socket: net.Socket, reusable: boolean) => void
  constructor(
    socket: net.Socket,
    req: Request,
    handler: Handler,
    release: (socket: net.Socket, reusable: boolean) => void
  ) {
    this.socket = socket
    this.req = req
    this.handler = handler
    this.release = release
  }

  start(host: string): void {
    this.socket.on("data", this.onData)
    this.socket.on("end", this.onEnd)
    this.socket.on("error", this.onError)
    this.socket.on("close", this.onClose)
    this.handler.onRequestStart(this)
    if (this.done) return
    const head = requestHead({ ...this.req, host })
    if ("invalid" in head) {
      this.abort(failure("INVALID_HEADER", head.invalid))
      return
    }
    this.socket.write(head.text)
    this.arm(this.req.headersTimeout, "HEADERS_TIMEOUT", "no response head from the engine in time")
  }

  // ---- Controller
  pause(): void {
    if (this.done || this.paused) return
    this.paused = true
    this.socket.pause()
  }
  resume(): void {
    if (this.done || !this.paused) return
    this.paused = false
    this.socket.resume()
    // Parsed later, not in the caller's stack: a consumer resuming from inside onResponseData would re-enter it.
    if (!this.resumeQueued && this.buf.length > 0) {
      this.resumeQueued = true
      queueMicrotask(() => {
        this.resumeQueued = false
        this.parse()
      })
    }
  }
  abort(reason: Error): void {
    this.reusable = false
    this.fail(reason)
  }

  // ---- socket events
  private readonly onData = (chunk: Buffer): void => {
    if (this.done) return
    this.buf = this.buf.length === 0 ? chunk : Buffer.concat([this.buf, chunk])
    if (!this.inHead && this.req.bodyTimeout > 0)
      this.arm(this.req.bodyTimeout, "BODY_TIMEOUT", "the engine sent nothing for too long")
    this.parse()
  }
  private readonly onEnd = (): void => {
    this.reusable = false
    if (this.done) return
    this.paused = false // what is buffered is parsed first: a close-delimited body ends here
    this.parse()
    if (this.done) return
    if (!this.inHead && this.framing.kind === "close") this.finish()
    else this.fail(failure("CLOSED_MID_BODY", "the engine closed the connection before the response ended"))
  }
  private readonly onError = (e: Error): void => {
    this.reusable = false
    this.fail(e)
  }
  private readonly onClose = (): void => {
    this.reusable = false
    this.fail(failure("ECONNRESET", "the engine closed the connection"))
  }

  private arm(ms: number, code: string, message: string): void {
    clearTimeout(this.timer)
    this.timer = ms > 0 ? setTimeout(() => this.abort(failure(code, message)), ms).unref() : undefined
  }

  // ---- parsing: each step consumes from `buf`; false when it needs more bytes
  private parse(): void {
    while (!this.done && !this.paused && this.buf.length > 0)
      if (!(this.inHead ? this.readHead() : this.framing.kind === "chunked" ? this.readChunked() : this.readPlain()))
        return
  }

  private readHead(): boolean {
    const end = this.buf.indexOf(HEAD_END)
    if (end < 0) {
      if (this.buf.length > MAX_LINE_BYTES) this.abort(failure("PROTOCOL", "response head too large"))
      return false
    }
    const head = parseResponseHead(this.buf.toString("latin1", 0, end))
    this.buf = this.buf.subarray(end + 4)
    if ("invalid" in head) {
      this.abort(failure("PROTOCOL", head.invalid))
      return false
    }
    if (head.status < 200) return true // an interim head (100 Continue, 103 Early Hints): the real one follows
    this.inHead = false
    this.framing = head.framing
    this.left = head.framing.kind === "length" ? head.framing.length : 0
    this.reusable &&= head.keepAlive
    this.arm(this.req.bodyTimeout, "BODY_TIMEOUT", "the engine sent nothing for too long")
    this.handler.onResponseStart(this, head.status)
    if (this.framing.kind === "length" && this.left === 0) this.finish()
    return true
  }

  /** A body framed by its length, or by the connection's end. */
  private readPlain(): boolean {
    const n = this.framing.kind === "length" ? Math.min(this.left, this.buf.length) : this.buf.length
    const data = this.buf.subarray(0, n)
    this.buf = n === this.buf.length ? EMPTY : this.buf.subarray(n)
    this.left -= n
    if (n > 0) this.handler.onResponseData(this, data)
    if (this.framing.kind === "length" && this.left === 0) this.finish()
    return true
  }

  private readChunked(): boolean {
    const c = this.chunk
    if (c.at === "data") {
      const n = Math.min(c.left, this.buf.length)
      const data = this.buf.subarray(0, n)
      this.buf = n === this.buf.length ? EMPTY : this.buf.subarray(n)
      this.chunk = c.left === n ? { at: "crlf" } : { at: "data", left: c.left - n }
      this.handler.onResponseData(this, data)
      return true
    }
    if (c.at === "crlf") {
      if (this.buf.length < 2) return false
      this.buf = this.buf.subarray(2)
      this.chunk = { at: "size" }
      return true
    }
    const eol = this.buf.indexOf(CRLF)
    if (eol < 0) {
      if (this.buf.length > MAX_LINE_BYTES) this.abort(failure("PROTOCOL", "chunk line too long"))
      return false
    }
    const line = this.buf.toString("latin1", 0, eol)
    this.buf = this.buf.subarray(eol + 2)
    if (c.at === "trailers") {
      if (line === "") this.finish() // the blank line after the trailers (which are ignored)
      return true
    }
    const size = parseChunkSize(line)
    if (size === undefined) {
      this.abort(failure("PROTOCOL", `bad chunk size line: ${JSON.stringify(line.slice(0, 40))}`))
      return false
    }
    this.chunk = size === 0 ? { at: "trailers" } : { at: "data", left: size }
    return true
  }

  // ---- the end, once
  private finish(): void {
    if (this.done) return
    this.settle(this.reusable && this.buf.length === 0)
    this.handler.onResponseEnd(this)
  }
  private fail(e: Error): void {
    if (this.done) return
    this.settle(false)
    this.handler.onResponseError(this, e)
  }
  private settle(reusable: boolean): void {
    this.done = true
    clearTimeout(this.timer)
    this.socket.off("data", this.onData)
    this.socket.off("end", this.onEnd)
    this.socket.off("error", this.onError)
    this.socket.off("close", this.onClose)
    if (this.paused) this.socket.resume()
    this.release(this.socket, reusable)
  }
}
