/** What the agent's gRPC server (Server.ts) is given: its limits, its TLS, and where it reports what it ends. */

import type { FloodLimits } from "../../../services/grpc/FloodRule.ts"
import type { GrpcFailure } from "../../../services/grpc/GrpcStatus.ts"
import type { KeepaliveTimes } from "../../../services/grpc/Keepalive.ts"
import type { TlsSource } from "../../../services/tls/Tls.ts"
import type { ResetBudget } from "./Connections.ts"
import type { GuardEvent } from "./Guard.ts"

export interface Http2GrpcServerOptions {
  /** The largest request message accepted, decompressed (bytes); a larger one ends RESOURCE_EXHAUSTED. */
  readonly maxReceiveMessageLength: number
  /** mTLS: client certificates must chain to the CA; plaintext (h2c) when absent. */
  readonly tls?: TlsSource | undefined
  /**
   * A listening socket's error after listen (a failed accept; libuv absorbs EMFILE itself): reported here, the
   * server goes on. Without a listener Node would throw it and end the daemon.
   */
  readonly onError?: ((error: Error) => void) | undefined
  /**
   * One connection's error (a client breaking HTTP/2, a TLS handshake refused: no or an untrusted client
   * certificate). The connection closes, its calls see 'cancelled'; the server goes on.
   */
  readonly onConnectionError?: ((error: Error) => void) | undefined
  /**
   * A call that ended before its handler ran: no such method, a bad grpc-timeout or message, requests over the
   * arriving-bytes budget, its deadline or requestReadTimeoutMs passed or the caller cancelled while the request was
   * arriving. The handler's own metrics never see these calls. `failure` is the server's status for it; the hook
   * returns the status to send (`failure` itself, or the method's own rule applied to it: GenerateCall.ts rejected
   * binds a Generate leg to its P/D pair). A call cancelled (told CANCELLED) or past its deadline while its request
   * arrived has had its end already: what the hook returns then goes nowhere.
   */
  readonly onRejected?: ((path: string, failure: GrpcFailure) => GrpcFailure) | undefined
  /**
   * Bytes of requests still arriving, on all connections together (received before their handlers run), past
   * which a request's next bytes end it RESOURCE_EXHAUSTED. Admission bounds the calls a handler runs; this
   * bounds what callers that send slowly, or stop halfway, hold before that. Default: no limit.
   */
  readonly maxArrivingBytes?: number | undefined
  /**
   * How long a request with one message (unary, server-streaming) has from its headers to arrive whole, its end
   * included; past it the call ends RESOURCE_EXHAUSTED (RequestReadTimeout) before its handler runs: the bytes above
   * bound what slow senders hold, this how long. Request-streaming methods run their handler at the headers: each of
   * their messages has this long from its first bytes to arrive whole (messageBound.ts). 0 or absent: never.
   */
  readonly requestReadTimeoutMs?: number | undefined
  /** How long a connection has to complete its handshake (default HANDSHAKE_TIMEOUT_MS; tests shorten it). */
  readonly handshakeTimeoutMs?: number | undefined
  /**
   * A connection silent this long is sent a PING, and closed if still silent `timeoutMs` later (Keepalive.ts):
   * agent.keepalive_time and agent.keepalive_timeout. Absent, or `timeMs` 0: no keepalive.
   */
  readonly keepalive?: KeepaliveTimes | undefined
  /** The most streams one connection holds open at once; more are refused (default MIN_CONCURRENT_STREAMS). */
  readonly maxConcurrentStreams?: number | undefined
  /**
   * Connections one peer address may hold open at once; one more takes an idle one's place, or is closed at accept
   * when each runs a call (Guard.ts). 0 or absent: no cap.
   */
  readonly maxConnectionsPerPeer?: number | undefined
  /** Connections open at once on this listener; past it as past the peer's. 0 or absent: no cap. */
  readonly maxConnections?: number | undefined
  /** The flood rule's limits (default FLOOD_LIMITS, services/grpc/FloodRule.ts; tests lower them). */
  readonly floodLimits?: FloodLimits | undefined
  /** What one peer's connections may waste together (default PEER_FLOOD_LIMITS; tests lower them). */
  readonly peerFloodLimits?: FloodLimits | undefined
  /** Stream resets one peer may make on all its connections (default PEER_RESET_BURST/RATE; tests lower them). */
  readonly peerResets?: ResetBudget | undefined
  /** Stream resets one connection may make, Node's rapid-reset guard (default STREAM_RESETS; tests lower them). */
  readonly streamResets?: ResetBudget | undefined
  /** A connection refused at accept or closed for abuse (a flood, Node's rapid-reset guard, a protocol error). */
  readonly onGuard?: ((event: GuardEvent) => void) | undefined
}
