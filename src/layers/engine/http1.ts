/**
 * The HTTP/1.1 client behind the live EngineClient: keep-alive connections to the engine's origin over
 * node:net (node:tls for https), one request per connection at a time (http1Exchange.ts), with the callbacks
 * undici's dispatch uses (start, response head, data, end, error) and a controller (pause, resume, abort).
 * Why not undici: on the per-call path it cost ~100 µs of CPU per call more than this on the bench machine
 * (docs/bench.md, "Which stack"), and the agent talks to one engine whose answers are plain: content-length,
 * chunked or close-delimited bodies (Http1Framing.ts). Idle connections are closed after 4 s, under uvicorn's
 * 5 s keep-alive (vLLM, SGLang), so a request is not written to a connection the engine is closing. Errors
 * carry a `code` as Node's own do (ECONNREFUSED, ECONNRESET, ...), plus CONNECT_TIMEOUT, HEADERS_TIMEOUT,
 * BODY_TIMEOUT, CLOSED_MID_BODY, PROTOCOL and INVALID_HEADER.
 */
import * as net from "node:net"
import * as tls from "node:tls"
import { failure, Http1Exchange } from "./http1Exchange.ts"

export interface Controller {
  readonly paused: boolean
  pause(): void
  resume(): void
  /** Ends the exchange: the connection is destroyed (the engine sees the disconnect), onResponseError(reason). */
  abort(reason: Error): void
}

export interface Handler {
  onRequestStart(controller: Controller): void
  onResponseStart(controller: Controller, statusCode: number): void
  onResponseData(controller: Controller, chunk: Buffer): void
  onResponseEnd(controller: Controller): void
  onResponseError(controller: Controller, error: Error): void
}

export interface Request {
  readonly origin: string
  readonly path: string
  readonly method: "GET" | "POST"
  readonly headers: Readonly<Record<string, string>>
  readonly body: string | null
  /** Time from the request written to the response head; 0: none. */
  readonly headersTimeout: number
  /** Longest silence between body bytes; 0: none. */
  readonly bodyTimeout: number
}

export interface PoolOptions {
  readonly connectTimeoutMs: number
  /** How long an idle connection is kept (default 4 s). */
  readonly keepAliveTimeoutMs?: number
}

/** Keep-alive connections per origin. */
export class Http1Pool {
  private readonly idle = new Map<string, Array<net.Socket>>()
  private readonly live = new Set<net.Socket>()
  /** The listener that drops an idle connection, removed when the connection is taken for a request. */
  private readonly drops = new WeakMap<net.Socket, () => void>()
  private closed = false
  private readonly connectTimeoutMs: number
  private readonly keepAliveTimeoutMs: number
  constructor(options: PoolOptions) {
    this.connectTimeoutMs = options.connectTimeoutMs
    this.keepAliveTimeoutMs = options.keepAliveTimeoutMs ?? 4_000
  }

  dispatch(req: Request, handler: Handler): void {
    const url = new URL(req.origin)
    const socket = this.take(url.origin) ?? this.connect(url)
    this.live.add(socket)
    new Http1Exchange(socket, req, handler, (s, reusable) => this.release(url.origin, s, reusable)).start(url.host)
  }

  /** Destroys every connection, idle or in use. */
  close(): void {
    this.closed = true
    for (const s of this.live) s.destroy()
    for (const list of this.idle.values()) for (const s of list) s.destroy()
    this.live.clear()
    this.idle.clear()
  }

  private take(origin: string): net.Socket | undefined {
    const socket = this.idle.get(origin)?.pop()
    if (socket === undefined) return undefined
    const drop = this.drops.get(socket)
    if (drop !== undefined) {
      socket.off("timeout", drop)
      socket.off("close", drop)
      socket.off("error", drop)
    }
    socket.setTimeout(0)
    return socket
  }

  private connect(url: URL): net.Socket {
    const https = url.protocol === "https:"
    const port = Number(url.port || (https ? 443 : 80))
    const host = url.hostname.replace(/^\[|\]$/g, "")
    const socket = https
      ? tls.connect({ host, port, ...(net.isIP(host) === 0 ? { servername: host } : {}) })
      : net.connect({ host, port })
    socket.setNoDelay(true)
    const timer = setTimeout(
      () => socket.destroy(failure("CONNECT_TIMEOUT", `no connection to ${url.origin} in time`)),
      this.connectTimeoutMs
    ).unref()
    socket.once(https ? "secureConnect" : "connect", () => clearTimeout(timer))
    socket.once("close", () => clearTimeout(timer))
    return socket
  }

  private release(origin: string, socket: net.Socket, reusable: boolean): void {
    this.live.delete(socket)
    if (!reusable || this.closed || socket.destroyed) {
      socket.destroy()
      return
    }
    const list = this.idle.get(origin) ?? []
    this.idle.set(origin, list)
    list.push(socket)
    // An idle connection that the engine closes, or that sits unused past the keep-alive time, is dropped.
    const drop = () => {
      const i = list.indexOf(socket)
      if (i >= 0) list.splice(i, 1)
      socket.destroy()
    }
    this.drops.set(socket, drop)
    socket.setTimeout(this.keepAliveTimeoutMs)
    socket.once("timeout", drop)
    socket.once("close", drop)
    socket.once("error", drop)
  }
}
