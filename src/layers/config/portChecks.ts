/**
 * Ports across the config (pure; no I/O, no DNS): the agent's listeners that would take one socket (a host in any
 * spelling of one address, a wildcard meeting every host), and the ports a data-parallel engine offsets by its rank
 * (port + r), whose last rank must still have a port.
 */
import type { ConfigFile } from "../../services/config/ConfigSchema.ts"
import { formatPath } from "../../services/config/SchemaProblems.ts"
import { canonicalHost, isWildcardHost, listenAddresses, splitHostPort } from "../../services/net/HostPort.ts"
import { engineOf } from "../engine/backends/index.ts"

/** The agent's listeners that are set: [key under agent, host:port]. */
export const listeners = (c: ConfigFile): Array<readonly [string, string]> => [
  ["listen_grpc", c.agent.listen_grpc],
  ["listen_admin", c.agent.listen_admin],
  ...(c.agent.listen_health === undefined ? [] : [["listen_health", c.agent.listen_health] as const])
]

/**
 * Why listeners on hosts `a` and `b`, on one port, take the same socket; undefined when they do not. Spellings of
 * one address meet (`127.1` and `127.0.0.1`, `[::ffff:127.0.0.1]` and `127.0.0.1`), and `localhost` meets both
 * 127.0.0.1 and ::1 (the resolver decides which it binds).
 */
export const sameSocket = (a: string, b: string): string | undefined => {
  for (const h of [a, b]) if (isWildcardHost(h)) return `same port, and ${h} is every address of this host`
  if (canonicalHost(a) === canonicalHost(b)) return "same host and port"
  const bs = listenAddresses(b)
  const shared = listenAddresses(a).find((x) => bs.includes(x))
  return shared === undefined ? undefined : `same port, and ${a} and ${b} both name ${shared}`
}

/** Two listeners on one host:port (a wildcard host meets every host): the second to bind fails with EADDRINUSE. */
export const listenerProblems = (c: ConfigFile): Array<string> => {
  const problems: Array<string> = []
  const all = listeners(c)
  for (const [i, [key, addr]] of all.entries()) {
    const { host, port } = splitHostPort(addr)
    if (Number(port) === 0) continue // the OS picks a free port for each
    for (const [otherKey, other] of all.slice(0, i)) {
      const o = splitHostPort(other)
      const why = Number(o.port) === Number(port) ? sameSocket(host, o.host) : undefined
      if (why !== undefined) {
        problems.push(
          `agent.${key}: "${addr}" overlaps agent.${otherKey} = "${other}" (${why}); the second to bind would fail with EADDRINUSE: give each its own port`
        )
      }
    }
  }
  return problems
}

/** The port of a `tcp://host:port` ZMQ endpoint, else undefined. */
export const tcpPort = (endpoint: string): number | undefined => {
  const m = /^tcp:\/\/.*:(\d+)$/.exec(endpoint)
  return m === null ? undefined : Number(m[1])
}

/**
 * The ports a DP engine uses once per rank, as [key, first port, who takes port + r]; undefined where the key is
 * not used. KV events and replay: each rank's publisher and ROUTER (README, models.<name>.dp); NIXL's side
 * channel: the engine's handshake listener on side_channel_port + the DP rank (Engine.capabilities
 * .sideChannelOffloads: vLLM with NIXL).
 */
const rankedPorts = (c: ConfigFile): ReadonlyArray<readonly [string, number | undefined, string]> => [
  ["kv.events_endpoint", c.kv.events ? tcpPort(c.kv.events_endpoint) : undefined, "rank r publishes KV events"],
  [
    "kv.replay_endpoint",
    c.kv.events && c.kv.replay_endpoint !== undefined ? tcpPort(c.kv.replay_endpoint) : undefined,
    "rank r answers replays"
  ],
  [
    "engine.side_channel_port",
    engineOf(c).capabilities.sideChannelOffloads?.includes(c.engine.kv_offload) === true
      ? c.engine.side_channel_port
      : undefined,
    "the engine's rank r listens for KV-transfer handshakes"
  ]
]

/** A port + the last DP rank past 65535: that rank's bind fails (ZMQ retries it forever), the others run. */
export const rankedPortProblems = (c: ConfigFile, model: string, dp: number): Array<string> =>
  rankedPorts(c).flatMap(([key, port, who]) =>
    port !== undefined && port + dp - 1 > 65535
      ? [
          `${key}: with ${formatPath(["models", model, "dp"])} = ${dp}, ${who} on port ${port} + r, up to ${port + dp - 1}, past 65535; use a port of at most ${65536 - dp}`
        ]
      : []
  )
