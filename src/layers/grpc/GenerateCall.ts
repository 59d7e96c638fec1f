/**
 * Agent.Generate, one call: checks and plans the request, then forks the engine side (EngineLegs) into a
 * Relay whose consumer is this call's writer: each engine read is written to the call inside the read's own
 * callback (coalesced only while the call is not writable), and the end writes the final message or the
 * status. Cancel or deadline ('cancelled') interrupts the engine fiber, which aborts the engine request. An engine
 * request that broke off because the engine run ended under it (a restart, an exit) ends with why (EngineCut.ts); a
 * run the agent ends itself (a restart, its stop) cuts its calls at once, with why (EngineCut.ts cutOnRunEnd).
 * See docs/bench.md "Relay".
 */
import { hash, randomUUID } from "node:crypto"
import { Effect, Exit, Option, Result, Tracer } from "effect"
import { GenerateResponse } from "../../gen/cgn/agent/v1/agent.ts"
import { Config } from "../../services/config/Config.ts"
import { EngineError } from "../../services/engine/EngineClient.ts"
import type { ServedContextService } from "../../services/engine/ServedContext.ts"
import { frameDelta } from "../../services/grpc/DeltaFrame.ts"
import { GenerateRejected, planRequest } from "../../services/grpc/Generate.ts"
import { type GenerateError, type GrpcFailure, statusName, toGrpcFailure } from "../../services/grpc/GrpcStatus.ts"
import { boundToPair, type LegPlan, planLeg } from "../../services/grpc/Handoff.ts"
import { inputDigest, type Sha256 } from "../../services/grpc/InputDigest.ts"
import { StartPacer } from "../../services/grpc/StartPacer.ts"
import { CallCancelled, CallDeadlineExceeded } from "../../services/grpc/TransportErrors.ts"
import { frameMessage } from "../../services/grpc/Wire.ts"
import { Metrics } from "../../services/observability/Metrics.ts"
import {
  formatTraceparent,
  parseTraceparent,
  type TraceParent,
  TracesExported,
  tracestateToPass
} from "../../services/observability/TraceContext.ts"
import { engineOf } from "../engine/backends/index.ts"
import type { ActiveCalls } from "./ActiveCalls.ts"
import type { GenerateServerCall } from "./AgentService.ts"
import * as EngineCut from "./EngineCut.ts"
import * as EngineLegs from "./EngineLegs.ts"
import { withRequestId } from "./http2/Call.ts"
import { Relay } from "./Relay.ts"
import type { ServingState } from "./ServingState.ts"

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

/**
 * Time one event-loop turn spends starting calls before the rest of a burst waits for the next turn. Measured
 * (docs/bench.md, "Starts paced"): at 256 streams started together the added TTFT p50 fell from 11-16 to
 * 5.6-9.9 ms; 0.1 and 0.25 ms helped as well, 0.5 kept the TTFT p99 lowest.
 */
export const START_BUDGET_MS = 0.5

const sha256: Sha256 = (text) => hash("sha256", text, "base64url")

/**
 * A message of the engine's answer that cannot be encoded (a number past its proto field that got by the readers,
 * ChunkReader.ts): the call ends INTERNAL with the engine's invalid answer, as any answer that is not the API's.
 */
const notEncoded = (e: unknown): EngineError =>
  new EngineError({
    reason: "Protocol",
    message: `the answer could not be encoded as a gRPC message (${e instanceof Error ? e.message : String(e)})`
  })

/** The status names a call whose grpc-timeout passed, or whose caller cancelled it, ends with: the one table's. */
const DEADLINE_EXCEEDED = statusName(toGrpcFailure(new CallDeadlineExceeded()).code)
const CANCELLED = statusName(toGrpcFailure(new CallCancelled()).code)

/**
 * The Generate handler over `serving` (refusals) and `active` (the drain's and the watchdog's view); `served`: the
 * engine's per-request context, which `max_tokens` is checked against with the configured one (absent: that alone).
 */
