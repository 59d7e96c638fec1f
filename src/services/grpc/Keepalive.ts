/**
 * The gRPC server's keepalive (agent.keepalive_time, agent.keepalive_timeout): a connection the agent has heard
 * nothing from for `timeMs` is sent an HTTP/2 PING, and one that has still sent nothing `timeoutMs` after it is
 * closed, its peer taken as gone. As gRPC servers do (grpc-core GRPC_ARG_KEEPALIVE_TIME_MS / _TIMEOUT_MS, grpc-go
 * keepalive.ServerParameters Time / Timeout): a router whose host lost power or its network sends no FIN, and an
 * idle connection then stays open on the agent for good, holding a slot of max_connections_per_peer and
 * max_connections, and a Health Watch on it one of the Watch caps. The rule alone, free of sockets and clocks: the
 * live side (layers/grpc/http2/Keepalive.ts) passes the connection's bytes read and the time.
 *
 * Any byte read counts as hearing from the peer (a PING's ACK is 17), so a busy connection is never pinged and an
 * idle one is pinged once per `timeMs`.
 */
import { Duration } from "effect"

export interface KeepaliveTimes {
  /** How long a connection may be silent before it is pinged; 0: never (no keepalive). */
  readonly timeMs: number
  /** How long after the PING it may stay silent before it is closed. */
  readonly timeoutMs: number
}

/** What the rule knows of one connection. */
export interface Liveness {
  /** The connection's bytes read when last looked at. */
  readonly read: number
  /** When it last read more than before (or was first followed). */
  readonly heardAtMs: number
  /** When a PING was sent that nothing has been heard since; undefined: none. */
  readonly pingedAtMs: number | undefined
}

/** What to do with the connection now. */
export type KeepaliveAction = "ping" | "close" | undefined

export const liveness = (read: number, nowMs: number): Liveness => ({ read, heardAtMs: nowMs, pingedAtMs: undefined })

/** One look at a connection that has read `read` bytes in all by `nowMs`. */
export const livenessStep = (
  l: Liveness,
  read: number,
  nowMs: number,
  times: KeepaliveTimes
): { readonly liveness: Liveness; readonly action: KeepaliveAction } => {
  if (read !== l.read) return { liveness: liveness(read, nowMs), action: undefined }
  if (l.pingedAtMs !== undefined)
    return { liveness: l, action: nowMs - l.pingedAtMs >= times.timeoutMs ? "close" : undefined }
  if (nowMs - l.heardAtMs >= times.timeMs) return { liveness: { ...l, pingedAtMs: nowMs }, action: "ping" }
  return { liveness: l, action: undefined }
}

/**
 * How often the connections are looked at: a quarter of the shorter time, so a PING and a close come at most a
 * quarter late, between 10 ms (tests' short times) and 5 s (one look at every connection, a counter each).
 */
export const lookEveryMs = (times: KeepaliveTimes): number =>
  Math.min(5_000, Math.max(10, Math.floor(Math.min(times.timeMs, times.timeoutMs) / 4)))

/** The times of the config's [agent] keys, for both listeners (listen_grpc, listen_health). */
export const keepaliveTimes = (agent: {
  readonly keepalive_time: Duration.Duration
  readonly keepalive_timeout: Duration.Duration
}): KeepaliveTimes => ({
  timeMs: Duration.toMillis(agent.keepalive_time),
  timeoutMs: Duration.toMillis(agent.keepalive_timeout)
})
