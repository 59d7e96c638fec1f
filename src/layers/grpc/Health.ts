/**
 * grpc.health.v1 on the agent's server, served by the grpc-js team's `grpc-health-check` (HealthImplementation).
 * One HealthImplementation holds the state; the main server and the plaintext health listener both serve it,
 * so a change reaches Check and Watch on both at once.
 * grpc-health-check's Watch never ends by itself (its handler only drops the watcher on 'cancelled';
 * grpc-node packages/grpc-health-check/src/health.ts), and a graceful close waits for every open call:
 * `addHealth` therefore keeps the server's Watch calls and hands back what ends them with UNAVAILABLE.
 */
import type * as grpc from "@grpc/grpc-js"
import { HealthImplementation } from "grpc-health-check"
import { ServerShuttingDown } from "../../services/grpc/CallErrors.ts"
import { AGENT_SERVICE, type ServingStatus } from "../../services/grpc/GrpcServer.ts"
import { toGrpcFailure } from "../../services/grpc/GrpcStatus.ts"
import type { ServerCall } from "./http2/Call.ts"
import type { Http2GrpcServer } from "./http2/Server.ts"

/** The fully qualified name of the health service, as reflection lists it. */
export const HEALTH_SERVICE = "grpc.health.v1.Health"

/**
 * A HealthImplementation that serves `status` for "" and the Agent service. `publish` writes only a change:
 * grpc-health-check sends every setStatus to Watch, and a watcher must see each status once.
 */
export class PublishedHealth {
  readonly implementation = new HealthImplementation()
  #server: ServingStatus | undefined
  #agent: ServingStatus | undefined
  /**
   * `server` for "" (what the kubelet's probes read: the engine and the drain), `agent` for the Agent service (what
   * a router's health check reads: also NOT_SERVING while an operator has the node cordoned).
   */
  publish(server: ServingStatus, agent: ServingStatus = server): void {
    if (server !== this.#server) this.implementation.setStatus("", server)
    if (agent !== this.#agent) this.implementation.setStatus(AGENT_SERVICE, agent)
    this.#server = server
    this.#agent = agent
  }
}

/** Adds Health to `server`; the function it returns ends the Watch calls open on it (shutdown). */
export const addHealth = (server: Http2GrpcServer, health: HealthImplementation): (() => void) => {
  const watches = new Set<ServerCall>()
  // addToServer takes any { addService }: the Watch handler is wrapped on its way to the real server.
  health.addToServer({
    addService: (service: grpc.ServiceDefinition, handlers: grpc.UntypedServiceImplementation) => {
      const watch = handlers.watch as unknown as (call: ServerCall) => void
      server.addService(service, {
        ...handlers,
        watch: (call: ServerCall) => {
          watches.add(call)
          call.once("cancelled", () => watches.delete(call))
          watch(call)
        }
      } as unknown as grpc.UntypedServiceImplementation)
    }
  } as unknown as grpc.Server)
  return () => {
    const ended = toGrpcFailure(new ServerShuttingDown())
    for (const call of watches) call.sendStatus(ended)
    watches.clear()
  }
}
