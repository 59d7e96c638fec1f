/**
 * The live gRPC server's lifecycle: one server (http2/Server.ts, gRPC over node:http2) with Agent (AgentService.ts; Generate per call in
 * GenerateCall.ts), grpc.health.v1 (Health.ts, status from ServingState.ts) and server reflection
 * (Reflection.ts); the stall watchdog (StallWatchdog.ts) over the active calls (ActiveCalls.ts). Binds on
 * [agent].listen_grpc; when the scope closes it publishes NOT_SERVING, ends Watch streams and gives running
 * calls `shutdownGraceMs` before cancelling them (connections with none close at once), logging what it cut.
 */
import { Duration, Effect, Layer, Option, Schema } from "effect"
import type { NodeHealth } from "../../gen/cgn/agent/v1/agent.ts"
import { Config } from "../../services/config/Config.ts"
import type { EngineClient } from "../../services/engine/EngineClient.ts"
import type { EngineProcess } from "../../services/engine/EngineProcess.ts"
import { requestContext, ServedContext } from "../../services/engine/ServedContext.ts"
import { StreamAborted } from "../../services/grpc/CallErrors.ts"
import { AGENT_SERVICE, GrpcServer, type GrpcServerService } from "../../services/grpc/GrpcServer.ts"
import { keepaliveTimes } from "../../services/grpc/Keepalive.ts"
import { joinHostPort, splitHostPort, unbracket } from "../../services/net/HostPort.ts"
import { NodeStatus } from "../../services/node/NodeStatus.ts"
import { Metrics } from "../../services/observability/Metrics.ts"
import type { TlsSource } from "../../services/tls/Tls.ts"
import { ActiveCalls } from "./ActiveCalls.ts"
import { addAgent, GENERATE_PATH } from "./AgentService.ts"
import * as GenerateCall from "./GenerateCall.ts"
import { guardReport } from "./guardReport.ts"
import { addHealth, HEALTH_SERVICE } from "./Health.ts"
import { concurrentStreams } from "./http2/Connections.ts"
import { Http2GrpcServer, type Http2GrpcServerOptions } from "./http2/Server.ts"
import { addReflection } from "./Reflection.ts"
import { rejectionReport } from "./rejectionReport.ts"
import * as ServingState from "./ServingState.ts"
import * as StallWatchdog from "./StallWatchdog.ts"

/** The server could not listen (address in use, bad address). */
export class GrpcListenError extends Schema.TaggedError<GrpcListenError>()("GrpcListenError", {
  address: Schema.String,
  message: Schema.String
}) {}

export interface GrpcServerOptions {
  /** Overrides [agent].listen_grpc (tests pass "127.0.0.1:0"). */
  readonly address?: string
  /** mTLS (the Tls service's `serverTls`); plaintext when absent. */
  readonly tls?: TlsSource | undefined
  /** Pending text per stream before the engine read pauses (default 64 Ki chars). */
  readonly maxPendingChars?: number
  /** How long shutdown waits for running calls before cancelling them (default CLOSE_GRACE). */
  readonly shutdownGraceMs?: number
  /**
   * The last NodeHealth written to etcd (HealthReporter.lastRecord), read at each GetNodeHealth for its freshness:
   * the router that compares the answer with the node's etcd record sees the same epoch and sequence. Absent or
   * undefined (standalone, before the first write): freshness stays empty.
   */
  readonly lastWritten?: Effect.Effect<NodeHealth | undefined>
}

/** How long the server's close waits for calls still open (a router that stopped reading) before it cuts them. */
export const CLOSE_GRACE = Duration.seconds(5)

/** Cuts what `server`'s close left open after `graceMs`, and says what (README: each step cut short is logged). */
const cut = (server: Http2GrpcServer, graceMs: number): Effect.Effect<void> =>
  Effect.suspend(() => {
    const { sessions, calls } = server.open
    server.destroy()
    return Effect.logWarning("gRPC close: connections still open after the grace; cut", {
      grace_ms: graceMs,
      sessions,
      calls
    })
  })

/**
 * Listens on `address` (`host:port`, IPv6 hosts in brackets), the value of config `key`; succeeds with the bound
 * port (the real one for 0). A failure names the key, the address and the system's reason.
 */
export const bind = (server: Http2GrpcServer, address: string, key: string): Effect.Effect<number, GrpcListenError> => {
  const { host, port } = splitHostPort(address)
  return Effect.tryPromise({
    try: () => server.listen(unbracket(host), Number(port)),
    catch: (e) => new GrpcListenError({ address, message: `${key} = "${address}": ${(e as Error).message}` })
  })
}

/**
 * Where a server's listener and connection errors go (`what` names the server in the log): a listener error
 * at error level; a connection's at debug, so a misbehaving client cannot flood the log at the default level.
 */
export const errorLogging = (
  run: (effect: Effect.Effect<void>) => unknown,
  what: string
): Pick<Http2GrpcServerOptions, "onError" | "onConnectionError"> => ({
  onError: (e) => run(Effect.logError(`${what} listener error; still serving`, { error: e.message })),
  onConnectionError: (e) => run(Effect.logDebug(`${what} connection closed on an error`, { error: e.message }))
})

