/**
 * The gRPC server's connections (http2/Server.ts): a deadline on each one's handshake, the keepalive that closes
 * those whose client is gone (Keepalive.ts), and the server's close, which closes at once every connection that runs
 * no call and leaves those that do to finish them (GrpcServer.ts bounds that wait, then cuts what is left and logs
 * what it cut).
 */

import type * as http2 from "node:http2"
import type * as net from "node:net"
import * as tls from "node:tls"
import { peerOf } from "../../../services/grpc/ConnectionCaps.ts"
import type { GuardEvent } from "./Guard.ts"
import { MAX_HEADER_LIST_BYTES, MAX_HEADER_LIST_PAIRS } from "./headerLimits.ts"
import { Keepalive } from "./Keepalive.ts"
import type { Http2GrpcServerOptions } from "./ServerOptions.ts"

/**
 * How long an accepted connection has for each part of its handshake: TLS when served with TLS (node:tls's
 * `handshakeTimeout`, 120 s by default, given this instead), then the HTTP/2 client preface (the magic and the
 * client's SETTINGS) from its session's start. One that has not is closed. Node bounds no preface: a session waits
 * for it as long as the client waits (`unknownProtocolTimeout` bounds only TLS connections that negotiated no `h2`
 * by ALPN; nodejs/node doc/api/http2.md, doc/api/tls.md). Routers open a connection and speak at once; a
 * connection past its handshake is never closed for being idle (routers keep them), only once its client stops
 * answering the keepalive's PINGs.
 */
export const HANDSHAKE_TIMEOUT_MS = 10_000

/**
 * Node's guard against HTTP/2 rapid reset (CVE-2023-44487) closes a connection whose client reset more than
 * `streamResetBurst` streams, refilled at `streamResetRate` per second; its defaults (1000, 33/s) end a
 * router's cancel of 2000 hedged calls with INTERNAL on every call of the connection. A cancel costs the
 * agent an aborted engine request, and admission bounds the calls in flight, so the guard is kept but sized
 * for a router: 10x the burst, 30x the rate.
 */
export const STREAM_RESET_BURST = 10_000
export const STREAM_RESET_RATE = 1_000

/** A budget of stream resets: `burst` at once, refilled at `ratePerSec`. */
export interface ResetBudget {
  readonly burst: number
  readonly ratePerSec: number
}

/** Node's rapid-reset guard as sized above, on each connection. */
export const STREAM_RESETS: ResetBudget = { burst: STREAM_RESET_BURST, ratePerSec: STREAM_RESET_RATE }

/**
 * The fewest streams one connection may hold open at once (SETTINGS_MAX_CONCURRENT_STREAMS; Node's default is
 * 2^32 - 1). Admission counts calls from their handler on: streams whose request is still arriving (or never
 * ends) are not counted there, so without this one client could hold any number. Room for a router's 2000
 * hedged calls on one connection, twice over (its other calls ride the same connection); a client past the limit
 * queues its requests itself. A server takes `concurrentStreams` of its admission limits.
 */
export const MIN_CONCURRENT_STREAMS = 4096

/** The most SETTINGS_MAX_CONCURRENT_STREAMS can say (RFC 9113 6.5.2: a 32-bit value); Node throws past it. */
const MAX_SETTING = 2 ** 32 - 1

/**
 * Twice what admission holds (running and queued), at least MIN_CONCURRENT_STREAMS, at most what the setting can
 * say: a larger value made node:http2 throw at each connection's set-up, uncaught.
 */
export const concurrentStreams = (maxInflight: number, maxQueue: number): number =>
  Math.min(MAX_SETTING, Math.max(MIN_CONCURRENT_STREAMS, 2 * (maxInflight + maxQueue)))

/**
 * Each connection's HTTP/2 settings, with at most `maxConcurrentStreams` streams open at once and `streamResets`
 * for Node's rapid-reset guard.
 */
