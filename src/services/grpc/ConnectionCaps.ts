/**
 * The gRPC server's caps on connections open at once, per peer address and in total, the cool-down of a peer whose
 * connection was closed for abuse (FloodRule.ts), and the order in which connections past a cap take the places of
 * idle ones (IdleOrder): the bookkeeping alone, free of sockets and clocks (the caller passes the time). The live
 * side is layers/grpc/http2/Places.ts, which asks at each accept, before the connection costs a TLS handshake or an
 * HTTP/2 session.
 */

/** Why a connection was refused at its accept. */
/** client_certificate: a TLS handshake that failed on the client's certificate (mTLS; Connections.ts). */
export type RefusedReason = "peer_limit" | "total_limit" | "cooldown" | "client_certificate"
export const REFUSED_REASONS: ReadonlyArray<RefusedReason> = [
  "peer_limit",
  "total_limit",
  "cooldown",
  "client_certificate"
]

/**
 * How long a peer whose connection was closed for a flood (of cheap frames, or of stream resets past Node's guard)
 * is refused new connections. Without it a flooder reconnects at once and floods again until the next sample
 * closes it: the floods' CPU is bounded by their share of time, not by the rule. A router never floods; a router
 * that hit the reset guard (more than 10,000 cancels at once on one connection) has broken its calls already.
 */
export const FLOOD_COOLDOWN_MS = 10_000

/** The most peers kept in cool-down at once (each earned it with a TCP connection; a bound on memory all the same). */
const MAX_COOLDOWNS = 10_000

/**
 * A peer as the caps count it: its IP address, an IPv4-mapped IPv6 address (a dual-stack listener's view of an
 * IPv4 client, `::ffff:10.0.0.7`) as the IPv4 address, so one client is one peer on either kind of listener.
 */
export const peerOf = (remoteAddress: string | undefined): string => {
  const a = remoteAddress ?? "unknown"
  return a.startsWith("::ffff:") && a.includes(".") ? a.slice(7) : a
}

/**
 * How long a connection may be in its TLS handshake before IdleOrder.victim may name it for a new one: a router's
 * takes milliseconds on a LAN, and one at a cap must not lose its place to a connection just accepted. An older one
 * is in no hurry (Connections.ts closes it at 10 s anyway), and connections that never start TLS (4,096 of them,
 * each replaced within the 10 s) held every place of the total cap against every router.
 */
export const STALE_HANDSHAKE_MS = 1_000

/**
 * How long a connection must have run no call before IdleOrder.victim may name it: a router's connection is idle for
 * microseconds between back-to-back calls, and closed then the call it has just sent is refused (REFUSED_STREAM, which
 * gRPC clients retry, after a reconnection): a review's loop of connects refused 540 calls in 4 s that way.
 */
export const SETTLED_IDLE_MS = 1_000

export interface CapLimits {
  /** Connections one peer address may hold open at once; 0: no cap. */
  readonly perPeer: number
  /** Connections open at once on the listener; 0: no cap. */
  readonly total: number
}

export class ConnectionCaps {
  readonly #limits: CapLimits
  readonly #byPeer = new Map<string, number>()
  /** Peer -> until when (ms) its new connections are refused. */
  readonly #cooling = new Map<string, number>()
  #total = 0

  constructor(limits: CapLimits) {
    this.#limits = limits
  }

