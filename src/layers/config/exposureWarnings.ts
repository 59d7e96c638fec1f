/**
 * Warnings for what the config leaves open, `run`'s at start and `check`'s. gRPC served in plaintext off loopback:
 * Generate has no authentication but mTLS, so such a port lets anyone who reaches it use the engine. A warning, not a
 * refusal (the admin port's is one, layers/admin/Admin.ts requireAdminToken): the default listen_grpc is such a port,
 * and a host firewall in front of it is a sound setup the agent cannot see. The advice is the README's
 * (agent.listen_grpc): a NetworkPolicy does not restrict a hostNetwork pod (examples/k8s) in most CNIs, and means
 * nothing on a bare host. And engine.api_key sent over plain HTTP to another host (a proxied server), or too short
 * to be kept out of the engine's output. And a key that no longer does what the config asks of it (agent.health_damping).
 */

import type { AgentConfig } from "../../services/config/Config.ts"
import { MIN_SCRUBBED_LENGTH } from "../../services/engine/LineRedactor.ts"
import { isLoopbackHost, splitHostPort } from "../../services/net/HostPort.ts"
import { engineOf } from "../engine/backends/index.ts"

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

/**
 * The warning for engine.api_key sent in clear text off the host: a proxied server (one the backend does not spawn) at
 * an http:// URL that is not loopback. A spawned engine listens on this host, so its requests never leave it.
 */
export const plaintextEngineKeyWarning = (c: AgentConfig): string | undefined => {
  if (c.engine.api_key === undefined || engineOf(c).capabilities.spawns) return undefined
  const url = new URL(c.engine.url)
  if (url.protocol !== "http:" || isLoopbackHost(url.hostname)) return undefined
  return (
    `engine.api_key goes to ${url.host} (engine.url) over plain HTTP: anyone on the network path can read it and use ` +
    "the server with it; give the server an https:// URL"
  )
}

/**
 * The warning for an engine.api_key too short to be scrubbed from the engine's output: values under
 * MIN_SCRUBBED_LENGTH are left in the lines the agent logs and keeps for /status (a spawned engine that prints its
 * settings prints the key). Not a refusal: the engine takes any key, and a short one may be a test's.
 */
export const shortEngineKeyWarning = (c: AgentConfig): string | undefined => {
  const key = c.engine.api_key
  if (key === undefined || key.length >= MIN_SCRUBBED_LENGTH) return undefined
  return (
    `engine.api_key is ${key.length} character${key.length === 1 ? "" : "s"}: guessable, and too short to be told ` +
    `from other text, so not scrubbed from the engine's output (values of ${MIN_SCRUBBED_LENGTH} characters or more ` +
    "are); use a long random key"
  )
}

/**
 * The warning for agent.health_damping set at all (its old default 2 too): it no longer has an effect. It held a
 * liveness-probe `unhealthy` out of the etcd record for that many heartbeats, but a liveness loss ends the run
 * (layers/engine/watch.ts), so the record said `ready` while the engine was being torn down and every call refused.
 * Still accepted (an unknown key exits 2), so configs that set it keep starting.
 */
export const healthDampingWarning = (c: AgentConfig): string | undefined =>
  c.agent.health_damping === undefined
    ? undefined
    : `agent.health_damping = ${c.agent.health_damping} has no effect any more: every node state reaches etcd as ` +
      "it happens (an engine's liveness failure ends its run, a fact, not a flap); remove the key"

/** Every warning above that applies. */
export const exposureWarnings = (c: AgentConfig): ReadonlyArray<string> =>
  [plaintextGrpcWarning(c), plaintextEngineKeyWarning(c), shortEngineKeyWarning(c), healthDampingWarning(c)].filter(
    (w) => w !== undefined
  )
