/**
 * The warning for gRPC served in plaintext off loopback, `run`'s at start and `check`'s: Generate has no
 * authentication but mTLS, so such a port lets anyone who reaches it use the engine. A warning, not a refusal (the
 * admin port's is one, layers/admin/Admin.ts requireAdminToken): the default listen_grpc is such a port, and a
 * host firewall in front of it is a sound setup the agent cannot see. The advice is the README's (agent.listen_grpc):
 * a NetworkPolicy does not restrict a hostNetwork pod (examples/k8s) in most CNIs, and means nothing on a bare host.
 */
import type { AgentConfig } from "../services/config/Config.ts"
import { isLoopbackHost, splitHostPort } from "../services/net/HostPort.ts"

/** The warning, or undefined when gRPC is on loopback or needs mTLS. */
export const plaintextGrpcWarning = (c: AgentConfig): string | undefined => {
  if (c.security.require_mtls || isLoopbackHost(splitHostPort(c.agent.listen_grpc).host)) return undefined
  return (
    `gRPC listens on ${c.agent.listen_grpc} (agent.listen_grpc) without TLS: anyone who reaches the port can run ` +
    "Generate on the engine, unauthenticated; set [security] require_mtls = true (with a CA of its own), or restrict " +
    "the port: bind listen_grpc to one interface's address, or filter the port in the host's firewall (a " +
    "NetworkPolicy does not restrict a hostNetwork pod in most CNIs)"
  )
}
