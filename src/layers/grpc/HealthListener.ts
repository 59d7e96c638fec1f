/**
 * The health-only listener ([agent].listen_health): grpc.health.v1.Health alone, in plaintext, on its own port.
 * It exists for probes that cannot present a client certificate: the kubelet's native gRPC probe speaks
 * plaintext only (kubelet prober/grpc.go dials with insecure credentials), so with require_mtls the main
 * listener refuses it and a Pod never becomes Ready. Nothing but the serving status is exposed here; the
 * state is the main server's (GrpcServer.healthState), so the drain's NOT_SERVING shows on both at once.
 */
import { Effect, type Scope } from "effect"
import type { HealthImplementation } from "grpc-health-check"
import { joinHostPort, splitHostPort } from "../../services/net/HostPort.ts"
import { bind, errorLogging, type GrpcListenError } from "./GrpcServer.ts"
import { addHealth } from "./Health.ts"
import { Http2GrpcServer } from "./http2/Server.ts"

export interface HealthListener {
  /** The bound address, `host:port` (the real port when asked for port 0). */
  readonly address: string
  readonly port: number
}

/**
 * Serves grpc.health.v1 on `address` (plaintext) from `state`, the main server's health state (GrpcServer
 * `healthState`): the same statuses for "" and the Agent service, NOT_FOUND for other names, and every change
 * at once on Check and Watch. Closes when the scope does.
 */
export const serve = (
  address: string,
  state: HealthImplementation
): Effect.Effect<HealthListener, GrpcListenError, Scope.Scope> =>
  Effect.gen(function* () {
    const run = Effect.runCallbackWith(yield* Effect.context<never>())
    const server = new Http2GrpcServer({
      // Health requests are a service name: grpc's default 4 MiB limit is far above any.
      maxReceiveMessageLength: 4 * 1024 * 1024,
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
