/**
 * grpc.health.v1 on the agent's server, served by the grpc-js team's `grpc-health-check` (HealthImplementation) for
 * the names the agent reports ("" and the Agent service: services/grpc/HealthRequests.ts) and here for every other.
 * One HealthImplementation holds the state; the main server and the plaintext health listener both serve it,
 * so a change reaches Check and Watch on both at once.
 * The library keeps a watcher Set per name ever watched, never deleted (grpc-node packages/grpc-health-check/src/
 * health.ts removeWatcher): handed any caller's name it grew by every distinct name, until the heap ran out. So it
 * sees only the known names (its Map holds those two); a name over MAX_SERVICE_NAME_BYTES is refused
 * INVALID_ARGUMENT before any lookup, and an unknown one is answered as grpc-go's server does (health/server.go):
 * Check NOT_FOUND, Watch SERVICE_UNKNOWN on a stream that stays open holding nothing but itself. The agent reports
 * no name later, so an unknown name never needs an update.
 * grpc-health-check's Watch never ends by itself (its handler only drops the watcher on 'cancelled'), and a
 * graceful close waits for every open call: `addHealth` therefore keeps the server's Watch calls and hands back what
 * ends them with UNAVAILABLE.
 */
import type * as grpc from "@grpc/grpc-js"
import { HealthImplementation } from "grpc-health-check"
import { ServerShuttingDown } from "../../services/grpc/CallErrors.ts"
import { AGENT_SERVICE, type ServingStatus } from "../../services/grpc/GrpcServer.ts"
import { handlerFailure, toGrpcFailure } from "../../services/grpc/GrpcStatus.ts"
import {
  HEALTH_NAMES,
  lookupName,
  MAX_WATCHES,
  MAX_WATCHES_PER_PEER,
  nameTooLong,
  SERVICE_UNKNOWN,
  serviceOf,
  tooManyWatches,
  unknownService
} from "../../services/grpc/HealthRequests.ts"
import type { ServerCall, UnaryCallback } from "./http2/Call.ts"
import type { Http2GrpcServer } from "./http2/Server.ts"

/** The fully qualified name of the health service, as reflection lists it. */
export const HEALTH_SERVICE = "grpc.health.v1.Health"

/**
 * A HealthImplementation that serves `status` for "" and the Agent service (HEALTH_NAMES: the only names addHealth
 * hands it). `publish` writes only a change:
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

/**
 * Adds Health to `server`; the function it returns ends the Watch calls open on it (shutdown). `known`: the names
 * `health` is given statuses for (HEALTH_NAMES, what PublishedHealth publishes); only those reach the library.
 * `maxWatches`: the Watch streams it holds open at once (MAX_WATCHES; tests lower it).
 */
export const addHealth = (
  server: Http2GrpcServer,
  health: HealthImplementation,
  {
    known = HEALTH_NAMES,
    maxWatches = MAX_WATCHES,
    maxWatchesPerPeer = MAX_WATCHES_PER_PEER
  }: { known?: ReadonlySet<string>; maxWatches?: number; maxWatchesPerPeer?: number } = {}
): (() => void) => {
  const watches = new Set<ServerCall>()
  // Each address's open Watches (an entry only while it has one): one address cannot fill the server's bound.
  const perPeer = new Map<string, number>()
  const unknown = unknownService(known)
  const full = handlerFailure(tooManyWatches(maxWatches))
  const peerFull = handlerFailure(tooManyWatches(maxWatchesPerPeer, "from this client address"))
  // addToServer takes any { addService }: Check and Watch are wrapped on their way to the real server (List passes
  // as it is: it lists the library's statuses, the known names only).
  health.addToServer({
    addService: (service: grpc.ServiceDefinition, handlers: grpc.UntypedServiceImplementation) => {
      const check = handlers.check as unknown as (call: ServerCall, callback: UnaryCallback) => void
      const watch = handlers.watch as unknown as (call: ServerCall) => void
      server.addService(service, {
        ...handlers,
        check: (call: ServerCall, callback: UnaryCallback) => {
          const name = serviceOf(call.request)
          const lookup = lookupName(name, known)
          if (lookup === "known") check(call, callback)
          else callback(lookup === "too_long" ? nameTooLong(name) : unknown)
        },
        watch: (call: ServerCall) => {
          const name = serviceOf(call.request)
          const lookup = lookupName(name, known)
          if (lookup === "too_long") {
            call.sendStatus(handlerFailure(nameTooLong(name)))
            return
          }
          const peer = call.peer
          const mine = perPeer.get(peer) ?? 0
          if (watches.size >= maxWatches || mine >= maxWatchesPerPeer) {
            call.sendStatus(mine >= maxWatchesPerPeer ? peerFull : full)
            return
          }
          watches.add(call)
          perPeer.set(peer, mine + 1)
          call.once("cancelled", () => {
            watches.delete(call)
            const left = (perPeer.get(peer) ?? 1) - 1
            if (left > 0) perPeer.set(peer, left)
            else perPeer.delete(peer)
          })
          // An unknown name: the status once, then the stream stays open as the protocol asks; nothing is kept
          // for it but the call itself, in `watches` until it ends.
          if (lookup === "unknown") call.write(SERVICE_UNKNOWN)
          else watch(call)
        }
      } as unknown as grpc.UntypedServiceImplementation)
    }
  } as unknown as grpc.Server)
  return () => {
    const ended = toGrpcFailure(new ServerShuttingDown())
    for (const call of watches) call.sendStatus(ended)
    watches.clear()
    perPeer.clear()
  }
}