export const sessionSettings = (
  maxConcurrentStreams = MIN_CONCURRENT_STREAMS,
  streamResets: ResetBudget = STREAM_RESETS
): http2.ServerOptions => ({
  // As grpc-js: Node's 10 MB session memory cap degrades badly when reached; admission bounds calls instead.
  maxSessionMemory: Number.MAX_SAFE_INTEGER,
  maxSendHeaderBlockLength: Number.MAX_SAFE_INTEGER,
  streamResetBurst: streamResets.burst,
  streamResetRate: streamResets.ratePerSec,
  // Metadata is limited on bytes, not on Node's default count of 128 fields (headerLimits.ts).
  maxHeaderListPairs: MAX_HEADER_LIST_PAIRS,
  // A stream past the limit is refused (RST_STREAM REFUSED_STREAM, safe to retry) by nghttp2 itself.
  settings: { maxHeaderListSize: MAX_HEADER_LIST_BYTES, maxConcurrentStreams }
})

/** The sessions open and the calls running on them (what destroy() would cut). */
export interface OpenConnections {
  readonly sessions: number
  readonly calls: number
}

/** The calls open on one connection: each ServerCall counts itself in, and out at its stream's 'close'. */
export interface CallTally {
  open: number
}

/** Where a call whose session is not (or no longer) followed counts. */
const untracked: CallTally = { open: 0 }

/**
 * A TCP connection's four addresses: unique among the open ones, so they tie a TLS socket ('secureConnection') to
 * the accepted socket it wraps through public properties only (both report the same four); the guard (Guard.ts) a
 * session to its accepted socket likewise.
 */
export const connectionKey = (socket: net.Socket): string =>
  `${socket.localAddress}|${socket.localPort}|${socket.remoteAddress}|${socket.remotePort}`

/** The calls on a session, and its preface deadline until the client's SETTINGS come. */
interface Tracked extends CallTally {
  deadline: NodeJS.Timeout | undefined
}

export class Connections {
  /** Every session, with the calls open on it. */
  readonly #sessions = new Map<http2.Http2Session, Tracked>()
  /**
   * Accepted TLS connections still in their TLS handshake (node:tls's deadline bounds it): no session, so no call,
   * yet. A plaintext connection gets its session in its 'connection' event (nodejs/node lib/internal/http2/core.js,
   * connectionListener), so is never here.
   */
  readonly #inTls = new Map<string, net.Socket>()
  readonly #handshakeMs: number
  readonly #onError: (error: Error) => void
  readonly #onGuard: (event: GuardEvent) => void
  readonly #keepalive: Keepalive | undefined
  /** Set by close() and destroy(): what a connection accepted before and past its handshake after then gets. */
  #closing: "close" | "destroy" | undefined

  constructor(options: Http2GrpcServerOptions) {
    this.#handshakeMs = options.handshakeTimeoutMs ?? HANDSHAKE_TIMEOUT_MS
    this.#onError = (e) => options.onConnectionError?.(e)
    this.#onGuard = options.onGuard ?? (() => {})
    const k = options.keepalive
    if (k !== undefined && k.timeMs > 0) this.#keepalive = new Keepalive(k, options.onGuard ?? (() => {}))
  }

