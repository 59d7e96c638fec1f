/**
 * The health-only listener ([agent].listen_health): grpc.health.v1.Health alone, in plaintext, on its own port.
 * It exists for probes that cannot present a client certificate: the kubelet's native gRPC probe speaks
 * plaintext only (kubelet prober/grpc.go dials with insecure credentials), so with require_mtls the main
 * listener refuses it and a Pod never becomes Ready. Nothing but the serving status is exposed here; the
 * status is the main server's (GrpcServer.health), so the drain's NOT_SERVING shows on both at once.
 */
import * as grpc from "@grpc/grpc-js"
import { Duration, Effect, type Scope } from "effect"
import { HealthDefinition, HealthServiceImpl, HealthState } from "nice-grpc-server-health"
import { joinHostPort, splitHostPort } from "../services/Advertise.ts"
import { AGENT_SERVICE, type ServingStatus } from "../services/GrpcServer.ts"
import { GrpcListenError } from "./GrpcServer.ts"
import { addNiceService } from "./niceGrpcAdapter.ts"

export interface HealthListener {
  /** The bound address, `host:port` (the real port when asked for port 0). */
  readonly address: string
  readonly port: number
}

/** How often Watch streams pick up a change; Check always answers the status of the moment. */
const WATCH_PERIOD = Duration.seconds(1)

/**
 * Serves grpc.health.v1 on `address` (plaintext) with the status `health` reports, for "" and the Agent
 * service (other names: NOT_FOUND, as on the main listener). Closes when the scope does.
 */
export const serve = (
  address: string,
  health: Effect.Effect<ServingStatus>
): Effect.Effect<HealthListener, GrpcListenError, Scope.Scope> =>
  Effect.gen(function* () {
    const context = yield* Effect.context<never>()
    const state = HealthState()
    state.setMaxListeners(0)
    const sync = Effect.map(health, (s) => {
      const status = s === "SERVING" ? "healthy" : "unhealthy"
      state.setStatus(status)
      state.setStatus(status, AGENT_SERVICE)
    })
    yield* sync
    // Watch streams follow `state`; the status has no change stream of its own, so follow it on the Clock.
    yield* sync.pipe(Effect.delay(WATCH_PERIOD), Effect.forever, Effect.forkScoped)
    const base = HealthServiceImpl(state)
    const impl: typeof base = {
      check: async (request, ctx) => {
        await Effect.runPromiseWith(context)(sync)
        return base.check(request, ctx)
      },
      watch: base.watch
    }

    const server = new grpc.Server()
    addNiceService(server, HealthDefinition, impl)
    const port = yield* Effect.acquireRelease(
      Effect.tryPromise({
        try: () =>
          new Promise<number>((resolve, reject) =>
            server.bindAsync(address, grpc.ServerCredentials.createInsecure(), (err, bound) =>
              err === null ? resolve(bound) : reject(err)
            )
          ),
        catch: (e) => new GrpcListenError({ address, message: e instanceof Error ? e.message : String(e) })
      }),
      // Only probes and Watch streams here, nothing to let finish: close at once.
      () => Effect.sync(() => server.forceShutdown())
    )
    const bound = joinHostPort(splitHostPort(address).host, port)
    yield* Effect.logInfo("gRPC health listening (plaintext, grpc.health.v1 only)").pipe(
      Effect.annotateLogs({ address: bound })
    )
    return { address: bound, port }
  })
