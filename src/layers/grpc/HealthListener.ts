/**
 * The health-only listener ([agent].listen_health): grpc.health.v1.Health alone, in plaintext, on its own port.
 * It exists for probes that cannot present a client certificate: the kubelet's native gRPC probe speaks
 * plaintext only (kubelet prober/grpc.go dials with insecure credentials), so with require_mtls the main
 * listener refuses it and a Pod never becomes Ready. Nothing but the serving status is exposed here; the
 * state is the main server's (GrpcServer.healthState), so the drain's NOT_SERVING shows on both at once.
 */
import { Effect, Option, type Scope } from "effect"
import type { HealthImplementation } from "grpc-health-check"
import { MAX_SERVICE_NAME_BYTES } from "../../services/grpc/HealthRequests.ts"
import type { KeepaliveTimes } from "../../services/grpc/Keepalive.ts"
import { joinHostPort, splitHostPort } from "../../services/net/HostPort.ts"
import { Metrics } from "../../services/observability/Metrics.ts"
import { bind, errorLogging, type GrpcListenError } from "./GrpcServer.ts"
import { guardReport } from "./guardReport.ts"
import { addHealth } from "./Health.ts"
import { Http2GrpcServer } from "./http2/Server.ts"

/**
 * The largest request taken here: a HealthCheckRequest is one string field, so a name at MAX_SERVICE_NAME_BYTES is
 * that plus 3 bytes (its tag and length); anything larger ends RESOURCE_EXHAUSTED as its length prefix arrives,
 * before it is buffered (grpc's 4 MiB default had let one name be 4 MiB).
 */
export const MAX_HEALTH_REQUEST_BYTES = 2 * MAX_SERVICE_NAME_BYTES

/**
 * The most streams one connection holds open here (SETTINGS_MAX_CONCURRENT_STREAMS; RFC 9113 6.5.2 advises no
 * fewer than 100). A probe uses one stream per connection and a watcher one per name (two are reported), so this
 * bounds what one connection's Watch streams hold, where the main server's 4096 leaves room for Generate.
 */
export const MAX_HEALTH_STREAMS = 100

export interface HealthListener {
  /** The bound address, `host:port` (the real port when asked for port 0). */
  readonly address: string
  readonly port: number
}

/** The connection caps (agent.max_connections_per_peer, agent.max_connections) and keepalive, as on listen_grpc. */
export interface ConnectionCaps {
  readonly maxConnectionsPerPeer: number
  readonly maxConnections: number
  readonly keepalive?: KeepaliveTimes
}

/**
 * Serves grpc.health.v1 on `address` (plaintext) from `state`, the main server's health state (GrpcServer
 * `healthState`): the same statuses for "" and the Agent service, NOT_FOUND for other names, and every change
 * at once on Check and Watch. Its connections are capped by `caps` and guarded as the main server's (http2/Guard.ts,
 * counted and logged alike): a plaintext port on the node's address that anyone can reach, and whose exhaustion of
 * the agent's open files would fail the kubelet's probes. Closes when the scope does.
 */
export const serve = (
  address: string,
  state: HealthImplementation,
  caps?: ConnectionCaps
): Effect.Effect<HealthListener, GrpcListenError, Scope.Scope> =>
  Effect.gen(function* () {
    const run = Effect.runCallbackWith(yield* Effect.context<never>())
    const metrics = Option.getOrUndefined(yield* Effect.serviceOption(Metrics))
    const server = new Http2GrpcServer({
      maxReceiveMessageLength: MAX_HEALTH_REQUEST_BYTES,
      maxConcurrentStreams: MAX_HEALTH_STREAMS,
      ...caps,
      onGuard: guardReport(run, metrics),
      ...errorLogging(run, "gRPC health")
    })
    // Its Watch calls need no ending: the listener closes with destroy.
    addHealth(server, state)
    const port = yield* Effect.acquireRelease(
      bind(server, address, "agent.listen_health"),
      // Only probes and Watch streams here, nothing to let finish: close at once.
      () => Effect.sync(() => server.destroy())
    )
    const bound = joinHostPort(splitHostPort(address).host, port)
    yield* Effect.logInfo("gRPC health listening (plaintext, grpc.health.v1 only)").pipe(
      Effect.annotateLogs({ address: bound })
    )
    return { address: bound, port }
  })
