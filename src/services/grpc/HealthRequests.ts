/**
 * HealthRequests: which service names the agent's grpc.health.v1 answers for, how it answers any other, and how many
 * Watch streams a server holds. The agent knows its names up front: "" (the server as a whole) and the Agent service
 * (layers/grpc/Health.ts PublishedHealth publishes both from the start). Every other name is answered without being stored, so no caller input grows the agent's memory:
 * grpc-health-check 2.1.0 keeps a watcher Set per name watched and never deletes it (removeWatcher deletes the
 * watcher, not the Map entry: grpc-node packages/grpc-health-check/src/health.ts), which leaked ~10 KB per closed
 * Watch of a 10 KB name and let 1 MB names exhaust the heap.
 * The protocol (grpc/grpc doc/health-checking.md; grpc-go health/server.go as the reference server): Check of an
 * unknown service fails NOT_FOUND; Watch of one sends SERVICE_UNKNOWN and stays open. A name is bounded before any
 * lookup: a health request is a service name, and no real one comes near 1 KiB.
 * A Watch stream is the one call a caller may hold open for as long as it likes at no engine cost, and admission
 * does not count it: MAX_WATCHES bounds them per server.
 * Pure: the statuses are handler errors in grpc-js's shape ({ code, details }), as the library's own are
 * (GrpcStatus.ts handlerFailure sends them as they are).
 */
import type { Status } from "nice-grpc-common"
import { AGENT_SERVICE } from "./GrpcServer.ts"
import { healthStatus } from "./GrpcStatus.ts"

/** The names the agent reports: "" (what the kubelet probes) and the Agent service (what routers watch). */
export const HEALTH_NAMES: ReadonlySet<string> = new Set(["", AGENT_SERVICE])

/** The longest service name looked up, in UTF-8 bytes; a longer one is refused INVALID_ARGUMENT. */
export const MAX_SERVICE_NAME_BYTES = 1024

/** How a requested name is answered: by the health state ("known"), as unknown, or refused as too long. */
export type NameLookup = "known" | "unknown" | "too_long"

export const lookupName = (name: string, known: ReadonlySet<string> = HEALTH_NAMES): NameLookup => {
  // UTF-16 length first: a name of more code units than the bound has at least as many UTF-8 bytes; no
  // Buffer.byteLength walk over a 4 MiB name.
  if (name.length > MAX_SERVICE_NAME_BYTES || Buffer.byteLength(name, "utf8") > MAX_SERVICE_NAME_BYTES)
    return "too_long"
  return known.has(name) ? "known" : "unknown"
}

/** A handler error in grpc-js's shape, what a unary handler's callback takes (GrpcStatus.ts HandlerError). */
export interface HealthRefusal {
  readonly code: Status
  readonly details: string
}

/** The caller's name is not quoted back: only its length, so an answer stays small whatever was sent. */
export const nameTooLong = (name: string): HealthRefusal => ({
  code: healthStatus.nameTooLong,
  details: `service name is ${Buffer.byteLength(name, "utf8")} bytes; at most ${MAX_SERVICE_NAME_BYTES}`
})

/** Check of a name the agent does not report (grpc-go health/server.go: NotFound "unknown service"). */
export const unknownService = (known: ReadonlySet<string> = HEALTH_NAMES): HealthRefusal => ({
  code: healthStatus.unknownService,
  details: `unknown service; this server reports ${[...known].map((n) => JSON.stringify(n)).join(" and ")}`
})

/** What Watch of an unknown name sends first and only (health.proto ServingStatus, as the library writes it). */
export const SERVICE_UNKNOWN = { status: "SERVICE_UNKNOWN" } as const

/**
 * Watch streams one server (the main one, the health listener) holds open at once; one more is refused
 * RESOURCE_EXHAUSTED at once. Each holds its call and HTTP/2 stream, ~7 KB measured (both ends in one heap), so this
 * bounds them near 30 MB whatever the connections; routers watch one or two names each, far under it.
 */
export const MAX_WATCHES = 4096

/**
 * Watch streams one client address holds open at once on a server: a router watches one or two names on a connection
 * or two, so this is far above it, and one address cannot take the server's MAX_WATCHES from the routers' Watches.
 */
export const MAX_WATCHES_PER_PEER = 256

/** A Watch past MAX_WATCHES (or the server's own bound): Check still answers, and a Watch later may find room. */
export const tooManyWatches = (limit: number, whose = ""): HealthRefusal => ({
  code: healthStatus.tooManyWatches,
  details: `${limit} Watch streams ${whose === "" ? "" : `${whose} `}are open on this server already; use Check, or Watch again later`
})

/** The service name of a decoded HealthCheckRequest (proto-loader fills a missing field with "", defaults: true). */
export const serviceOf = (request: unknown): string => {
  const service = (request as { service?: unknown } | undefined)?.service
  return typeof service === "string" ? service : ""
}
