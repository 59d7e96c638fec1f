/**
 * The live gRPC server (nice-grpc): Agent, grpc.health.v1.Health (Check, Watch) and server reflection.
 * Handlers are plain async code bridged into Effect with the layer's captured context: a Generate call
 * forks one fiber running EngineClient.streamTo with the Relay as its sink (EngineClient.stream for clients
 * without streamTo); the call's generator drains the Relay.
 * Cancel or deadline aborts the call's signal, which interrupts the fiber, which aborts the engine request.
 * The per-token path is a plain loop (no Effect step per token): see docs/bench.md "Relay".
 * P/D roles (Handoff.planLeg): a prefill leg is one non-streaming engine call whose handoff parameters go in
 * the final message; a decode leg streams like a normal call. Each leg has [agent].handoff_timeout.
 */
import { randomUUID } from "node:crypto"
import { Duration, Effect, Layer, Option, Result, Schema, Stream } from "effect"
import { type CallContext, createServer, type Server, ServerError, Status } from "nice-grpc"
import { HealthDefinition, HealthServiceImpl, HealthState } from "nice-grpc-server-health"
import { ServerReflection, ServerReflectionService } from "nice-grpc-server-reflection"
import {
  AgentDefinition,
  type AgentServiceImplementation,
  type GenerateRequest,
  type GenerateResponse
} from "../gen/cgn/agent/v1/agent.ts"
import { fileDescriptorSet } from "../gen/descriptor.ts"
import { Admission, admissionStatus, Draining, Overloaded } from "../services/Admission.ts"
import { joinHostPort, splitHostPort } from "../services/Advertise.ts"
import { Config } from "../services/Config.ts"
import { EngineClient, type RequestOptions } from "../services/EngineClient.ts"
import { EngineProcess } from "../services/EngineProcess.ts"
import { type EnginePlan, GenerateRejected, planRequest } from "../services/Generate.ts"
import { AGENT_SERVICE, GrpcServer, type GrpcServerService, type ServingStatus } from "../services/GrpcServer.ts"
import { type GrpcFailure, statusName, toGrpcFailure } from "../services/GrpcStatus.ts"
import { extractKvTransferParams, handoffStatus, InvalidHandoff, type LegPlan, planLeg } from "../services/Handoff.ts"
import { Metrics } from "../services/Metrics.ts"
import { NodeStatus } from "../services/NodeStatus.ts"
import { Relay } from "./GrpcRelay.ts"

/** The server could not listen (address in use, bad address). */
export class GrpcListenError extends Schema.TaggedError<GrpcListenError>()("GrpcListenError", {
  address: Schema.String,
  message: Schema.String
}) {}

export interface GrpcServerOptions {
  /** Overrides [agent].listen_grpc (tests pass "127.0.0.1:0"). */
  readonly address?: string
  /** TLS; plaintext when absent. */
  readonly credentials?: ServerCredentials
  /** Pending text per stream before the engine read pauses (default 64 Ki chars). */
  readonly maxPendingChars?: number
  /** How long shutdown waits for running calls before cancelling them (default 5 s). */
  readonly shutdownGraceMs?: number
}

/** grpc-js ServerCredentials (not re-exported by nice-grpc). */
export type ServerCredentials = NonNullable<Parameters<Server["listen"]>[1]>

const TRACEPARENT = /^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/

/** toGrpcFailure plus the agent's own refusals that live outside Generate (admission, handoff). */
const failureOf = (e: unknown): GrpcFailure => {
  if (e instanceof Overloaded || e instanceof Draining)
    return { code: admissionStatus(e), message: e.message, trailers: { "cgn-error-source": "agent" } }
  if (e instanceof InvalidHandoff)
    return { code: handoffStatus, message: e.message, trailers: { "cgn-error-source": "agent" } }
  return toGrpcFailure(e)
}

const toServerError = (ctx: CallContext, f: GrpcFailure): ServerError => {
  for (const k in f.trailers) ctx.trailer.set(k, f.trailers[k]!)
  return new ServerError(f.code, f.message)
}