export const makeHandler = Effect.fnUntraced(function* (
  serving: ServingState,
  active: ActiveCalls,
  maxPendingChars: number,
  served?: ServedContextService
) {
  const config = yield* Config
  const metrics = Option.getOrUndefined(yield* Effect.serviceOption(Metrics))
  // Spans only when traces are exported: otherwise the caller's traceparent goes to the engine unchanged.
  const tracing = yield* TracesExported
  const legs = yield* EngineLegs.make()
  // A failed engine request is explained by the engine run's end when one cut it: its error path only. A run the
  // agent itself ends cuts the calls in flight at once (aborting their engine requests), so the engine can exit.
  const explainCut = yield* EngineCut.make
  yield* EngineCut.cutOnRunEnd(active)
  const runLeg: (...args: Parameters<EngineLegs.RunLeg>) => Effect.Effect<void, GenerateError> =
    explainCut === undefined
      ? legs
      : (relay, plan, leg, opts, callerMs) =>
          Effect.catchTag(legs(relay, plan, leg, opts, callerMs), "EngineError", explainCut)
  const run = Effect.runCallbackWith(yield* Effect.context<never>())
  const model = config.model.served_name
  const role = config.agent.role
  const nodeId = config.agent.node_id
  // How this engine hands a request from prefill to decode, and how it spells the request: the backend's
  // capabilities, looked up once.
  const { handoff, requestDialect, stopSequenceField } = engineOf(config).capabilities
  // One model per agent: bind the label once, not per call.
  const relayed = metrics?.relayedTokens.labels({ model })
  relayed?.inc(0) // a series from the start, so rate() sees the first tokens (StallWatchdog.ts says why)
  // an engine (a proxied server) that ignores stream_options.include_usage: its finals carry no usage to bill by
  const noUsage = metrics?.finalsWithoutUsage.labels({ model })
  noUsage?.inc(0)

  const record = (status: string, relay: Relay | undefined, startedAt: number): void => {
    if (metrics === undefined) return
    metrics.requests.inc({ role, model, grpc_code: status })
    metrics.requestDuration.observe({ role, model }, (performance.now() - startedAt) / 1000)
    if (relay !== undefined && relay.firstTextAt > 0)
      metrics.timeToFirstToken.observe({ role, model }, (relay.firstTextAt - startedAt) / 1000)
  }

  // Calls that arrive together start for at most START_BUDGET_MS of each event-loop turn; the rest start in the
  // turns after (services/grpc/StartPacer.ts).
  // performance.now, as the call timings here: a sub-millisecond monotonic clock with no allocation per call.
  const pacer = new StartPacer({ budgetMs: START_BUDGET_MS, now: () => performance.now(), defer: setImmediate })

  // Calls whose engine request is written, waiting for their response headers: one later turn sends them all,
  // so that engine requests written in one turn are not spaced by each other's headers (sent one by one, at 256
  // streams started together, they cost the median first token 1-2 ms: docs/bench.md, "Headers batched").
  let awaitingHeaders: Array<GenerateServerCall> = []
  const sendAwaitingHeaders = (): void => {
    const calls = awaitingHeaders
    awaitingHeaders = []
    for (const c of calls) c.sendHeaders()
  }
  const headersAfterWrite = (call: GenerateServerCall): void => {
    if (awaitingHeaders.push(call) === 1) setImmediate(sendAwaitingHeaders)
  }

  // Every failure a Generate call is sent, the server's refusals before this handler included: bound to its pair or
  // not by the one rule (Handoff.ts boundToPair), from how far the call got (its leg planned, the engine asked).
  const withPair = (f: GrpcFailure, leg: LegPlan | undefined, engineAsked: boolean): GrpcFailure =>
    boundToPair({ role, handoff, leg, engineAsked }) ? { ...f, pairBound: true } : f
  const refuse = (call: GenerateServerCall, startedAt: number, e: GenerateError, leg?: LegPlan): void => {
    const f = toGrpcFailure(e)
    record(statusName(f.code), undefined, startedAt)
    call.sendStatus(withPair(f, leg, false))
  }
  /** A Generate call the server ended before this handler ran (http2/Server.ts onRejected): counted; what it sends. */
  const rejected = (f: GrpcFailure): GrpcFailure => {
    if (metrics !== undefined) metrics.requests.inc({ role, model, grpc_code: statusName(f.code) })
    return withPair(f, undefined, false)
  }

  const handle = (call: GenerateServerCall): void => {
    const startedAt = performance.now()
    const req = call.request
    const plan = planRequest(req, config, requestDialect, served?.current())
    if (plan instanceof GenerateRejected) {
      refuse(call, startedAt, plan)
      return
    }
    const leg = planLeg({
      role,
      handoff,
      body: plan.body,
      kvTransferParams: req.kvTransferParams,
      bootstrap: req.bootstrap,
      inputDigest: () => inputDigest(sha256, model, req)
    })
    if (Result.isFailure(leg)) {
      refuse(call, startedAt, leg.failure)
      return
    }
    const notServing = serving.refusal()
    if (notServing !== undefined) {
      refuse(call, startedAt, notServing, leg.success)
      return
    }
    const requestId = req.requestId === "" ? randomUUID() : req.requestId
    // so that the deadline the transport ends the call at (http2/Call.ts endAt) names it too
    call.requestId = requestId
    const opts: { requestId: string; traceparent?: string; tracestate?: string } = { requestId }
    const incoming = parseTraceparent(call.metadata.get("traceparent")[0])
    // What is left of the caller's deadline (its grpc-timeout, from the headers), for admission to shed a call that
    // can no longer meet it: a large request that took long to arrive has less than the whole timeout.
    const callerMs = call.remainingMs()
    if (incoming !== undefined) {
      opts.traceparent = formatTraceparent(incoming)
      const state = tracestateToPass(call.metadata.get("tracestate")[0])
      if (state !== undefined) opts.tracestate = state
    }
    const relay = new Relay(maxPendingChars, stopSequenceField)
    relay.requestId = requestId
    active.add(relay)
    let ended = false
    let blocked = false
    const settle = (status: string): void => {
      ended = true
      call.off("drain", onDrain)
      if (!relay.done) relay.interrupt()
      active.delete(relay)
      record(status, relay, startedAt)
    }
    // Ends the call with the failure's status (GrpcStatus.ts's table), the request id in its trailers; see withPair.
    const fail = (failure: GenerateError): void => {
      const f = toGrpcFailure(failure)
      settle(statusName(f.code))
      // the id the engine and the agent's logs and spans know the call by (the agent's own when the caller gave none)
      call.sendStatus(withPair(withRequestId(f, requestId), leg.success, relay.admitted))
    }
    // Runs inside the producer's read callback: everything pending goes out now unless the call's buffer is full.
    const pump = (): void => {
      if (ended) return
      if (blocked) {
        // a call ended for not reading (the watchdog's ClientNotReading) ends now: its reset waits for no 'drain'
        if (relay.done && relay.failure?._tag === "ClientNotReading") fail(relay.failure)
        return
      }
      for (let d = relay.take(); d !== undefined; d = relay.take()) {
        relayed?.inc(d.tokens)
        let frame: Uint8Array
        try {
          frame = frameDelta(d.text, 0, d.tokens)
        } catch (e) {
          fail(notEncoded(e))
          return
        }
        if (!call.writeFrame(frame)) {
          blocked = true
          relay.hold()
          call.once("drain", onDrain)
          return
        }
      }
      if (!relay.done) return
      if (relay.failure !== undefined) {
        fail(relay.failure)
        return
      }
      const now = performance.now()
      const final = relay.reader.final({
        ttftMs: (relay.firstTextAt > 0 ? relay.firstTextAt : now) - startedAt,
        totalMs: now - startedAt,
        // Effect's Clock, as admission measures it (a TestClock moves it); ttft and total are performance.now()
        queueMs: relay.queueMs,
        nodeId,
        requestId
      })
      // Encoded (the route's encoder, AgentService.ts) before the call counts as OK: thrown from `call.write` after it,
      // the call was counted OK and left open.
      let frame: Uint8Array
      try {
        frame = frameMessage(GenerateResponse.encode({ final }).finish(), Buffer.allocUnsafe)
      } catch (e) {
        fail(notEncoded(e))
        return
      }
      settle("OK")
      if (final.usage === undefined) noUsage?.inc()
      call.writeFrame(frame)
      call.end()
    }
    const onDrain = (): void => {
      blocked = false
      relay.release()
      pump()
    }
    // Client cancel, deadline, or the connection gone (never after the call's own end). The deadline's end is
    // the one the caller sees: DEADLINE_EXCEEDED (http2/Call.ts endAt), not a cancel.
    call.on("cancelled", (why: "cancelled" | "deadline") => {
      if (!ended) settle(why === "deadline" ? DEADLINE_EXCEEDED : CANCELLED)
    })
    relay.consumer = pump
    // Built while the engine works on the request, not on the first token's path: the response headers
    // (docs/bench.md, "Response headers while the engine thinks"). A call that fails first answers trailers-only.
    relay.onSent = () => headersAfterWrite(call)
    const work = tracing
      ? traced(incoming, { requestId, leg: EngineLegs.spanLeg(leg.success) }, (tp) =>
          runLeg(relay, plan, leg.success, { ...opts, traceparent: tp }, callerMs)
        )
      : runLeg(relay, plan, leg.success, opts, callerMs)
    if (call.cancelled && !ended) settle(CANCELLED)
    pacer.start(() => {
      if (ended) return
      // Aborted while its start waited (the drain's abortActive): it ends with that status, no engine request.
      if (relay.failure !== undefined) {
        relay.finish(Exit.void)
        return
      }
      try {
        relay.interrupt = run(work, { onExit: (exit) => relay.finish(exit) })
      } catch (e) {
        // A start may run in a later turn, where a throw would end the daemon: the call ends INTERNAL instead.
        relay.finish(Exit.die(e))
      }
    })
  }
  return { handle, rejected }
})