  /** Follows `server`'s connections from their accept (before node:http2 makes their session). */
  attach(server: http2.Http2Server | http2.Http2SecureServer): void {
    const secure = server instanceof tls.Server
    server.prependListener("connection", (socket: net.Socket) => {
      // Each relayed token is a small write after one still unacknowledged: Nagle's algorithm would hold it back.
      socket.setNoDelay(true)
      if (!secure) return
      const key = connectionKey(socket)
      this.#inTls.set(key, socket)
      // Also when the TLS socket over it closes (it destroys the socket it wraps).
      socket.once("close", () => {
        if (this.#inTls.get(key) === socket) this.#inTls.delete(key)
      })
    })
    // Before node:http2's own listener makes the session. One that negotiated no h2 gets none: node:http2 answers
    // it 403 and closes it within `unknownProtocolTimeout`, so it stays here for close() until it closes.
    if (secure)
      server.prependListener("secureConnection", (socket: tls.TLSSocket) => {
        if (socket.alpnProtocol === "h2") this.#inTls.delete(connectionKey(socket))
      })
    server.on("session", (session) => {
      const tracked: Tracked = { open: 0, deadline: setTimeout(this.#expire, this.#handshakeMs, session) }
      this.#sessions.set(session, tracked)
      // Errors end the session, and 'close' follows: its streams see 'cancelled' there.
      session.on("error", this.#onError)
      session.once("remoteSettings", () => clearTimeout(tracked.deadline))
      this.#keepalive?.follow(session)
      session.once("close", () => {
        clearTimeout(tracked.deadline)
        this.#sessions.delete(session)
      })
      // Past its TLS handshake after close() or destroy(): it must not take calls, nor hold close().
      if (this.#closing !== undefined) session.destroy()
    })
    server.on("tlsClientError", (error: Error, socket: tls.TLSSocket) => {
      this.#onError(error)
      // A certificate node:tls refused (requestCert, rejectUnauthorized): the reason is the socket's, not the error's
      // ("socket hang up" under TLS 1.3), and an operator rolling out mTLS needs it. By then node:tls has destroyed
      // the socket and no longer gives its address (measured on Node 24): the peer reads "unknown". A client that sent
      // no certificate at all (a router deployed without one, the likeliest rollout mistake) sets no
      // authorizationError: node:tls says it in the error's code, with the address still there.
      const refused = socket?.authorizationError
      const detail =
        refused !== undefined && refused !== null
          ? String(refused)
          : (error as NodeJS.ErrnoException).code === "ERR_SSL_PEER_DID_NOT_RETURN_A_CERTIFICATE"
            ? "NO_CLIENT_CERTIFICATE"
            : undefined
      if (detail !== undefined)
        this.#onGuard({
          kind: "refused",
          reason: "client_certificate",
          peer: peerOf(socket?.remoteAddress),
          limit: 0,
          detail
        })
    })
  }

  /** The count of the calls open on `session` (ServerCall's). */
  tallyOf(session: http2.Http2Session | undefined): CallTally {
    return (session && this.#sessions.get(session)) ?? untracked
  }

  /**
   * Sends GOAWAY on every connection: those running no call (still in their handshake included) close at
   * once, the others once their calls end. Before the server's own close, which closes every session
   * gracefully: node:http2 then ends the socket and waits for the client to close its side (nodejs/node
   * lib/internal/http2/core.js, finishSessionClose), which a client that stopped reading never does; and a
   * connection still in its TLS handshake has no session to close.
   */
  close(): void {
    this.#closing = "close"
    this.#keepalive?.stop()
    for (const socket of this.#inTls.values()) socket.destroy()
    // destroy() still sends GOAWAY (NO_ERROR), then closes the socket once it is written.
    for (const [s, tally] of this.#sessions) if (tally.open === 0) s.destroy()
    for (const [s, tally] of this.#sessions) if (tally.open > 0) s.close()
  }

  get open(): OpenConnections {
    let calls = 0
    for (const tally of this.#sessions.values()) calls += tally.open
    return { sessions: this.#sessions.size, calls }
  }

  /** Closes every connection now: their running calls see 'cancelled'. */
  destroy(): void {
    this.#closing = "destroy"
    this.#keepalive?.stop()
    for (const socket of this.#inTls.values()) socket.destroy()
    for (const s of this.#sessions.keys()) s.destroy()
  }

  /** No client SETTINGS within the deadline (the timer is cleared at them, and at the session's close). */
  readonly #expire = (session: http2.Http2Session): void => {
    this.#onError(new Error(`no HTTP/2 handshake within ${this.#handshakeMs} ms; connection closed`))
    session.destroy()
  }
}