/** Builds and starts the server; it stops when the scope closes. */
export const make = Effect.fnUntraced(function* (options: GrpcServerOptions = {}) {
  const config = yield* Config
  const engine = yield* EngineProcess
  const nodeStatus = yield* NodeStatus
  const client = yield* EngineClient
  const admission = Option.getOrUndefined(yield* Effect.serviceOption(Admission))
  const metrics = Option.getOrUndefined(yield* Effect.serviceOption(Metrics))
  const context = yield* Effect.context<never>()
  const run = Effect.runCallbackWith(context)
  const maxPending = options.maxPendingChars ?? 64 * 1024
  const model = config.model.served_name
  const role = config.agent.role
  const nodeId = config.agent.node_id
  const legTimeout = config.agent.handoff_timeout
  // One model per agent: bind the label once, not per call.
  const relayed = metrics?.relayedTokens.labels({ model })
  const legDeadline = (leg: string): GenerateRejected =>
    new GenerateRejected({
      code: "DEADLINE_EXCEEDED",
      message: `the ${leg} leg did not ${leg === "prefill" ? "finish" : "start"} within ${Duration.format(legTimeout)} ([agent].handoff_timeout); the engine request was aborted`
    })

  // Health: derived from the engine state and the drain, unless overridden.
  const healthState = HealthState()
  healthState.setMaxListeners(0)
  let engineTag: string = (yield* engine.state)._tag
  let draining = yield* nodeStatus.draining
  let override: ServingStatus | undefined
  const current = (): ServingStatus => override ?? (engineTag === "Ready" && !draining ? "SERVING" : "NOT_SERVING")
  const publish = (): void => {
    const s = current() === "SERVING" ? "healthy" : "unhealthy"
    healthState.setStatus(s)
    healthState.setStatus(s, AGENT_SERVICE)
  }
  publish()
  yield* Stream.runForEach(engine.changes, (s) =>
    Effect.sync(() => {
      engineTag = s._tag
      publish()
    })
  ).pipe(Effect.forkScoped)
  yield* Stream.runForEach(nodeStatus.changes, (state) =>
    Effect.map(nodeStatus.draining, (d) => {
      draining = d || state === "draining"
      publish()
    })
  ).pipe(Effect.forkScoped)

  const active = new Set<Relay>()

  // One non-streaming call; its answer is read for finish/usage only (the text comes from the decode leg).
  const prefillLeg = (relay: Relay, plan: EnginePlan, leg: LegPlan, opts: RequestOptions) =>
    client.complete(plan.path, leg.body, opts).pipe(
      Effect.timeoutOrElse({ duration: legTimeout, orElse: () => Effect.fail(legDeadline("prefill")) }),
      Effect.flatMap((response) => {
        relay.reader.read(response)
        relay.reader.kvTransferParams = undefined
        if (leg._tag !== "VllmPrefill") return Effect.void
        return Effect.map(Effect.fromResult(extractKvTransferParams(response)), (params) => {
          relay.reader.kvTransferParams = params as Record<string, unknown>
        })
      })
    )

  const produce = (
    relay: Relay,
    plan: EnginePlan,
    leg: LegPlan,
    opts: RequestOptions
  ): Effect.Effect<void, unknown> => {
    // streamTo: the engine's reads go straight into the relay, no Effect step per read.
    const streamAll =
      client.streamTo !== undefined
        ? client.streamTo(plan.path, leg.body, opts, relay)
        : Stream.runForEachArray(client.stream(plan.path, leg.body, opts), (chunks) =>
            relay.onChunks(chunks) ? Effect.void : relay.waitRoom
          )
    // A decode leg waits for the KV transfer before its first chunk: that wait is what the deadline bounds.
    const decodeDeadline = Effect.sleep(legTimeout).pipe(
      Effect.andThen(Effect.suspend(() => (relay.started ? Effect.never : Effect.fail(legDeadline("decode")))))
    )
    const relayAll: Effect.Effect<void, unknown> =
      leg._tag === "VllmPrefill" || (leg._tag === "SglangLeg" && leg.leg === "prefill")
        ? prefillLeg(relay, plan, leg, opts)
        : leg._tag === "Normal"
          ? streamAll
          : Effect.raceFirst(streamAll, decodeDeadline)
    if (admission === undefined) return relayAll
    return Effect.scoped(
      Effect.flatMap(admission.acquire, (permit) => {
        relay.queueMs = permit.queuedMs
        return relayAll
      })
    )
  }

  const record = (status: string, relay: Relay | undefined, startedAt: number): void => {
    if (metrics === undefined) return
    metrics.requests.inc({ role, model, status })
    metrics.requestDuration.observe({ role, model }, (performance.now() - startedAt) / 1000)
    if (relay !== undefined && relay.firstTextAt > 0)
      metrics.timeToFirstToken.observe({ role, model }, (relay.firstTextAt - startedAt) / 1000)
  }

  const refuse = (ctx: CallContext, startedAt: number, f: GrpcFailure): ServerError => {
    record(statusName(f.code), undefined, startedAt)
    return toServerError(ctx, f)
  }

  async function* generate(req: GenerateRequest, ctx: CallContext): AsyncGenerator<GenerateResponse> {
    const startedAt = performance.now()
    const plan = planRequest(req, config)
    if (plan instanceof GenerateRejected) throw refuse(ctx, startedAt, toGrpcFailure(plan))
    const leg = planLeg({
      role,
      engine: config.engine.kind,
      body: plan.body,
      kvTransferParams: req.kvTransferParams,
      bootstrap: req.bootstrap
    })
    if (Result.isFailure(leg)) throw refuse(ctx, startedAt, failureOf(leg.failure))
    if (draining || engineTag !== "Ready") {
      const why = draining ? "node is draining" : `engine is not ready (${engineTag.toLowerCase()})`
      throw refuse(ctx, startedAt, {
        code: Status.UNAVAILABLE,
        message: `${why}; retry on another node`,
        trailers: { "cgn-error-source": "agent" }
      })
    }
    const requestId = req.requestId === "" ? randomUUID() : req.requestId
    const opts: { requestId: string; traceparent?: string } = { requestId }
    const tp = ctx.metadata.get("traceparent")
    if (typeof tp === "string" && TRACEPARENT.test(tp)) opts.traceparent = tp
    const relay = new Relay(maxPending)
    active.add(relay)
    relay.interrupt = run(produce(relay, plan, leg.success, opts), { onExit: (exit) => relay.finish(exit) })
    const onAbort = (): void => {
      relay.interrupt()
      relay.wake()
    }
    ctx.signal.addEventListener("abort", onAbort)
    let status = "CANCELLED"
    try {
      while (true) {
        const d = relay.take()
        if (d !== undefined) {
          relayed?.inc(d.tokens)
          yield { delta: { text: d.text, index: 0, tokens: d.tokens } }
          continue
        }
        if (relay.done || ctx.signal.aborted) break
        await relay.wait()
      }
      if (ctx.signal.aborted) return
      if (relay.failure !== undefined) {
        const f = failureOf(relay.failure)
        status = statusName(f.code)
        throw toServerError(ctx, f)
      }
      const now = performance.now()
      const final = relay.reader.final({
        ttftMs: (relay.firstTextAt > 0 ? relay.firstTextAt : now) - startedAt,
        totalMs: now - startedAt,
        queueMs: relay.queueMs,
        nodeId,
        requestId
      })
      status = "OK"
      yield { final }
    } finally {
      ctx.signal.removeEventListener("abort", onAbort)
      if (!relay.done) relay.interrupt()
      active.delete(relay)
      record(status, relay, startedAt)
    }
  }

  const agentImpl: AgentServiceImplementation = {
    generate,
    listModels: async () => ({
      models: [
        {
          name: model,
          source: config.model.source.value,
          tp: config.model.tp,
          maxModelLen: config.model.max_model_len ?? 0
        }
      ]
    }),
    getNodeHealth: (_req, ctx) => Effect.runPromiseWith(context)(nodeStatus.snapshot, { signal: ctx.signal })
  }

  // Watch streams never end by themselves; shutdown ends them so the server can close.
  const terminate = new AbortController()
  const baseHealth = HealthServiceImpl(healthState)
  const healthImpl: typeof baseHealth = {
    check: baseHealth.check,
    async *watch(req, ctx) {
      try {
        yield* baseHealth.watch(req, { ...ctx, signal: AbortSignal.any([ctx.signal, terminate.signal]) })
      } catch (e) {
        if (terminate.signal.aborted && !ctx.signal.aborted)
          throw new ServerError(Status.UNAVAILABLE, "server shutting down")
        throw e
      }
    }
  }

  const address = options.address ?? config.agent.listen_grpc
  const server = createServer({
    // Leave room above max_request_bytes so the agent's own check answers with a precise message.
    "grpc.max_receive_message_length": config.agent.max_request_bytes + 1024 * 1024
  })
  server.add(AgentDefinition, agentImpl)
  server.add(HealthDefinition, healthImpl)
  server.add(ServerReflectionService, ServerReflection(fileDescriptorSet, [AGENT_SERVICE, HealthDefinition.fullName]))

  const grace = options.shutdownGraceMs ?? 5_000
  const port = yield* Effect.acquireRelease(
    Effect.tryPromise({
      try: () => server.listen(address, options.credentials),
      catch: (e) => new GrpcListenError({ address, message: e instanceof Error ? e.message : String(e) })
    }),
    () =>
      Effect.promise(async () => {
        override = "NOT_SERVING"
        publish()
        terminate.abort()
        let timer: NodeJS.Timeout | undefined
        const graceful = server.shutdown().then(() => true)
        const late = new Promise<boolean>((resolve) => {
          timer = setTimeout(() => resolve(false), grace)
        })
        if (!(await Promise.race([graceful, late]))) server.forceShutdown()
        clearTimeout(timer)
      })
  )
  const bound = joinHostPort(splitHostPort(address).host, port)
  yield* Effect.logInfo("gRPC listening").pipe(Effect.annotateLogs({ address: bound }))

  return GrpcServer.of({
    address: bound,
    port,
    health: Effect.sync(current),
    setHealthOverride: (s) =>
      Effect.sync(() => {
        override = s
        publish()
      }),
    activeStreams: Effect.sync(() => active.size),
    abortActive: (reason) =>
      Effect.sync(() => {
        for (const relay of active) relay.abort(new GenerateRejected({ code: "UNAVAILABLE", message: reason }))
      })
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
