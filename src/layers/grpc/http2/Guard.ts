/**
 * The gRPC server's guard against clients that cost it without calling: the caps on connections open at once per
 * peer and in total, checked at accept (Places.ts), the flood rule over each connection's
 * bytes and over each peer's connections together, sampled on a timer (services/grpc/FloodRule.ts), and the report
 * of connections node:http2 itself closed (its rapid-reset guard, nghttp2's flood detection, protocol errors). Each
 * refusal and closure is reported through `onEvent` (GrpcServer.ts counts and logs them); a peer closed for a flood
 * is refused for FLOOD_COOLDOWN_MS.
 */

import * as http2 from "node:http2"
import type * as net from "node:net"
import { FLOOD_COOLDOWN_MS, peerOf, type RefusedReason } from "../../../services/grpc/ConnectionCaps.ts"
import {
  type ClosedReason,
  closedReason,
  FLOOD_LIMITS,
  type FloodBucket,
  fullBucket,
  headerListBytes,
  PEER_FLOOD_LIMITS,
  PEER_RESET_BURST,
  PEER_RESET_RATE,
  REFUSAL_BURST,
  REFUSAL_RATE,
  type ResetMirror,
  resetMirror,
  resetStep,
  STREAM_FRAME_BYTES
} from "../../../services/grpc/FloodRule.ts"
import { type ResetBudget, STREAM_RESETS } from "./Connections.ts"
import { type FloodRules, type Sampled, sampleFloods } from "./floodSample.ts"
import { type Place, Places } from "./Places.ts"
import type { Http2GrpcServerOptions } from "./ServerOptions.ts"
import { counters } from "./socketCounters.ts"

/**
 * A connection refused at accept, or closed later; `bytes`: a frame flood's waste in its last sample; `forPeer`: the
 * address of the connection an idle one was closed for (idle_evicted).
 */
export type GuardEvent =
  | {
      readonly kind: "refused"
      readonly reason: RefusedReason
      readonly peer: string
      readonly limit: number
      /** What node:tls said of the client's certificate (client_certificate): CERT_HAS_EXPIRED, ... */
      readonly detail?: string
    }
  | {
      readonly kind: "closed"
      readonly reason: ClosedReason
      readonly peer: string
      readonly bytes?: number
      readonly forPeer?: string
    }

/**
 * How often each connection's bytes are sampled: a flood is closed within about this much after its burst is spent
 * (the review's flood spends 8 MiB in ~40 ms). One timer for every connection; a tick reads two counters of each.
 */
export const SAMPLE_MS = 250

/** What the server adds to as a connection's calls arrive (Server.ts): the bytes they account for. */
export interface Accounting {
  accounted: number
  /** The connection's peer and session; absent for a session not followed (closing). */
  readonly peer?: string
  readonly session?: http2.Http2Session
}

interface Followed extends Accounting, Sampled {
  readonly peer: string
  readonly session: http2.Http2Session
  mirror: ResetMirror
  /** Streams refused before a handler (REFUSAL_BURST, REFUSAL_RATE). */
  refusals: ResetMirror
  /** Its connection's place under the caps (told of its streams); undefined if the socket was already gone. */
  readonly place: Place | undefined
}

/** Where the calls of a session not followed (already closed) account: nowhere that is read. */
const nowhere: Accounting = { accounted: 0 }

/** The server's options the guard reads (ServerOptions.ts says what each is). */
export type GuardOptions = Pick<
  Http2GrpcServerOptions,
  | "maxConnectionsPerPeer"
  | "maxConnections"
  | "floodLimits"
  | "peerFloodLimits"
  | "peerResets"
  | "streamResets"
  | "onGuard"
  | "tls"
>

/**
 * Time here is performance.now(), monotonic: a cool-down or a rate measured on the wall clock would stretch by any
 * step of the system clock backwards (an NTP step of an hour kept a cooled-down router refused for an hour).
 */
