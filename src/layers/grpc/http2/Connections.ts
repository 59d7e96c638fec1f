/**
 * The gRPC server's connections (http2/Server.ts): a deadline on each one's handshake, and the server's close,
 * which closes at once every connection that runs no call and leaves those that do to finish them
 * (GrpcServer.ts bounds that wait, then cuts what is left and logs what it cut).
 */

import type * as http2 from "node:http2"
import type * as net from "node:net"
import { MAX_HEADER_LIST_BYTES, MAX_HEADER_LIST_PAIRS } from "./headerLimits.ts"

/**
 * How long an accepted connection has to complete its handshake: TLS when served with TLS, then the HTTP/2
 * client preface (the magic and the client's SETTINGS). One that has not is closed. Node bounds neither for
 * h2c: a plaintext connection gets its session at once and waits for the preface as long as the client waits;
 * over TLS, `handshakeTimeout` (120 s) bounds the TLS part only and `unknownProtocolTimeout` only connections
 * that negotiated no `h2` by ALPN (nodejs/node doc/api/http2.md, doc/api/tls.md). Routers open a connection
 * and speak at once; a connection past its handshake is never closed for being idle (routers keep them).
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

/** Each connection's HTTP/2 settings. */
export const SESSION_SETTINGS: http2.ServerOptions = {
  // As grpc-js: Node's 10 MB session memory cap degrades badly when reached; admission bounds calls instead.
  maxSessionMemory: Number.MAX_SAFE_INTEGER,
  maxSendHeaderBlockLength: Number.MAX_SAFE_INTEGER,
  streamResetBurst: STREAM_RESET_BURST,
  streamResetRate: STREAM_RESET_RATE,
  // Metadata is limited on bytes, not on Node's default count of 128 fields (headerLimits.ts).
  maxHeaderListPairs: MAX_HEADER_LIST_PAIRS,
  settings: { maxHeaderListSize: MAX_HEADER_LIST_BYTES }
}

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
 * A session's socket is a proxy of the accepted one (node:http2 hides it), so the two are matched by the
 * client's address, unique among a listener's open connections.
 */
const peer = (socket: { readonly remoteAddress?: string | undefined; readonly remotePort?: number | undefined }) =>
  `${socket.remoteAddress}|${socket.remotePort}`

export class Connections {
  /** Every session, with the calls open on it. */
  readonly #sessions = new Map<http2.Http2Session, CallTally>()
  /** Accepted connections still in their handshake, with their deadline: none can carry a call yet. */
  readonly #handshaking = new Map<net.Socket, { readonly key: string; readonly deadline: NodeJS.Timeout }>()
  readonly #byPeer = new Map<string, net.Socket>()
  readonly #handshakeMs: number
  readonly #onError: (error: Error) => void
  /** Set by close() and destroy(): what a connection accepted before and past its handshake after then gets. */
  #closing: "close" | "destroy" | undefined

  constructor(handshakeMs: number, onError: (error: Error) => void) {
    this.#handshakeMs = handshakeMs
    this.#onError = onError
  }

  /** Follows `server`'s connections from their accept (before node:http2 makes their session). */
  attach(server: http2.Http2Server | http2.Http2SecureServer): void {
    server.prependListener("connection", (socket: net.Socket) => {
      // Each relayed token is a small write after one still unacknowledged: Nagle's algorithm would hold it back.
      socket.setNoDelay(true)
      const key = peer(socket)
      this.#handshaking.set(socket, { key, deadline: setTimeout(this.#expire, this.#handshakeMs, socket) })
      this.#byPeer.set(key, socket)
      socket.once("close", () => this.#settle(socket))
    })
    server.on("session", (session) => {
      this.#sessions.set(session, { open: 0 })
      // Errors end the session, and 'close' follows: its streams see 'cancelled' there.
      session.on("error", this.#onError)
      session.once("close", () => this.#sessions.delete(session))
      const socket = this.#byPeer.get(peer(session.socket))
      if (socket !== undefined) session.once("remoteSettings", () => this.#settle(socket))
      // Past its TLS handshake after close() or destroy(): it must not take calls, nor hold close().
      if (this.#closing !== undefined) session.destroy()
    })
    server.on("tlsClientError", this.#onError)
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
    for (const socket of this.#handshaking.keys()) socket.destroy()
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
    for (const socket of this.#handshaking.keys()) socket.destroy()
    for (const s of this.#sessions.keys()) s.destroy()
  }

  readonly #expire = (socket: net.Socket): void => {
    this.#settle(socket)
    if (socket.destroyed) return
    this.#onError(new Error(`no HTTP/2 handshake within ${this.#handshakeMs} ms; connection closed`))
    socket.destroy()
  }

  /** The connection is past its handshake, or gone. */
  #settle(socket: net.Socket): void {
    const h = this.#handshaking.get(socket)
    if (h === undefined) return
    clearTimeout(h.deadline)
    this.#handshaking.delete(socket)
    if (this.#byPeer.get(h.key) === socket) this.#byPeer.delete(h.key)
  }
}
