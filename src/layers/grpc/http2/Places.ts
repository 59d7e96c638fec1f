/**
 * Each gRPC connection's place under the caps (agent.max_connections_per_peer, agent.max_connections), from its
 * accept to its close: counted by services/grpc/ConnectionCaps.ts, and past a cap given to the new connection when
 * IdleOrder names one to close (one stuck in its TLS handshake, or one running no call for a while), else refused at
 * accept. The guard (Guard.ts) asks at each accept and tells each place its streams.
 */
import type * as http2 from "node:http2"
import type * as net from "node:net"
import {
  type CapLimits,
  ConnectionCaps,
  IdleOrder,
  type Idling,
  peerOf
} from "../../../services/grpc/ConnectionCaps.ts"
import { connectionKey } from "./Connections.ts"
import type { GuardEvent } from "./Guard.ts"

/** One admitted connection's place. */
export interface Place extends Idling {
  /** The accepted socket (under TLS, the one the TLS socket wraps), and its four addresses. */
  readonly socket: net.Socket
  readonly key: string
  /** Its HTTP/2 session, once made (for TLS, at the end of its handshake). */
  session: http2.Http2Session | undefined
}

/** A session's socket's four addresses; "" once node:http2 has let the socket go. */
const keyOf = (session: http2.Http2Session): string => {
  try {
    return connectionKey(session.socket)
  } catch {
    return ""
  }
}

/** Not closing (a destroyed one is given back at its socket's 'close', a tick later). */
const alive = (p: Place): boolean => !p.socket.destroyed && p.session?.destroyed !== true

/** Time is performance.now(), monotonic (Guard.ts). */
export class Places {
  readonly #caps: ConnectionCaps
  readonly #order = new IdleOrder<Place>()
  readonly #limits: CapLimits
  readonly #onEvent: (event: GuardEvent) => void
  /** Every admitted connection's place, by its four addresses (one key for the accepted and the TLS socket). */
  readonly #places = new Map<string, Place>()
  /** A plaintext listener: idle connections may be taken, not only stuck handshakes (IdleOrder.victim). */
  readonly #plaintext: boolean

  constructor(limits: CapLimits, tls: boolean, onEvent: (event: GuardEvent) => void) {
    this.#limits = limits
    this.#caps = new ConnectionCaps(limits)
    this.#plaintext = !tls
    this.#onEvent = onEvent
  }

  /**
   * Counts `socket`'s connection in, closing one in its place past a cap when IdleOrder names one (one at most: the
   * connection it frees is under every cap the new one met), or closes it and says so (false).
   */
  accept(socket: net.Socket): boolean {
    // A socket its client reset while it waited in the accept queue has no address (getpeername fails): dead already,
    // and every such socket would have one key. Closed, counted nowhere.
    if (socket.remoteAddress === undefined || socket.destroyed) {
      socket.on("error", () => {})
      socket.destroy()
      return false
    }
    const peer = peerOf(socket.remoteAddress)
    const now = performance.now()
    let refused = this.#caps.admit(peer, now)
    if (refused === "peer_limit" || refused === "total_limit") {
      const victim = this.#order.victim(peer, this.#caps.atPeerCap(peer), now, alive, this.#plaintext)
      if (victim !== undefined) {
        this.#release(victim)
        // GOAWAY NO_ERROR, then the socket closes (a graceful close waits on the client): it runs no call. One still
        // in its TLS handshake has no session yet: its socket alone.
        if (victim.session !== undefined) victim.session.destroy()
        else victim.socket.destroy()
        this.#onEvent({ kind: "closed", reason: "idle_evicted", peer: victim.peer, forPeer: peer })
        refused = this.#caps.admit(peer, now)
      }
    }
    if (refused !== undefined) {
      socket.on("error", () => {})
      socket.destroy()
      const limit = refused === "peer_limit" ? this.#limits.perPeer : refused === "total_limit" ? this.#limits.total : 0
      this.#onEvent({ kind: "refused", reason: refused, peer, limit })
      return false
    }
    const place: Place = {
      peer,
      socket,
      key: connectionKey(socket),
      session: undefined,
      handshakeSinceMs: now,
      calls: 0,
      idleSinceMs: now,
      released: false
    }
    // The newest owns its key: two open sockets never share four addresses, so a place already under it is of a socket
    // closed whose 'close' has not come yet (it is given back by its own flag, and leaves the map only if still its).
    this.#places.set(place.key, place)
    this.#order.accepted(place)
    socket.once("close", () => this.#release(place))
    return true
  }

  /** `session`'s place (by its socket's four addresses), now past its handshake; undefined if it is gone. */
  settle(session: http2.Http2Session): Place | undefined {
    const place = this.#places.get(keyOf(session))
    if (place === undefined) return undefined
    place.session = session
    this.#order.settled(place, performance.now())
    return place
  }

  /** A stream started on `place`'s connection. */
  opened(place: Place): void {
    this.#order.opened(place)
  }

  /** A stream opened on `place`'s connection closed (after the socket's, when the client closed it: then ignored). */
  closed(place: Place): void {
    this.#order.closed(place, performance.now())
  }

  /** Refuses `peer`'s new connections until `nowMs + ms`. */
  cooldown(peer: string, nowMs: number, ms: number): void {
    this.#caps.cooldown(peer, nowMs, ms)
  }

  /** Forgets the cool-downs that are over. */
  prune(nowMs: number): void {
    this.#caps.prune(nowMs)
  }

  /** Connections open now (admitted, not closed). */
  get open(): number {
    return this.#caps.open()
  }

  /** Gives `place` back, once (at its eviction, or at its socket's close after). */
  #release(place: Place): void {
    if (place.released) return
    this.#order.released(place)
    if (this.#places.get(place.key) === place) this.#places.delete(place.key)
    this.#caps.release(place.peer)
  }
}
