/**
 * The live gRPC server: Agent, grpc.health.v1.Health (Check, Watch) and server reflection on one grpc-js
 * Server. Agent.Generate is a raw grpc-js server-streaming handler: a call forks one fiber running
 * EngineClient.streamTo with the Relay as its sink (EngineClient.stream for clients without streamTo), and
 * the Relay's consumer writes each read's text to the call at once (coalescing only while the call is not
 * writable). The other methods are nice-grpc implementations, attached with nice-grpc's own handlers.
 * Cancel or deadline ('cancelled') interrupts the fiber, which aborts the engine request. See docs/bench.md "Relay".
 * P/D roles (Handoff.planLeg): a prefill leg is one non-streaming engine call whose handoff parameters go in
 * the final message; a decode leg streams like a normal call. Each leg has [agent].handoff_timeout.
 */
import { randomUUID } from "node:crypto"
import * as grpc from "@grpc/grpc-js"
import { Clock, Duration, Effect, Layer, Option, Result, Schedule, Schema, Stream, Tracer } from "effect"
import { Status } from "nice-grpc"
import { Config } from "../../services/config/Config.ts"
import { EngineClient, type RequestOptions } from "../../services/engine/EngineClient.ts"
import { EngineProcess } from "../../services/engine/EngineProcess.ts"
import { EngineStall } from "../../services/engine/EngineStall.ts"
import { Admission, admissionStatus, Draining, Overloaded } from "../../services/grpc/Admission.ts"
import { type EnginePlan, GenerateRejected, planRequest } from "../../services/grpc/Generate.ts"
import {
  AGENT_SERVICE,
  GrpcServer,
  type GrpcServerService,
  type ServingStatus
} from "../../services/grpc/GrpcServer.ts"
import { type GrpcFailure, statusName, toGrpcFailure } from "../../services/grpc/GrpcStatus.ts"
import {
  extractKvTransferParams,
  handoffStatus,
  InvalidHandoff,
  type LegPlan,
  planLeg
} from "../../services/grpc/Handoff.ts"
import { NodeStatus } from "../../services/node/NodeStatus.ts"
import { Metrics } from "../../services/observability/Metrics.ts"
import {
  formatTraceparent,
  parseTraceparent,
  type TraceParent,
  TracesExported
} from "../../services/observability/TraceContext.ts"
import { joinHostPort, splitHostPort } from "../../services/registry/Advertise.ts"
import { addAgent, type GenerateCall } from "./AgentService.ts"
import { addHealth, HEALTH_SERVICE, PublishedHealth } from "./Health.ts"
import { addReflection } from "./Reflection.ts"
import { Relay } from "./Relay.ts"

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

/** grpc-js ServerCredentials. */
export type ServerCredentials = grpc.ServerCredentials

/**
 * One span per Generate call, a child of the caller's `traceparent` when it sent one; the engine request
 * carries this span as its parent, so the engine's own spans nest under the agent's.
 */
const traced = <A, E>(
  incoming: TraceParent | undefined,
  call: { readonly requestId: string; readonly leg: string },
  f: (traceparent: string) => Effect.Effect<A, E>
): Effect.Effect<A, E> =>
  Effect.flatMap(Effect.orDie(Effect.currentSpan), (span) =>
    f(formatTraceparent({ traceId: span.traceId, spanId: span.spanId, sampled: span.sampled }))
  ).pipe(
    Effect.withSpan("cgn.agent.Generate", {
      kind: "server",
      attributes: { "cgn.request_id": call.requestId, "cgn.leg": call.leg },
      ...(incoming === undefined ? {} : { parent: Tracer.externalSpan(incoming) })
    })
  )

/** toGrpcFailure plus the agent's own refusals that live outside Generate (admission, handoff). */
const failureOf = (e: unknown): GrpcFailure => {
  if (e instanceof Overloaded || e instanceof Draining)
    return { code: admissionStatus(e), message: e.message, trailers: { "cgn-error-source": "agent" } }
  if (e instanceof InvalidHandoff)
    return { code: handoffStatus, message: e.message, trailers: { "cgn-error-source": "agent" } }
  return toGrpcFailure(e)
}

