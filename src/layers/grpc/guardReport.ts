/**
 * What the gRPC server's guard (http2/Guard.ts) refused or closed, in /metrics and the log: every event counted in
 * `cgn_agent_grpc_connections_refused_total` / `_closed_total{reason}` (a 0 sample of each reason from the start),
 * and logged at warn at most once per peer and reason (and refused certificate's reason) a minute (services/observability/RateLimitedLog.ts), with how many
 * were left unlogged since: a flooder reconnecting thousands of times a second makes a line a minute.
 */
import { Effect } from "effect"
import { FLOOD_COOLDOWN_MS, REFUSED_REASONS } from "../../services/grpc/ConnectionCaps.ts"
import {
  CLOSED_REASONS,
  type ClosedReason,
  PEER_RESET_BURST,
  PEER_RESET_RATE,
  REFUSAL_BURST,
  REFUSAL_RATE
} from "../../services/grpc/FloodRule.ts"
import type { MetricsService } from "../../services/observability/Metrics.ts"
import { RateLimitedLog } from "../../services/observability/RateLimitedLog.ts"
import { STREAM_RESET_BURST, STREAM_RESET_RATE } from "./http2/Connections.ts"
import type { GuardEvent } from "./http2/Guard.ts"

/** The warning per reason. */
const MESSAGES: Record<GuardEvent["reason"], string> = {
  peer_limit: "gRPC connection refused: its peer already holds agent.max_connections_per_peer connections",
  total_limit: "gRPC connection refused: agent.max_connections connections are open",
  cooldown: `gRPC connection refused: its peer flooded a connection less than ${FLOOD_COOLDOWN_MS / 1000} s ago`,
  client_certificate:
    "gRPC connection refused: its TLS client certificate did not verify against security.ca_file (the reason in `certificate`)",
  frame_flood:
    "gRPC connection closed (GOAWAY ENHANCE_YOUR_CALM): a flood of frames that carry no call (WINDOW_UPDATE, PRIORITY, resets of closed streams...), on it or on its peer's connections together",
  reset_flood: `gRPC connection closed (ENHANCE_YOUR_CALM): its client reset streams past the budget (${STREAM_RESET_BURST} at once then ${STREAM_RESET_RATE}/s on one connection, node:http2's rapid-reset guard; ${PEER_RESET_BURST} then ${PEER_RESET_RATE}/s on all of a peer's)`,
  refusal_flood: `gRPC connection closed (ENHANCE_YOUR_CALM): streams refused before any method ran (an unknown method, not gRPC, a bad grpc-timeout, a client certificate not allowed) past ${REFUSAL_BURST} at once then ${REFUSAL_RATE}/s`,
  control_flood:
    "gRPC connection closed by nghttp2's flood detection: PING or SETTINGS acks the client does not read, or a header block split past 8 CONTINUATION frames",
  protocol_error: "gRPC connection closed: the client broke HTTP/2 (protocol error)",
  keepalive_timeout:
    "gRPC connection closed: it sent nothing for agent.keepalive_time, nor within agent.keepalive_timeout of a PING (its client is gone or stuck)",
  idle_evicted:
    "gRPC connection closed (GOAWAY NO_ERROR, or its TLS handshake cut): it ran no call, and a new connection past agent.max_connections_per_peer or agent.max_connections took its place"
}

/** Counts (when Metrics is there) and logs each of the guard's events; `run` runs the log effect. */
export const guardReport = (
  run: (effect: Effect.Effect<void>) => unknown,
  metrics: MetricsService | undefined
): ((event: GuardEvent) => void) => {
  if (metrics !== undefined) {
    for (const reason of REFUSED_REASONS) metrics.grpcConnectionsRefused.inc({ reason }, 0)
    for (const reason of CLOSED_REASONS) metrics.grpcConnectionsClosed.inc({ reason }, 0)
  }
  const log = new RateLimitedLog()
  return (event) => {
    if (event.kind === "refused") metrics?.grpcConnectionsRefused.inc({ reason: event.reason })
    else metrics?.grpcConnectionsClosed.inc({ reason: event.reason satisfies ClosedReason })
    // A refused certificate's reason is part of the key: peers node:tls no longer names all read "unknown", and one
    // router's expired certificate must not hide another's from another CA for a minute.
    const key = `${event.reason} ${event.peer}${event.kind === "refused" && event.detail !== undefined ? ` ${event.detail}` : ""}`
    const line = log.note(key, performance.now())
    if (line === undefined) return
    const fields: Record<string, unknown> = { peer: event.peer, reason: event.reason, suppressed: line.suppressed }
    if (line.key !== key) fields.peer = "(many peers)"
    if (event.kind === "refused" && event.limit > 0) fields.limit = event.limit
    if (event.kind === "refused" && event.detail !== undefined) fields.certificate = event.detail
    if (event.kind === "closed" && event.bytes !== undefined) fields.wasted_bytes = event.bytes
    if (event.kind === "closed" && event.forPeer !== undefined) fields.for_peer = event.forPeer
    run(Effect.logWarning(MESSAGES[event.reason], fields))
  }
}
