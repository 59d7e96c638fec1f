// GrpcStatus's one table from a Generate error to its gRPC status: every tag of the closed GenerateError union
// has a row (checked by the type and at run time), and each row gives the status and trailers callers rely on.
import { Status } from "nice-grpc-common"
import { describe, expect, expectTypeOf, it } from "vitest"
import { EngineError } from "../../src/services/engine/EngineClient.ts"
import { Draining, Overloaded, ShedAtArrival, ShedAtSlot } from "../../src/services/grpc/Admission.ts"
import {
  AgentDefect,
  ClientNotReading,
  EngineRunEnded,
  EngineStalled,
  LegDeadline,
  NodeCordoned,
  NotServing,
  ServerShuttingDown,
  StreamAborted
} from "../../src/services/grpc/CallErrors.ts"
import { GenerateRejected } from "../../src/services/grpc/Generate.ts"
import {
  type GenerateError,
  type GenerateErrorTag,
  statusName,
  statusTable,
  toGrpcFailure
} from "../../src/services/grpc/GrpcStatus.ts"
import { InvalidHandoff } from "../../src/services/grpc/Handoff.ts"
import { asSent, STREAMED_ADVICE } from "../../src/services/grpc/StatusMessage.ts"
import {
  CallCancelled,
  CallDeadlineExceeded,
  MessageTooLarge,
  ProtocolViolation,
  RequestReadTimeout,
  RequestsOverBudget,
  UndecodableRequest,
  UnknownMethod,
  UnsupportedEncoding
} from "../../src/services/grpc/TransportErrors.ts"
import { ClientNotAllowed } from "../../src/services/tls/ClientNames.ts"

// One sample per tag: the Record type makes a new member of the union without a sample fail the type check.
const samples: { readonly [T in GenerateErrorTag]: readonly [Extract<GenerateError, { _tag: T }>, Status] } = {
  GenerateRejected: [new GenerateRejected({ reason: "invalid_argument", message: "bad" }), Status.INVALID_ARGUMENT],
  InvalidHandoff: [
    new InvalidHandoff({ reason: "no params", missing: ["kv_transfer_params"] }),
    Status.FAILED_PRECONDITION
  ],
  NotServing: [new NotServing({ reason: "engine is not ready (starting)" }), Status.UNAVAILABLE],
  NodeCordoned: [new NodeCordoned(), Status.UNAVAILABLE],
  Overloaded: [new Overloaded({ maxInflight: 1, maxQueue: 0 }), Status.RESOURCE_EXHAUSTED],
  Draining: [new Draining(), Status.UNAVAILABLE],
  ShedAtArrival: [
    new ShedAtArrival({ kind: "normal", leftMs: 300, needMs: 900, deadline: "the caller's deadline", maxInflight: 2 }),
    Status.RESOURCE_EXHAUSTED
  ],
  ShedAtSlot: [
    new ShedAtSlot({
      kind: "prefill",
      leftMs: 120.4,
      needMs: 900,
      deadline: "agent.handoff_timeout = 4s",
      queuedMs: 3880
    }),
    Status.DEADLINE_EXCEEDED
  ],
  EngineError: [new EngineError({ reason: "Connect", message: "ECONNREFUSED" }), Status.UNAVAILABLE],
  LegDeadline: [new LegDeadline({ leg: "decode", timeout: "30s" }), Status.DEADLINE_EXCEEDED],
  EngineStalled: [new EngineStalled({ idleTimeout: "30s" }), Status.UNAVAILABLE],
  EngineRunEnded: [
    new EngineRunEnded({
      by: "restart",
      why: "the engine is being restarted (POST /engine/restart by an operator)",
      engine: new EngineError({ reason: "Stream", message: "stream truncated: UND_ERR_SOCKET: other side closed" })
    }),
    Status.UNAVAILABLE
  ],
  StreamAborted: [new StreamAborted({ reason: "node drained" }), Status.UNAVAILABLE],
  ClientNotReading: [new ClientNotReading({ timeout: "1m" }), Status.CANCELLED],
  ServerShuttingDown: [new ServerShuttingDown(), Status.UNAVAILABLE],
  AgentDefect: [new AgentDefect({ detail: "bug" }), Status.INTERNAL],
  UnknownMethod: [new UnknownMethod({ path: "/x.Y/Z" }), Status.UNIMPLEMENTED],
  MessageTooLarge: [new MessageTooLarge({ length: 10, limit: 5 }), Status.RESOURCE_EXHAUSTED],
  RequestsOverBudget: [new RequestsOverBudget({ limitBytes: 64 }), Status.RESOURCE_EXHAUSTED],
  RequestReadTimeout: [new RequestReadTimeout({ timeoutMs: 200 }), Status.RESOURCE_EXHAUSTED],
  CallCancelled: [new CallCancelled(), Status.CANCELLED],
  UndecodableRequest: [new UndecodableRequest({ method: "/x.Y/Z", detail: "bad wire type" }), Status.INVALID_ARGUMENT],
  ProtocolViolation: [new ProtocolViolation({ detail: "no message" }), Status.INTERNAL],
  UnsupportedEncoding: [new UnsupportedEncoding({ encoding: "snappy" }), Status.UNIMPLEMENTED],
  CallDeadlineExceeded: [new CallDeadlineExceeded(), Status.DEADLINE_EXCEEDED],
  ClientNotAllowed: [new ClientNotAllowed({ names: "DNS:other.cgn.svc" }), Status.PERMISSION_DENIED]
}