/** The status grpc-js sends when a handler emits it as 'error': code, message and the `cgn-*` trailers. */
const statusOf = (f: GrpcFailure): Partial<grpc.StatusObject> => {
  const metadata = new grpc.Metadata()
  for (const k in f.trailers) metadata.set(k, f.trailers[k]!)
  return { code: f.code, details: f.message, metadata }
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
  // Spans only when traces are exported: otherwise the caller's traceparent goes to the engine unchanged.
  const tracing = yield* TracesExported
  const legTimeout = config.agent.handoff_timeout
  // One model per agent: bind the label once, not per call.
  const relayed = metrics?.relayedTokens.labels({ model })
  const legDeadline = (leg: string): GenerateRejected =>
    new GenerateRejected({
      code: "DEADLINE_EXCEEDED",
      message: `the ${leg} leg did not ${leg === "prefill" ? "finish" : "start"} within ${Duration.format(legTimeout)} ([agent].handoff_timeout); the engine request was aborted`
    })

  // Health: derived from the engine state and the drain, unless overridden.
  const health = new PublishedHealth()
  let engineTag: string = (yield* engine.state)._tag
  let draining = yield* nodeStatus.draining
  let override: ServingStatus | undefined
  const current = (): ServingStatus => override ?? (engineTag === "Ready" && !draining ? "SERVING" : "NOT_SERVING")
  const publish = (): void => health.publish(current())
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
  // Resolved when the last active stream ends (the drain waits on it).
  const idleWaiters = new Set<() => void>()

  // Stall watchdog: one coarse interval for all streams instead of a timer per read. A stream whose read
  // count has not moved for engine.stream_idle_timeout, while the caller is not the one holding it back
  // (a paused producer), ends with UNAVAILABLE; the abort interrupts its fiber, which aborts the engine request.
  const idleMs = Duration.toMillis(config.engine.stream_idle_timeout)
  const stalls = metrics?.engineStreamStalls.labels({ model })
  const stalledError = new GenerateRejected({
    code: "UNAVAILABLE",
    message: `the engine sent nothing for ${Duration.format(config.engine.stream_idle_timeout)} (engine.stream_idle_timeout); the engine request was aborted, retry on another node`
  })
  // The tick's verdict also goes to EngineStall (when present), which tells health that the engine is wedged.
  const stall = Option.getOrUndefined(yield* Effect.serviceOption(EngineStall))
  let endedWithProgress = 0
  const watch = Effect.flatMap(Clock.currentTimeMillis, (now) => {
    let stalled = 0
    let progressed = endedWithProgress > 0
    endedWithProgress = 0
    for (const relay of active) {
      if (!relay.streaming || relay.done) continue
      if (relay.reads !== relay.seenReads || relay.paused) {
        progressed ||= relay.reads !== relay.seenReads
        relay.seenReads = relay.reads
        relay.idleSince = now
      } else if (now - relay.idleSince >= idleMs) {
        relay.streaming = false // once: the abort ends it
        stalls?.inc()
        stalled++
        relay.abort(stalledError)
      }
    }
    if (stall === undefined) return Effect.void
    // stalls first: progress in the same tick means the engine is not wedged
    return Effect.andThen(
      stalled > 0 ? Effect.replicateEffect(stall.stalled(now), stalled, { discard: true }) : Effect.void,
      progressed ? stall.progressed(now) : Effect.void
    )
  })
  yield* watch.pipe(
    Effect.repeat(Schedule.spaced(Duration.millis(Math.min(1000, Math.max(25, idleMs / 8))))),
    Effect.forkScoped
  )

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
    // From here on the engine is asked for a stream: the stall watchdog counts idle time from now.
    const engineStream = Effect.flatMap(Clock.currentTimeMillis, (now) => {
      relay.idleSince = now
      relay.seenReads = relay.reads
      relay.streaming = true
      return streamAll
    })
    // A decode leg waits for the KV transfer before its first chunk: that wait is what the deadline bounds.
    const decodeDeadline = Effect.sleep(legTimeout).pipe(
      Effect.andThen(Effect.suspend(() => (relay.started ? Effect.never : Effect.fail(legDeadline("decode")))))
    )
    const relayAll: Effect.Effect<void, unknown> =
      leg._tag === "VllmPrefill" || (leg._tag === "SglangLeg" && leg.leg === "prefill")
        ? prefillLeg(relay, plan, leg, opts)
        : leg._tag === "Normal"
          ? engineStream
          : Effect.raceFirst(engineStream, decodeDeadline)
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
    metrics.requests.inc({ role, model, grpc_code: status })
    metrics.requestDuration.observe({ role, model }, (performance.now() - startedAt) / 1000)
    if (relay !== undefined && relay.firstTextAt > 0)
      metrics.timeToFirstToken.observe({ role, model }, (relay.firstTextAt - startedAt) / 1000)
  }

  const refuse = (call: GenerateCall, startedAt: number, f: GrpcFailure): void => {
    record(statusName(f.code), undefined, startedAt)
    call.emit("error", statusOf(f))
  }

  const generate = (call: GenerateCall): void => {
    const startedAt = performance.now()
    const req = call.request
    const plan = planRequest(req, config)
    if (plan instanceof GenerateRejected) {
      refuse(call, startedAt, toGrpcFailure(plan))
      return
    }
    const leg = planLeg({
      role,
      engine: config.engine.kind,
      body: plan.body,
      kvTransferParams: req.kvTransferParams,
      bootstrap: req.bootstrap
    })
    if (Result.isFailure(leg)) {
      refuse(call, startedAt, failureOf(leg.failure))
      return
    }
    if (draining || engineTag !== "Ready") {
      const why = draining ? "node is draining" : `engine is not ready (${engineTag.toLowerCase()})`
      refuse(call, startedAt, {
        code: Status.UNAVAILABLE,
        message: `${why}; retry on another node`,
        trailers: { "cgn-error-source": "agent" }
      })
      return
    }
    const requestId = req.requestId === "" ? randomUUID() : req.requestId
    const opts: { requestId: string; traceparent?: string } = { requestId }
    const incoming = parseTraceparent(call.metadata.get("traceparent")[0])
    if (incoming !== undefined) opts.traceparent = formatTraceparent(incoming)
    const relay = new Relay(maxPending)
    active.add(relay)
    let ended = false
    let blocked = false
    const settle = (status: string): void => {
      ended = true
      call.off("drain", onDrain)
      if (!relay.done) relay.interrupt()
      active.delete(relay)
      // reads since the watchdog's last look: progress it would otherwise miss (a short call between two ticks)
      if (relay.reads !== relay.seenReads) endedWithProgress++
      if (active.size === 0) for (const wake of idleWaiters) wake()
      record(status, relay, startedAt)
    }
    // Runs inside the producer's read callback: everything pending goes out now unless the call's buffer is full.
    const pump = (): void => {
      if (ended || blocked) return
      for (let d = relay.take(); d !== undefined; d = relay.take()) {
        relayed?.inc(d.tokens)
        if (!call.write({ delta: { text: d.text, index: 0, tokens: d.tokens } })) {
          blocked = true
          call.once("drain", onDrain)
          return
        }
      }
      if (!relay.done) return
      if (relay.failure !== undefined) {
        const f = failureOf(relay.failure)
        settle(statusName(f.code))
        call.emit("error", statusOf(f))
        return
      }
      const now = performance.now()
      const final = relay.reader.final({
        ttftMs: (relay.firstTextAt > 0 ? relay.firstTextAt : now) - startedAt,
        totalMs: now - startedAt,
        queueMs: relay.queueMs,
        nodeId,
        requestId
      })
      settle("OK")
      call.write({ final })
      call.end()
    }
    const onDrain = (): void => {
      blocked = false
      pump()
    }
    // Client cancel, deadline, or the connection gone (grpc-js also emits it after a normal end: ignored then).
    call.on("cancelled", () => {
      if (!ended) settle("CANCELLED")
    })
    relay.consumer = pump
    const work = tracing
      ? traced(incoming, { requestId, leg: leg.success._tag }, (tp) =>
          produce(relay, plan, leg.success, { ...opts, traceparent: tp })
        )
      : produce(relay, plan, leg.success, opts)
    relay.interrupt = run(work, { onExit: (exit) => relay.finish(exit) })
    if (call.cancelled && !ended) settle("CANCELLED")
  }

  const address = options.address ?? config.agent.listen_grpc
  const server = new grpc.Server({
    // Leave room above max_request_bytes so the agent's own check answers with a precise message.
    "grpc.max_receive_message_length": config.agent.max_request_bytes + 1024 * 1024
  })
  addAgent(server, {
    generate,
    models: {
      models: [
        {
          name: model,
          source: config.model.source.value,
          tp: config.model.tp,
          maxModelLen: config.model.max_model_len ?? 0
        }
      ]
    },
    nodeHealth: nodeStatus.snapshot,
    run: (effect, onExit) => run(effect, { onExit })
  })
  // Watch streams never end by themselves; shutdown ends them so the server can close.
  const endWatches = addHealth(server, health.implementation)
  addReflection(server, [AGENT_SERVICE, HEALTH_SERVICE])

  const grace = options.shutdownGraceMs ?? 5_000
  const port = yield* Effect.acquireRelease(
    Effect.tryPromise({
      try: () =>
        new Promise<number>((resolve, reject) =>
          server.bindAsync(address, options.credentials ?? grpc.ServerCredentials.createInsecure(), (err, port) =>
            err === null ? resolve(port) : reject(err)
          )
        ),
      catch: (e) => new GrpcListenError({ address, message: e instanceof Error ? e.message : String(e) })
    }),
    () =>
      Effect.promise(async () => {
        override = "NOT_SERVING"
        publish()
        endWatches()
        let timer: NodeJS.Timeout | undefined
        const graceful = new Promise<boolean>((resolve) => server.tryShutdown(() => resolve(true)))
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
    healthState: health.implementation,
    setHealthOverride: (s) =>
      Effect.sync(() => {
        override = s
        publish()
      }),
    activeStreams: Effect.sync(() => active.size),
    awaitNoStreams: Effect.callback<void>((resume) => {
      if (active.size === 0) return resume(Effect.void)
      const wake = () => {
        idleWaiters.delete(wake)
        resume(Effect.void)
      }
      idleWaiters.add(wake)
      return Effect.sync(() => idleWaiters.delete(wake))
    }),
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
