/**
 * `security.allowed_client_names` on the gRPC server (Server.ts): each connection's client certificate is judged
 * once, when its session starts (the TLS handshake has completed: node:http2 makes the session at 'secureConnection',
 * nodejs/node lib/internal/http2/core.js connectionListener), and every call on a refused connection ends with the
 * refusal's status (GrpcStatus.ts: PERMISSION_DENIED) before its method is even looked up. The connection is not
 * closed: a client told PERMISSION_DENIED with the names it presented knows what to fix, where a reset handshake
 * says nothing; its calls cost a status each, and the connection caps bound the rest.
 */
import type * as http2 from "node:http2"
import type * as tls from "node:tls"
import { type GrpcFailure, toGrpcFailure } from "../../../services/grpc/GrpcStatus.ts"
import type { ClientNameCheck } from "../../../services/tls/Tls.ts"

/** What a call's session is refused with, undefined when its client may call. */
export type RefusalOf = (session: http2.Http2Session | undefined) => GrpcFailure | undefined

/** Judges each new session of `server` with `check`; returns the lookup the server asks at each call. */
export const followClientNames = (server: http2.Http2SecureServer, check: ClientNameCheck): RefusalOf => {
  const refused = new WeakMap<http2.Http2Session, GrpcFailure>()
  server.on("session", (session) => {
    // node:http2's socket proxy forwards reads and getPeerCertificate to the TLS socket (core.js proxySocketHandler).
    const socket = session.socket as tls.TLSSocket
    const refusal = check.admit(socket.getPeerCertificate(), socket.remoteAddress ?? "unknown")
    if (refusal !== undefined) refused.set(session, toGrpcFailure(refusal))
  })
  return (session) => (session === undefined ? undefined : refused.get(session))
}
