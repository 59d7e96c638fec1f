// Calls the engine failed, counted in a row (services/engine/FailedCalls.ts), what counts as the engine's failure (the
// one status table, services/grpc/GrpcStatus.ts engineFailedCall), and the engine taken as failing calls as a source
// of EngineStall's state: its reason, its start for the restart, what clears it.
import { assert, describe, it } from "@effect/vitest"
import { Status } from "nice-grpc-common"
import { EngineError } from "../../src/services/engine/EngineClient.ts"
import {
  isStalled,
  noStall,
  onCompleted,
  onFailing,
  onNoProgress,
  onStall,
  stallProblem,
  stallRestartAt,
  stallStart
} from "../../src/services/engine/EngineStall.ts"
import { addFailed, addHandoffFailed, failingCleared, failingProblem } from "../../src/services/engine/FailedCalls.ts"
import { Draining, Overloaded } from "../../src/services/grpc/Admission.ts"
import { EngineRunEnded, EngineStalled, NotServing } from "../../src/services/grpc/CallErrors.ts"
import { engineFailedCall, engineFailure } from "../../src/services/grpc/GrpcStatus.ts"
import { handoffPeer } from "../../src/services/grpc/Handoff.ts"
import { CallDeadlineExceeded } from "../../src/services/grpc/TransportErrors.ts"

const http = (status: number) => new EngineError({ reason: "Http", status, message: `HTTP ${status}` })

describe("the run of failed calls", () => {
  it("trips at the threshold, counting across reports, naming the last failure; 0 never trips", () => {
    const [a, none] = addFailed(undefined, 3, "first", 5, 1_000)
    assert.deepStrictEqual(a, { calls: 3, last: "first" })
    assert.isUndefined(none)
    const [b, failing] = addFailed(a, 2, "second", 5, 2_000)
    assert.deepStrictEqual(b, { calls: 5, last: "second" })
    assert.deepStrictEqual(failing, { since: 2_000, calls: 5, last: "second" })
    assert.deepStrictEqual(addFailed(undefined, 7, "x", 5, 3_000)[1], { since: 3_000, calls: 7, last: "x" })
    assert.isUndefined(addFailed(undefined, 1_000, "x", 0, 3_000)[1], "0: off")
    assert.deepStrictEqual(addFailed(a, 0, "y", 5, 3_000), [a, undefined], "nothing failed: nothing changes")
    assert.strictEqual(
      failingProblem({ since: 0, calls: 5, last: "engine answered HTTP 500: boom" }),
      "engine failing calls: the last 5 calls failed in the engine with none completed (engine.failed_calls_unhealthy), the last with: engine answered HTTP 500: boom"
    )
  })
})

describe("what counts as a call the engine failed (the status table's engine rows that end UNAVAILABLE)", () => {
  it("5xx, a refused or reset connection, a broken-off stream", () => {
    assert.strictEqual(
      engineFailedCall(
        new EngineError({ reason: "Http", status: 500, message: "boom", engineType: "InternalServerError" })
      ),
      "engine answered HTTP 500 (InternalServerError): boom"
    )
    assert.isDefined(engineFailedCall(http(502)))
    assert.isDefined(engineFailedCall(http(504)))
    assert.isDefined(engineFailedCall(new EngineError({ reason: "Connect", message: "ECONNREFUSED" })))
    assert.isDefined(engineFailedCall(new EngineError({ reason: "Stream", message: "stream truncated: reset" })))
    assert.isDefined(engineFailedCall(new EngineError({ reason: "Stream", status: 500, message: "error event" })))
  })

  it("the engine refusing the agent's key (401, 403): every call fails so, the node's fault, never the caller's", () => {
    assert.strictEqual(
      engineFailedCall(
        new EngineError({ reason: "Http", status: 401, message: "Invalid API Key", engineType: "authentication_error" })
      ),
      "engine answered HTTP 401 (authentication_error): Invalid API Key"
    )
    assert.isDefined(engineFailedCall(http(403)))
  })

  it("not what the request caused, an engine too busy, no answer in time, nor the agent's own endings", () => {
    for (const e of [
      http(400),
      http(404),
      http(413),
      http(422),
      http(429),
      http(501),
      // vLLM's full request queue (--max-queued-requests), llama-server loading: busy, not broken
      http(503),
      new EngineError({ reason: "Stream", status: 503, message: "The request queue is full." }),
      new EngineError({ reason: "Stream", status: 400, message: "bad input mid-stream" }),
      new EngineError({ reason: "Timeout", message: "no answer" }),
      new EngineError({ reason: "Protocol", message: "not JSON" }),
      new EngineStalled({ idleTimeout: "5m" }),
      new EngineRunEnded({ by: "exit", why: "the engine exited (signal SIGKILL)", engine: http(500) }),
      new NotServing({ reason: "engine is not ready (starting)" }),
      new Overloaded({ maxInflight: 1, maxQueue: 1 }),
      new Draining({}),
      new CallDeadlineExceeded()
    ])
      assert.isUndefined(engineFailedCall(e), e._tag)
  })

  it("an output fault (one request's output the engine could not answer with), on a 500 or a stream's error event", () => {
    const message = "The model produced output that does not match the expected Content-only format"
    for (const e of [
      new EngineError({ reason: "Stream", status: 500, engineType: "server_error", message, fault: "output" }),
      new EngineError({ reason: "Http", status: 500, engineType: "server_error", message, fault: "output" })
    ]) {
      assert.isUndefined(engineFailedCall(e), e.reason)
      const f = engineFailure(e)
      assert.deepStrictEqual(
        [f.code, f.retryElsewhere, f.trailers["cgn-reason"], f.trailers["cgn-engine-status"]],
        [Status.INTERNAL, false, "engine_output", "500"]
      )
      assert.include(f.message, `(server_error): ${message}`)
    }
    // the same error unmarked: the engine's failure, as before
    assert.isDefined(engineFailedCall(new EngineError({ reason: "Stream", status: 500, message })))
  })
})