describe("the status table", () => {
  it("has exactly one row per GenerateError tag (type level)", () => {
    expectTypeOf<keyof typeof statusTable>().toEqualTypeOf<GenerateErrorTag>()
  })

  it("has exactly one row per GenerateError tag (run time)", () => {
    expect(Object.keys(statusTable).sort()).toEqual(Object.keys(samples).sort())
    for (const [tag, [e]] of Object.entries(samples)) expect(e._tag).toBe(tag)
  })

  it.each(Object.values(samples))("%s maps to its status with the agent's or the engine's trailers", (e, code) => {
    const f = toGrpcFailure(e)
    expect(statusName(f.code)).toBe(statusName(code))
    if (e._tag !== "EngineError") expect(f.message).toBe(e.message)
    expect(f.trailers["cgn-error-source"]).toBe(e._tag === "EngineError" ? "engine" : "agent")
  })

  it("every row names its reason (cgn-reason) and whether another node may take the call", () => {
    const reasons = new Map<string, string>()
    for (const [tag, [e]] of Object.entries(samples)) {
      const f = toGrpcFailure(e)
      const reason = f.trailers["cgn-reason"] ?? ""
      expect(reason, tag).toMatch(/^[a-z]+(_[a-z]+)*$/)
      expect(typeof f.retryElsewhere, tag).toBe("boolean")
      // one reason per agent ending (a router tells them apart without reading the message)
      if (e._tag !== "EngineError" && e._tag !== "GenerateRejected") {
        expect(reasons.get(reason), `${tag} and ${reasons.get(reason)} share ${reason}`).toBeUndefined()
        reasons.set(reason, tag)
      }
    }
    // this node's state: another may take the call; the request's own fault or the caller's end: no
    const retry = (e: GenerateError) => toGrpcFailure(e).retryElsewhere
    for (const tag of [
      "Overloaded",
      "NodeCordoned",
      "Draining",
      "NotServing",
      "ShedAtArrival",
      // README: "`cgn-retryable`: `true` when ... this node's state was the cause (overloaded, cordoned, draining, shed, ..."
      "ShedAtSlot",
      "EngineStalled"
    ] as const)
      expect(retry(samples[tag][0]), tag).toBe(true)
    for (const tag of [
      "InvalidHandoff",
      "MessageTooLarge",
      "UndecodableRequest",
      // README (agent.request_read_timeout): "`cgn-reason` `request_read_timeout`, not retryable"
      "RequestReadTimeout",
      "CallDeadlineExceeded",
      "ClientNotReading"
    ] as const)
      expect(retry(samples[tag][0]), tag).toBe(false)
    // a caller that is not reading gets only a reset (RST_STREAM CANCEL, read as CANCELLED): the one row sent so
    const resets = Object.values(samples).filter(([e]) => toGrpcFailure(e).reset === true)
    expect(resets.map(([e]) => [e._tag, statusName(toGrpcFailure(e).code)])).toEqual([
      ["ClientNotReading", "CANCELLED"]
    ])
    expect(retry(new GenerateRejected({ reason: "invalid_argument", message: "m", field: "prompt" }))).toBe(false)
    expect(retry(new GenerateRejected({ reason: "request_too_large", message: "m", field: "prompt" }))).toBe(false)
    // the engine: down, slow or overloaded here may not be so elsewhere; a request it refuses would be refused there
    const http = (status: number) => new EngineError({ reason: "Http", message: "x", status })
    expect([400, 404, 413, 422, 429, 500, 501, 503].map((s) => retry(http(s)))).toEqual([
      false,
      false,
      false,
      false,
      true,
      true,
      false,
      true
    ])
    expect(toGrpcFailure(http(500)).trailers["cgn-reason"]).toBe("engine_http")
    expect(retry(new EngineError({ reason: "Connect", message: "x" }))).toBe(true)
    // an engine that is broken (INTERNAL: an invalid answer, or a 401/403/409 of an agent and engine that disagree) may
    // well not be so on another node (GrpcStatus.ts: "down, slow, overloaded (429) or broken")
    const broken = [new EngineError({ reason: "Protocol", message: "x" }), http(401), http(403), http(409)]
    expect(broken.map((e) => [statusName(toGrpcFailure(e).code), retry(e)])).toEqual(
      broken.map(() => ["INTERNAL", true])
    )
  })

  it("keeps the messages callers see (as a call that sent nothing sends them: asSent)", () => {
    const sent = (e: GenerateError) => asSent(toGrpcFailure(e), false).message
    expect(sent(samples.NotServing[0])).toBe("engine is not ready (starting); retry on another node")
    // README (Cordon): "node is cordoned ...; retry on another node"
    expect(sent(samples.NodeCordoned[0])).toMatch(/^node is cordoned \(.*\); retry on another node$/)
    expect(sent(samples.Draining[0])).toBe("draining: this node takes no new requests; retry on another node")
    expect(sent(samples.Overloaded[0])).toBe(
      "overloaded: 1 requests in flight (agent.max_inflight = 1) and 0 queued (agent.max_queue = 0); retry on another node"
    )
    expect(sent(samples.StreamAborted[0])).toBe("node drained; retry on another node")
    expect(sent(samples.EngineStalled[0])).toBe(
      "the engine sent nothing for 30s (engine.stream_idle_timeout); the engine request was aborted; retry on another node"
    )
    // The transport's own refusals in grpc-js's words (a client or router matching on them sees the same text).
    expect(toGrpcFailure(samples.MessageTooLarge[0]).message).toBe("received message larger than max (10 vs 5)")
    expect(toGrpcFailure(samples.CallDeadlineExceeded[0]).message).toBe("Deadline exceeded")
    // README: RESOURCE_EXHAUSTED (retryable); the message says so too.
    expect(sent(samples.RequestsOverBudget[0])).toBe(
      "requests still arriving hold more than 64 bytes; retry on another node"
    )
    expect(sent(samples.LegDeadline[0])).toBe(
      "the decode leg did not start within 30s ([agent].handoff_timeout); the engine request was aborted; retry on another node"
    )
    // A leg bound to its pair says so (cgn-retry-pair), not to retry it alone.
    expect(asSent({ ...toGrpcFailure(samples.LegDeadline[0]), pairBound: true }, false)).toEqual({
      message:
        "the decode leg did not start within 30s ([agent].handoff_timeout); the engine request was aborted; retry both legs as a new pair (this leg's handoff is not to be used again)",
      retryable: false,
      retryPair: true
    })
    expect(sent(samples.ShedAtSlot[0])).toBe(
      "~120 ms left of its deadline (agent.handoff_timeout = 4s) after 3880 ms waiting for a slot (agent.max_inflight); prefill legs here need ~900 ms from a slot to their answer; not sent to the engine"
    )
    expect(sent(samples.ShedAtArrival[0])).toBe(
      "not queued: all 2 slots are busy (agent.max_inflight) and the call has ~300 ms left of its deadline (the caller's deadline); calls here need ~900 ms from a slot to their first token; not sent to the engine; retry on another node"
    )
    expect(sent(samples.EngineRunEnded[0])).toBe(
      "the engine is being restarted (POST /engine/restart by an operator): stream truncated: UND_ERR_SOCKET: other side closed; retry on another node"
    )
  })

  it("an engine run that ended under the call keeps the engine's trailers; its source is the engine only when it exited", () => {
    const engine = new EngineError({ reason: "Connect", message: "ECONNREFUSED: connect ECONNREFUSED 127.0.0.1:1" })
    const exited = toGrpcFailure(new EngineRunEnded({ by: "exit", why: "the engine exited (signal SIGKILL)", engine }))
    expect(exited).toEqual({
      code: Status.UNAVAILABLE,
      message: "the engine exited (signal SIGKILL): ECONNREFUSED: connect ECONNREFUSED 127.0.0.1:1",
      trailers: {
        "cgn-error-source": "engine",
        "cgn-reason": "engine_run_ended",
        "cgn-engine-reason": "Connect",
        "cgn-engine-message": "ECONNREFUSED: connect ECONNREFUSED 127.0.0.1:1"
      },
      retryElsewhere: true,
      advised: true
    })
    expect(asSent(exited, false).message).toBe(`${exited.message}; retry on another node`)
    const restarted = toGrpcFailure(samples.EngineRunEnded[0])
    expect(restarted.trailers).toEqual({
      "cgn-error-source": "agent",
      "cgn-reason": "engine_run_ended",
      "cgn-engine-reason": "Stream",
      "cgn-engine-message": "stream truncated: UND_ERR_SOCKET: other side closed"
    })
  })
})