/** Builds and starts the server; it stops when the scope closes. */
export const make = Effect.fnUntraced(function* (options: GrpcServerOptions = {}) {
  const config = yield* Config
  const nodeStatus = yield* NodeStatus
  const run = Effect.runCallbackWith(yield* Effect.context<never>())
  const metrics = Option.getOrUndefined(yield* Effect.serviceOption(Metrics))
  // absent (tests that build the server alone): the configured context is all ListModels and Generate know
  const served = Option.getOrUndefined(yield* Effect.serviceOption(ServedContext))
  const serving = yield* ServingState.make
  const active = new ActiveCalls()
  yield* StallWatchdog.fork(active)
  const generate = yield* GenerateCall.makeHandler(serving, active, options.maxPendingChars ?? 64 * 1024, served)

  const address = options.address ?? config.agent.listen_grpc
  // said at warn, rate-limited: no handler ran to say why (rejectionReport.ts)
  const reportRejection = rejectionReport(run)
  const server = new Http2GrpcServer({
    // Leave room above max_request_bytes so the agent's own check answers with a precise message.
    maxReceiveMessageLength: config.agent.max_request_bytes + 1024 * 1024,
    // Requests still arriving: room for 16 of the largest at once (80 MiB at the 4 MiB default) before
    // more are refused RESOURCE_EXHAUSTED; calls under way hold nothing of it.
    maxArrivingBytes: 16 * (config.agent.max_request_bytes + 1024 * 1024),
    // ... and a time bound on each: a request (at most max_request_bytes) that has not arrived by then ends.
    requestReadTimeoutMs: Duration.toMillis(config.agent.request_read_timeout),
    // Streams admission does not count yet (requests still arriving) are bounded per connection, with room for
    // every call admission would hold, twice over.
    maxConcurrentStreams: concurrentStreams(config.agent.max_inflight, config.agent.max_queue),
    // Connections past these are closed at accept; floods and node:http2's own closures are closed, counted, logged.
    maxConnectionsPerPeer: config.agent.max_connections_per_peer,
    maxConnections: config.agent.max_connections,
    keepalive: keepaliveTimes(config.agent),
    onGuard: guardReport(run, metrics),
    tls: options.tls,
    ...errorLogging(run, "gRPC"),
    // Generate calls the transport ended before the handler (a bad message or grpc-timeout, a deadline or cancel
    // while the request arrived) count in requests_total like the handler's own, and are bound to their pair by the
    // handler's rule (on an SGLang prefill node, as its refusals are).
    onRejected: (path, f) => {
      reportRejection(path, f)
      return path === GENERATE_PATH ? generate.rejected(f) : f
    }
  })
  const model = { name: config.model.served_name, source: config.model.source.value, tp: config.model.tp }
  addAgent(server, {
    generate: generate.handle,
    models: {
      // Read at each ListModels (a getter: the handler sends this object as it is): the context Generate checks
      // max_tokens against, the engine's own per-request limit once it has said (llama-server: -c over its slots).
      get models() {
        const context = requestContext(config.model.max_model_len, served?.current())
        return [{ ...model, maxModelLen: context?.tokens ?? 0 }]
      }
    },
    nodeHealth:
      options.lastWritten === undefined
        ? nodeStatus.snapshot
        : Effect.zipWith(nodeStatus.snapshot, options.lastWritten, (now, written) =>
            written?.freshness === undefined ? now : { ...now, freshness: written.freshness }
          ),
    run: (effect, onExit) => run(effect, { onExit })
  })
  // Watch streams never end by themselves; shutdown ends them so the server can close.
  const endWatches = addHealth(server, serving.health.implementation)
  addReflection(server, [AGENT_SERVICE, HEALTH_SERVICE])

  const grace = options.shutdownGraceMs ?? Duration.toMillis(CLOSE_GRACE)
  const port = yield* Effect.acquireRelease(bind(server, address, "agent.listen_grpc"), () =>
    Effect.sync(() => {
      serving.setOverride("NOT_SERVING")
      endWatches()
    }).pipe(
      Effect.andThen(Effect.promise(() => server.close())),
      Effect.timeoutOrElse({ duration: Duration.millis(grace), orElse: () => cut(server, grace) })
    )
  )
  if (metrics !== undefined)
    yield* metrics.onCollect(Effect.sync(() => metrics.grpcConnections.set(server.connections)))
  const bound = joinHostPort(splitHostPort(address).host, port)
  yield* Effect.logInfo("gRPC listening").pipe(Effect.annotateLogs({ address: bound }))

  return GrpcServer.of({
    address: bound,
    healthState: serving.health.implementation,
    setHealthOverride: (s) => Effect.sync(() => serving.setOverride(s)),
    activeStreams: Effect.sync(() => active.size),
    awaitNoStreams: active.awaitEmpty,
    lastHandoffAt: Effect.sync(() => (active.lastHandoffAt > 0 ? active.lastHandoffAt : undefined)),
    abortActive: (reason) => Effect.sync(() => active.abortAll(new StreamAborted({ reason })))
  } satisfies GrpcServerService)
})

/** The server on [agent].listen_grpc. */
export const layer: Layer.Layer<GrpcServer, GrpcListenError, Config | EngineProcess | NodeStatus | EngineClient> =
  Layer.effect(GrpcServer, make())

/** The server with explicit options (tests: `{ address: "127.0.0.1:0" }`). */
export const layerWith = (
  options: GrpcServerOptions
): Layer.Layer<GrpcServer, GrpcListenError, Config | EngineProcess | NodeStatus | EngineClient> =>
  Layer.effect(GrpcServer, make(options))