export class Guard {
  readonly #places: Places
  readonly #floodRules: FloodRules
  readonly #resetBurst: number
  readonly #resetRate: number
  readonly #streamResets: ResetBudget
  readonly #onEvent: (event: GuardEvent) => void
  readonly #sessions = new Map<http2.Http2Session, Followed>()
  /** Each peer's stream resets on all its connections (PEER_RESET_BURST), while it has any not refilled. */
  readonly #peerResets = new Map<string, ResetMirror>()
  /** Each peer's waste on all its connections (PEER_FLOOD_LIMITS), while its bucket is not full. */
  readonly #peerFlood = new Map<string, FloodBucket>()
  #timer: NodeJS.Timeout | undefined

  constructor(options: GuardOptions) {
    this.#onEvent = options.onGuard ?? (() => {})
    const limits = { perPeer: options.maxConnectionsPerPeer ?? 0, total: options.maxConnections ?? 0 }
    // Served with TLS (mutual), the caps close only stuck handshakes for a new connection (Places.ts).
    this.#places = new Places(limits, options.tls !== undefined, this.#onEvent)
    this.#floodRules = {
      connection: options.floodLimits ?? FLOOD_LIMITS,
      peer: options.peerFloodLimits ?? PEER_FLOOD_LIMITS
    }
    this.#resetBurst = options.peerResets?.burst ?? PEER_RESET_BURST
    this.#resetRate = options.peerResets?.ratePerSec ?? PEER_RESET_RATE
    this.#streamResets = options.streamResets ?? STREAM_RESETS
  }

  /**
   * Follows `server`'s connections. Call it after every other 'connection' listener is added: they, node:http2's
   * own (which makes the session, or for TLS starts the handshake) included, run only for a connection the caps
   * admit, so a refused one costs an accept and a close.
   */
  attach(server: http2.Http2Server | http2.Http2SecureServer): void {
    // net.Server and tls.Server add their connection listener as a 'connection' listener (nodejs/node lib/net.js,
    // lib/_tls_wrap.js): taken here and called only for admitted connections.
    const listeners = server.listeners("connection") as Array<(socket: net.Socket) => void>
    server.removeAllListeners("connection")
    server.on("connection", (socket: net.Socket) => {
      if (this.#places.accept(socket)) for (const listener of listeners) listener.call(server, socket)
    })
    server.on("session", (session) => this.#follow(session))
    this.#timer = setInterval(this.#sample, SAMPLE_MS)
    this.#timer.unref()
  }

  /** Stops sampling (the server is closing). */
  stop(): void {
    clearInterval(this.#timer)
  }

  /** Connections open now (admitted, not closed). */
  get open(): number {
    return this.#places.open
  }

  /**
   * A call's stream arrived: its headers are accounted for; returns where its request bytes count, and what the
   * stream's close is told to (onStreamClosed).
   */
  onStream(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders): Accounting {
    const session = stream.session
    const f = session && this.#sessions.get(session)
    if (f === undefined) return nowhere
    f.accounted += headerListBytes(headers) + STREAM_FRAME_BYTES
    if (f.place !== undefined) this.#places.opened(f.place)
    return f
  }

  /**
   * A stream onStream accounted for closed, reset with `rstCode` (an RST_STREAM from the client, or the server's own
   * CANCEL) or not (undefined, NO_ERROR). A reset one is charged to the mirror of Node's rapid-reset guard, as Node
   * counts resets, not streams: a busy connection's later protocol error is then not taken for the guard's closure,
   * and a rapid reset is, however its streams ended (closedReason). Told by the stream's one 'close' listener
   * (ServerCall's, or the server's for a stream it answers without one): a listener of its own per stream cost every
   * call (docs/bench.md, 25th and 26th sessions).
   */
  onStreamClosed(a: Accounting, rstCode: number | undefined): void {
    if (a === nowhere) return
    // Every Accounting but `nowhere` is a Followed (onStream); charged even once its session is no longer followed,
    // as the session's 'error' reads this mirror after its streams closed.
    const f = a as Followed
    if (f.place !== undefined) this.#places.closed(f.place)
    if (rstCode === undefined || rstCode === http2.constants.NGHTTP2_NO_ERROR) return
    f.mirror = resetStep(f.mirror, performance.now(), this.#streamResets.burst, this.#streamResets.ratePerSec)
  }

  /**
   * The caller reset a call on the connection `a` accounts for (not the session's own end): past the peer's budget
   * (PEER_RESET_BURST, on all its connections together) that connection is closed ENHANCE_YOUR_CALM and the peer
   * cools down; its other connections are closed at their next reset.
   */
  onReset(a: Accounting): void {
    const { peer, session } = a
    if (peer === undefined || session === undefined || session.destroyed || session.closed) return
    const now = performance.now()
    const m = resetStep(
      this.#peerResets.get(peer) ?? resetMirror(this.#resetBurst, now),
      now,
      this.#resetBurst,
      this.#resetRate
    )
    this.#peerResets.set(peer, m)
    if (m.left >= 0) return
    this.#close(session, peer, now, "reset_flood")
  }

  /**
   * A stream on the connection `a` accounts for was refused before any handler, for a reason of the caller's making:
   * past REFUSAL_BURST (refilled at REFUSAL_RATE) the connection is closed ENHANCE_YOUR_CALM and its peer cools down.
   */
  onRefused(a: Accounting): void {
    const { peer, session } = a
    if (peer === undefined || session === undefined || session.destroyed || session.closed) return
    const f = this.#sessions.get(session)
    if (f === undefined) return
    const now = performance.now()
    f.refusals = resetStep(f.refusals, now, REFUSAL_BURST, REFUSAL_RATE)
    if (f.refusals.left < 0) this.#close(session, peer, now, "refusal_flood")
  }

  #close(session: http2.Http2Session, peer: string, now: number, reason: ClosedReason, bytes?: number): void {
    this.#sessions.delete(session)
    this.#places.cooldown(peer, now, FLOOD_COOLDOWN_MS)
    // GOAWAY ENHANCE_YOUR_CALM (RFC 9113 7: "the endpoint is ... generating excessive load"), then the socket closes.
    // With an error: destroy(undefined, code) sends NO_ERROR (its first parameter defaults to NO_ERROR, a number that
    // then stands for the code). The error goes to the session's 'error' (onConnectionError, logged at debug).
    session.destroy(
      new Error(`connection closed ENHANCE_YOUR_CALM: ${reason}`),
      http2.constants.NGHTTP2_ENHANCE_YOUR_CALM
    )
    this.#onEvent(bytes === undefined ? { kind: "closed", reason, peer } : { kind: "closed", reason, peer, bytes })
  }

  #follow(session: http2.Http2Session): void {
    const now = performance.now()
    const c = counters(session)
    const f: Followed = {
      peer: peerOf(session.socket?.remoteAddress),
      session,
      accounted: 0,
      bucket: fullBucket(now, this.#floodRules.connection),
      mirror: resetMirror(this.#streamResets.burst, now),
      refusals: resetMirror(REFUSAL_BURST, now),
      read: c?.read ?? 0,
      written: c?.written ?? 0,
      pings: 0,
      settings: 0,
      place: this.#places.settle(session)
    }
    this.#sessions.set(session, f)
    // the client's PINGs and SETTINGS, each acked by node:http2: those acks are no writes of the agent's (FloodRule.ts)
    session.on("ping", () => {
      f.pings++
    })
    session.on("remoteSettings", () => {
      f.settings++
    })
    session.on("error", (e: NodeJS.ErrnoException) => {
      const reason = closedReason(e.errno, f.mirror, this.#streamResets.ratePerSec)
      if (reason === undefined) return
      if (reason !== "protocol_error") this.#places.cooldown(f.peer, performance.now(), FLOOD_COOLDOWN_MS)
      this.#onEvent({ kind: "closed", reason, peer: f.peer })
    })
    session.once("close", () => this.#sessions.delete(session))
  }

  readonly #sample = (): void => {
    const now = performance.now()
    this.#places.prune(now)
    for (const [peer, m] of this.#peerResets)
      if (m.left + ((now - m.atMs) / 1000) * this.#resetRate >= this.#resetBurst) this.#peerResets.delete(peer)
    sampleFloods(this.#sessions, this.#peerFlood, this.#floodRules, now, (session, peer, waste) =>
      this.#close(session, peer, now, "frame_flood", waste)
    )
  }
}