// The soak's engine killed mid-stream: "...; retry on another node" beside cgn-retryable false. What went out decides
// both, in one place (asSent, which the call's sendStatus uses).
describe("a failure as sent: cgn-retryable and the message's advice agree", () => {
  const engine = new EngineError({ reason: "Stream", message: "stream truncated: UND_ERR_SOCKET: other side closed" })
  const died = toGrpcFailure(new EngineRunEnded({ by: "exit", why: "the engine exited (signal SIGKILL)", engine }))

  it("before any message: retryable, and the message says so", () => {
    expect(asSent(died, false)).toEqual({ message: `${died.message}; retry on another node`, retryable: true })
  })

  it("after a delta: not retryable, and the message says so instead of 'retry on another node'", () => {
    expect(asSent(died, true)).toEqual({
      message:
        "the engine exited (signal SIGKILL): stream truncated: UND_ERR_SOCKET: other side closed; do not retry " +
        "elsewhere: the call had already streamed output",
      retryable: false
    })
    const stalled = asSent(toGrpcFailure(samples.EngineStalled[0]), true)
    expect([stalled.message.endsWith(STREAMED_ADVICE), stalled.retryable]).toEqual([true, false])
  })

  it("a P/D leg bound to its pair: not retryable alone, retry-pair, the advice says so; after a delta, neither", () => {
    const bound = { ...died, pairBound: true as const }
    expect(asSent(bound, false)).toEqual({
      message:
        "the engine exited (signal SIGKILL): stream truncated: UND_ERR_SOCKET: other side closed; retry both legs as " +
        "a new pair (this leg's handoff is not to be used again)",
      retryable: false,
      retryPair: true
    })
    expect(asSent(bound, true)).toEqual(asSent(died, true))
    const invalid = toGrpcFailure(samples.GenerateRejected[0])
    expect(asSent({ ...invalid, pairBound: true }, false)).toEqual({ message: invalid.message, retryable: false })
  })

  it("a pair-bound leg refused for this node's load (shed, overloaded) gets the pair's advice too", () => {
    for (const e of [samples.ShedAtArrival[0], samples.Overloaded[0]]) {
      const refused = toGrpcFailure(e)
      const sent = asSent({ ...refused, pairBound: true }, false)
      expect(sent.retryPair).toBe(true)
      expect(sent.message).toBe(
        `${refused.message}; retry both legs as a new pair (this leg's handoff is not to be used again)`
      )
    }
  })

  it("no failure's own message carries advice to retry elsewhere: asSent adds it, only where the row says so", () => {
    for (const [tag, [e]] of Object.entries(samples)) {
      const f = toGrpcFailure(e)
      expect(f.message, tag).not.toMatch(/another node|retry (later|elsewhere|both)/)
      if (f.advised === true) expect(f.retryElsewhere, tag).toBe(true)
    }
  })

  it("a status that never advised a retry keeps its words; one with no opinion gets no trailer", () => {
    const midStream = toGrpcFailure(new EngineError({ reason: "Stream", message: "boom", status: 500 }))
    expect(asSent(midStream, true).message).toBe(midStream.message)
    const invalid = toGrpcFailure(samples.GenerateRejected[0])
    expect(asSent(invalid, true)).toEqual({ message: invalid.message, retryable: false })
    expect(asSent({ code: Status.UNKNOWN, message: "x", trailers: {} }, true)).toEqual({
      message: "x",
      retryable: undefined
    })
  })
})