  /** Counts a new connection from `peer` in, or says why it is refused (then nothing is counted). */
  admit(peer: string, nowMs: number): RefusedReason | undefined {
    const until = this.#cooling.get(peer)
    if (until !== undefined) {
      if (nowMs < until) return "cooldown"
      this.#cooling.delete(peer)
    }
    const { perPeer, total } = this.#limits
    // Its own cap first: a peer past both is refused for its own (and frees a place under both with one of its own).
    const held = this.#byPeer.get(peer) ?? 0
    if (perPeer > 0 && held >= perPeer) return "peer_limit"
    if (total > 0 && this.#total >= total) return "total_limit"
    this.#byPeer.set(peer, held + 1)
    this.#total++
    return undefined
  }

  /** An admitted connection of `peer` closed. */
  release(peer: string): void {
    const held = this.#byPeer.get(peer)
    if (held === undefined) return
    if (held <= 1) this.#byPeer.delete(peer)
    else this.#byPeer.set(peer, held - 1)
    this.#total--
  }

  /** Refuses `peer`'s new connections until `nowMs + ms` (its open ones are the caller's to close). */
  cooldown(peer: string, nowMs: number, ms = FLOOD_COOLDOWN_MS): void {
    if (this.#cooling.size >= MAX_COOLDOWNS) this.prune(nowMs)
    if (this.#cooling.size >= MAX_COOLDOWNS) return
    this.#cooling.set(peer, Math.max(this.#cooling.get(peer) ?? 0, nowMs + ms))
  }

  /** Forgets the cool-downs that are over. */
  prune(nowMs: number): void {
    for (const [peer, until] of this.#cooling) if (until <= nowMs) this.#cooling.delete(peer)
  }

  /** Whether `peer` holds as many connections as it may (its next is refused at its own cap, whatever the total). */
  atPeerCap(peer: string): boolean {
    return this.#limits.perPeer > 0 && (this.#byPeer.get(peer) ?? 0) >= this.#limits.perPeer
  }

  /** Connections open now, in total and from `peer`. */
  open(peer?: string): number {
    return peer === undefined ? this.#total : (this.#byPeer.get(peer) ?? 0)
  }
}

/** An open connection as IdleOrder keeps it (the caller's object: IdleOrder keeps its fields up to date). */
export interface Idling {
  readonly peer: string
  /** Still in its TLS handshake: since when (ms); undefined past it. */
  handshakeSinceMs: number | undefined
  /** Its streams open (calls, and streams the server is refusing). */
  calls: number
  /** When it last came to run no call (ms), past its handshake. */
  idleSinceMs: number
  /** Closed (or taken): no longer kept, whatever its streams do after (they close after the socket, a client's close). */
  released: boolean
}

interface Kinds<C> {
  /** Those in their TLS handshake, in the order they were accepted. */
  readonly handshakes: Set<C>
  /** Those past it running no call, in the order they last became so. */
  readonly idle: Set<C>
}

const kinds = <C>(): Kinds<C> => ({ handshakes: new Set(), idle: new Set() })

/**
 * The connections a new one past a cap may take the place of: those in their TLS handshake and those running no
 * call, of each peer and of all, each kind in the order it became so (a Set keeps insertion order), so the oldest
 * is the first and nothing is scanned. An idle connection costs its client a reconnection at its next call; a
 * refused one cost the new client its node: a router behind a shared address, or after others' connections filled
 * the cap, was locked out for as long as they stayed. A Health Watch is a call: its connection is never taken.
 */
export class IdleOrder<C extends Idling> {
  readonly #all = kinds<C>()
  readonly #byPeer = new Map<string, Kinds<C>>()

  /** `c` was accepted, its handshakeSinceMs set. */
  accepted(c: C): void {
    this.#add(c, "handshakes")
  }

  /** `c`'s handshake is over (its HTTP/2 session made) at `nowMs`. */
  settled(c: C, nowMs: number): void {
    if (c.released) return
    this.#remove(c, "handshakes")
    c.handshakeSinceMs = undefined
    if (c.calls === 0) this.#idle(c, nowMs)
  }

  /** A stream started on `c`. */
  opened(c: C): void {
    if (c.released) return
    if (c.calls++ === 0 && c.handshakeSinceMs === undefined) this.#remove(c, "idle")
  }

  /** A stream of `c`'s closed at `nowMs`. */
  closed(c: C, nowMs: number): void {
    if (c.released) return
    if (--c.calls === 0 && c.handshakeSinceMs === undefined) this.#idle(c, nowMs)
  }

  /** `c` closed (or was taken): forgotten for good. */
  released(c: C): void {
    c.released = true
    this.#remove(c, "handshakes")
    this.#remove(c, "idle")
  }

  /**
   * The connection to close so that one of `peer`'s refused at a cap is admitted, closing no more than that. At its
   * own cap (`atPeerCap`) one of its own, which frees a place under both caps: the one longest in its handshake past
   * STALE_HANDSHAKE_MS, else (`plaintext`) the one idle longest past SETTLED_IDLE_MS. At the total cap alone, first
   * any peer's stale handshake, then (`plaintext`) its own idle one, then another peer's. Under TLS (mutual, here)
   * only stale handshakes: the new connection has not shown a certificate yet, and one that has (a router's, idle
   * between its calls) is never closed for it, though it come from the same address (a review showed a raw connect
   * every 300 ms from a router's address keeping one of its channels out). On a plaintext listener no connection
   * shows anything, and idle ones are what locked routers out. Undefined when there is none: the new one is refused.
   * `alive` passes over those already closing.
   */
  victim(peer: string, atPeerCap: boolean, nowMs: number, alive: (c: C) => boolean, plaintext: boolean): C | undefined {
    const own = this.#byPeer.get(peer)
    const ownIdle = (): C | undefined => (plaintext && own !== undefined ? settled(own, nowMs, alive) : undefined)
    if (atPeerCap) return (own && stale(own, nowMs, alive)) ?? ownIdle()
    return stale(this.#all, nowMs, alive) ?? ownIdle() ?? (plaintext ? settled(this.#all, nowMs, alive) : undefined)
  }

  #idle(c: C, nowMs: number): void {
    c.idleSinceMs = nowMs
    this.#add(c, "idle")
  }

  #add(c: C, kind: keyof Kinds<C>): void {
    this.#all[kind].add(c)
    let k = this.#byPeer.get(c.peer)
    if (k === undefined) {
      k = kinds()
      this.#byPeer.set(c.peer, k)
    }
    k[kind].add(c)
  }

  #remove(c: C, kind: keyof Kinds<C>): void {
    this.#all[kind].delete(c)
    const k = this.#byPeer.get(c.peer)
    if (k === undefined) return
    k[kind].delete(c)
    if (k.handshakes.size === 0 && k.idle.size === 0) this.#byPeer.delete(c.peer)
  }
}

const first = <C>(set: ReadonlySet<C>, alive: (c: C) => boolean): C | undefined => {
  for (const c of set) if (alive(c)) return c
  return undefined
}

/** The oldest of `k`'s handshakes, if STALE_HANDSHAKE_MS old (the others are younger). */
const stale = <C extends Idling>(k: Kinds<C>, nowMs: number, alive: (c: C) => boolean): C | undefined => {
  const c = first(k.handshakes, alive)
  const since = c?.handshakeSinceMs
  return since !== undefined && nowMs - since >= STALE_HANDSHAKE_MS ? c : undefined
}

/** The one of `k` idle longest, if SETTLED_IDLE_MS long (the others are shorter). */
const settled = <C extends Idling>(k: Kinds<C>, nowMs: number, alive: (c: C) => boolean): C | undefined => {
  const c = first(k.idle, alive)
  return c !== undefined && nowMs - c.idleSinceMs >= SETTLED_IDLE_MS ? c : undefined
}
