/**
 * The gRPC server's caps on connections open at once, per peer address and in total, and the cool-down of a peer
 * whose connection was closed for abuse (FloodRule.ts): the bookkeeping alone, free of sockets and clocks (the
 * caller passes the time). The live side is layers/grpc/http2/Guard.ts, which asks `admit` at each accept, before
 * the connection costs a TLS handshake or an HTTP/2 session.
 */

/** Why a connection was refused at its accept. */
export type RefusedReason = "peer_limit" | "total_limit" | "cooldown"
export const REFUSED_REASONS: ReadonlyArray<RefusedReason> = ["peer_limit", "total_limit", "cooldown"]

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

/** What idleVictim weighs of an open connection. */
export interface IdleConnection {
  readonly peer: string
  /** Its streams open (calls, and streams the server is refusing). */
  readonly calls: number
  /** When its last stream started or closed, as a sequence number over all connections (larger: later). */
  readonly activeSeq: number
  /** Still in its TLS handshake: since when (ms); undefined past it. */
  readonly handshakeSinceMs?: number | undefined
}

/**
 * How long a connection may be in its TLS handshake before idleVictim may close it for a new one: a router's takes
 * milliseconds on a LAN, and one at a cap must not lose to a connection just accepted. An older one is in no hurry
 * (Connections.ts closes it at 10 s anyway), and connections that never start TLS (4,096 of them, each replaced
 * within the 10 s) held every place of the total cap against every router.
 */
export const STALE_HANDSHAKE_MS = 1_000

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
    if (total > 0 && this.#total >= total) return "total_limit"
    const held = this.#byPeer.get(peer) ?? 0
    if (perPeer > 0 && held >= perPeer) return "peer_limit"
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

  /**
   * The connection to close so that one refused at a cap (`reason`) is admitted, of `peer` at its cap (peer_limit)
   * or of any peer at the total cap: the one longest in its TLS handshake past STALE_HANDSHAKE_MS, else of those
   * past it running no call, the one whose last call started or ended longest ago (the least `activeSeq`);
   * undefined when there is none (each runs a call, a Health Watch is one, or is in a fresh handshake). An idle
   * connection costs its client a reconnection at its next call; a refused one cost the new client its node: a
   * router behind a shared address, or after others' connections filled the cap, was locked out for as long as
   * they stayed.
   */
  static idleVictim<C extends IdleConnection>(
    connections: Iterable<C>,
    reason: "peer_limit" | "total_limit",
    peer: string,
    nowMs: number
  ): C | undefined {
    let stale: C | undefined
    let staleSince = nowMs - STALE_HANDSHAKE_MS
    let idle: C | undefined
    for (const c of connections) {
      if (c.calls > 0 || (reason === "peer_limit" && c.peer !== peer)) continue
      const since = c.handshakeSinceMs
      if (since === undefined) {
        if (idle === undefined || c.activeSeq < idle.activeSeq) idle = c
      } else if (since <= staleSince) {
        stale = c
        staleSince = since
      }
    }
    return stale ?? idle
  }

  /** Connections open now, in total and from `peer`. */
  open(peer?: string): number {
    return peer === undefined ? this.#total : (this.#byPeer.get(peer) ?? 0)
  }
}