describe("failing calls in the stall state", () => {
  const failing = { since: 5_000, calls: 5, last: "engine answered HTTP 500: boom" }

  it("takes the engine as failing until a call completes; the restart counts from its start", () => {
    const s = onFailing(noStall, failing)!
    assert.isTrue(isStalled(s))
    assert.strictEqual(stallStart(s), 5_000)
    assert.strictEqual(stallRestartAt(s, 60_000), 65_000)
    assert.strictEqual(stallProblem(s, "5m"), failingProblem(failing))
    assert.isUndefined(onFailing(s, { ...failing, since: 9_000 }), "already so taken")
    const cleared = onCompleted(s, 6_000)
    assert.isDefined(cleared)
    assert.isFalse(isStalled(cleared!))
    // too few calls completed in a row yet: kept, and nothing else to clear, so nothing changes
    assert.isUndefined(onCompleted(s, 6_000, false, true))
    // kept beside a stalled stream the completion does clear
    const both = onCompleted(onStall(s, 5_500), 6_000, false, true)
    assert.deepStrictEqual(both?.failing, failing)
    assert.strictEqual(both?.stalledStreams, 0)
  })

  it("calls clear it once as many completed in a row as made it", () => {
    assert.isFalse(failingCleared(4, 5))
    assert.isTrue(failingCleared(5, 5))
    assert.isTrue(failingCleared(12, 5))
  })

  it("a stalled stream's reason comes first, the counters' after; the earliest start counts", () => {
    const both = onFailing(onStall(noStall, 3_000), failing)!
    assert.match(stallProblem(both, "5m")!, /^engine stalled: 1 stream\(s\)/)
    assert.strictEqual(stallStart(both), 3_000)
    const counters = onFailing(onNoProgress(noStall, { since: 1_000, held: 1, counters: ["c"] })!, failing)!
    assert.strictEqual(stallProblem(counters, "5m"), failingProblem(failing))
    assert.strictEqual(stallStart(counters), 1_000)
  })
})

describe("decode legs failed before their first text (addHandoffFailed)", () => {
  it("counts a run; at the threshold, one prefill node's are tested, two or more nodes' are the engine's", () => {
    const one = addHandoffFailed(undefined, 3, "a", ["p1:1"], 5)
    assert.deepStrictEqual(one, { run: { calls: 3, last: "a", peers: ["p1:1"] } })
    assert.deepStrictEqual(addHandoffFailed(one.run, 2, "b", ["p1:1"], 5), {
      run: undefined,
      due: { by: "test", run: { calls: 5, last: "b", peers: ["p1:1"] } }
    })
    assert.strictEqual(addHandoffFailed(one.run, 2, "b", ["p2:1"], 5).due?.by, "engine")
    // none: nothing changes; 0: never judged
    assert.strictEqual(addHandoffFailed(one.run, 0, "c", [], 5).run, one.run)
    assert.isUndefined(addHandoffFailed(undefined, 100, "c", ["p1:1", "p2:1"], 0).due)
  })

  it("reads the prefill node a decode leg's engine body names: vLLM's side channel, SGLang's bootstrap server", () => {
    assert.strictEqual(
      handoffPeer({ kv_transfer_params: { remote_host: "10.0.0.5", remote_port: 5600 } }),
      "10.0.0.5:5600"
    )
    assert.strictEqual(
      handoffPeer({ bootstrap_host: "10.0.0.6", bootstrap_port: 8998, bootstrap_room: 1 }),
      "10.0.0.6:8998"
    )
    assert.isUndefined(handoffPeer({ prompt: "x" }))
  })
})
