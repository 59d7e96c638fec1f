// An engine that fails every call (services/engine/FailedCalls.ts), through the stall watchdog and the live EngineStall
// on a TestClock: engine.failed_calls_unhealthy calls in a row that the engine failed, none completed, take the engine
// as failing calls (the node's reason, a metric); the agent's test completion goes at once and clears it when it
// completes, as a completed call does; calls that failed for other reasons neither count nor end the run; an engine
// still failing after engine.stall_restart_after is restarted as a stalled one is.
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Layer } from "effect"
import { TestClock } from "effect/testing"
import { Registry } from "prom-client"
import { layerFromObject } from "../../src/layers/config/Config.ts"
import * as EngineStallLive from "../../src/layers/engine/EngineStall.ts"
import { ActiveCalls } from "../../src/layers/grpc/ActiveCalls.ts"
import { Relay } from "../../src/layers/grpc/Relay.ts"
import * as StallWatchdog from "../../src/layers/grpc/StallWatchdog.ts"
import { fromRegistry } from "../../src/layers/observability/Metrics.ts"
import { EngineClient, EngineError } from "../../src/services/engine/EngineClient.ts"
import { EngineStall, stallProblem } from "../../src/services/engine/EngineStall.ts"
import { State } from "../../src/services/engine/EngineState.ts"
import { Overloaded } from "../../src/services/grpc/Admission.ts"
import type { GenerateError } from "../../src/services/grpc/GrpcStatus.ts"
import { Metrics } from "../../src/services/observability/Metrics.ts"
import * as EngineTest from "../../src/testing/EngineProcess.ts"

const IDLE_MS = 800 // the watchdog ticks every idle / 8 = 100 ms

const http500 = new EngineError({
  reason: "Http",
  status: 500,
  message: "simulated error (http500)",
  engineType: "InternalServerError"
})
// vLLM's --max-queued-requests refusal: no failed call (EngineStatus.ts)
const queueFull = new EngineError({ reason: "Http", status: 503, message: "The request queue is full." })
const REASON =
  "engine failing calls: the last 5 calls failed in the engine with none completed (engine.failed_calls_unhealthy), " +
  "the last with: engine answered HTTP 500 (InternalServerError): simulated error (http500)"

/**
 * The watchdog over the live EngineStall, a test supervisor (Ready) and an engine client whose test completion answers
 * as `engine.answer` says; `requests` counts the tests.
 */
const setup = (engineKeys: Record<string, unknown> = {}) => {
  const config = layerFromObject({
    models: { m: { hf_repo: "org/m" } },
    engine: { stream_idle_timeout: `${IDLE_MS}ms`, stall_restart_after: "0s", ...engineKeys }
  })
  const supervisor = EngineTest.layerTest({ initial: State.Ready({ since: 0, run: 0 }) })
  const engine = { answer: "fail" as "ok" | "fail" | "busy", requests: 0 }
  const client = EngineClient.of({
    streamTo: (_path, _body, _options, sink) =>
      Effect.suspend(() => {
        engine.requests++
        if (engine.answer === "fail") return Effect.fail(http500)
        if (engine.answer === "busy") return Effect.fail(queueFull)
        sink.onChunks([{ choices: [{ text: "pong", finish_reason: "length" }] }], () => undefined)
        return Effect.void
      }),
    load: Effect.succeed({ running: undefined, waiting: undefined, kvUsage: undefined })
  })
  const registry = new Registry()
  const metrics = Layer.effect(Metrics, fromRegistry(registry))
  const layer = Layer.mergeAll(
    config,
    supervisor,
    metrics,
    Layer.succeed(EngineClient, client),
    EngineStallLive.layer.pipe(Layer.provide(supervisor), Layer.provide(config), Layer.provide(metrics))
  )
  return { engine, registry, layer }
}

/** A call that ended: completed (undefined) or failed with `failure`, as GenerateCall settles one. */
const ended = (active: ActiveCalls, failure?: GenerateError) => {
  const relay = new Relay(1024)
  relay.streamRequested(0)
  active.add(relay)
  relay.finish(failure === undefined ? Exit.succeed(undefined) : Exit.fail(failure))
  active.delete(relay)
}

const problem = Effect.map(
  Effect.flatMap(EngineStall, (s) => s.state),
  (s) => stallProblem(s, "800ms")
)

const streaks = async (registry: Registry) =>
  (await registry.getSingleMetric("cgn_agent_engine_call_failure_streaks_total")?.get())?.values[0]?.value

describe("an engine that fails every call", () => {
  it.effect("five calls in a row that it failed make the node unhealthy; the test completion clears it", () => {
    const t = setup()
    return Effect.gen(function* () {
      const active = new ActiveCalls()
      yield* StallWatchdog.fork(active)
      yield* TestClock.adjust(100)
      for (let i = 0; i < 4; i++) ended(active, http500)
      yield* TestClock.adjust(100)
      assert.isUndefined(yield* problem, "four are not enough")
      const busy = new Relay(1024) // a call still in flight: the test waits for it
      active.add(busy)
      ended(active, http500)
      yield* TestClock.adjust(100)
      assert.strictEqual(yield* problem, REASON)
      assert.strictEqual(yield* Effect.promise(() => streaks(t.registry)), 1)
      assert.strictEqual(t.engine.requests, 0, "no test while a call is in flight")
      active.delete(busy)
      yield* TestClock.adjust(100)
      assert.strictEqual(t.engine.requests, 1, "the test at once once no call is in flight")
      assert.strictEqual(yield* problem, REASON, "a test that fails leaves it")
      // more failed calls neither move the reason nor count another streak
      for (let i = 0; i < 3; i++) ended(active, http500)
      yield* TestClock.adjust(100)
      assert.strictEqual(yield* problem, REASON)
      assert.strictEqual(yield* Effect.promise(() => streaks(t.registry)), 1)
      // then once per engine.stream_idle_timeout; the first that completes clears it
      t.engine.answer = "ok"
      yield* TestClock.adjust(IDLE_MS - 300)
      assert.strictEqual(t.engine.requests, 1)
      yield* TestClock.adjust(200)
      assert.strictEqual(t.engine.requests, 2)
      assert.isUndefined(yield* problem)
      // the run starts over after the test: four more failures do not trip it again
      for (let i = 0; i < 4; i++) ended(active, http500)
      yield* TestClock.adjust(100)
      assert.isUndefined(yield* problem)
    }).pipe(Effect.scoped, Effect.provide(t.layer))
  })

  it.effect(
    "a test the engine answers with an error is sent again at liveness's pace, not a stream_idle_timeout later",
    () => {
      // A proxied server restarted under traffic: calls failed, the first test too (refused), and it is back a moment
      // later; the node is back in traffic at the next test, engine.liveness_interval on, not stream_idle_timeout on.
      const t = setup({ liveness_interval: "300ms" })
      return Effect.gen(function* () {
        const active = new ActiveCalls()
        yield* StallWatchdog.fork(active)
        yield* TestClock.adjust(100)
        for (let i = 0; i < 5; i++) ended(active, http500)
        yield* TestClock.adjust(100)
        assert.strictEqual(t.engine.requests, 1, "the test at once")
        assert.strictEqual(yield* problem, REASON, "it failed: still failing")
        t.engine.answer = "ok"
        yield* TestClock.adjust(100)
        assert.strictEqual(t.engine.requests, 1, "not before liveness_interval")
        yield* TestClock.adjust(200)
        assert.strictEqual(t.engine.requests, 2, "liveness_interval after the failed one began")
        assert.isUndefined(yield* problem)
      }).pipe(Effect.scoped, Effect.provide(t.layer))
    }
  )

  it.effect("newly failing, the test goes at once even just after an idle test", () => {
    const t = setup({ idle_probe_after: "1s" })
    return Effect.gen(function* () {
      const active = new ActiveCalls()
      yield* StallWatchdog.fork(active)
      t.engine.answer = "ok"
      yield* TestClock.adjust(1100)
      assert.strictEqual(t.engine.requests, 1, "the idle test")
      // a burst of 500s for some inputs of a sound engine: cleared by one test, not an idle timeout later
      for (let i = 0; i < 5; i++) ended(active, http500)
      yield* TestClock.adjust(100)
      assert.strictEqual(t.engine.requests, 2)
      assert.isUndefined(yield* problem)
    }).pipe(Effect.scoped, Effect.provide(t.layer))
  })

  it.effect("a completed call ends the run, in the order the calls ended within a tick", () => {
    const t = setup()
    return Effect.gen(function* () {
      const active = new ActiveCalls()
      yield* StallWatchdog.fork(active)
      for (let i = 0; i < 4; i++) ended(active, http500)
      ended(active)
      for (let i = 0; i < 4; i++) ended(active, http500)
      yield* TestClock.adjust(100)
      assert.isUndefined(yield* problem, "4, a completion, 4")
      // the run goes on across ticks: one more
      ended(active, http500)
      yield* TestClock.adjust(100)
      assert.strictEqual(yield* problem, REASON)
      // calls clear it only once as many complete in a row as made it (5): 4, then a failure starts the count over
      for (let i = 0; i < 4; i++) ended(active)
      yield* TestClock.adjust(100)
      assert.strictEqual(yield* problem, REASON, "4 completed")
      ended(active, http500)
      yield* TestClock.adjust(100)
      for (let i = 0; i < 4; i++) ended(active)
      yield* TestClock.adjust(100)
      assert.isDefined(yield* problem, "a failure, then 4 completed")
      ended(active)
      yield* TestClock.adjust(100)
      assert.isUndefined(yield* problem, "5 completed in a row")
    }).pipe(Effect.scoped, Effect.provide(t.layer))
  })

  it.effect("calls clear it by their order within a tick: five in a row, whatever failed after them", () => {
    const t = setup()
    return Effect.gen(function* () {
      const active = new ActiveCalls()
      yield* StallWatchdog.fork(active)
      for (let i = 0; i < 5; i++) ended(active, http500)
      yield* TestClock.adjust(100)
      assert.strictEqual(yield* problem, REASON)
      // 3 completed, a failure, 3 completed: never 5 in a row
      for (let i = 0; i < 3; i++) ended(active)
      ended(active, http500)
      for (let i = 0; i < 3; i++) ended(active)
      yield* TestClock.adjust(100)
      assert.isDefined(yield* problem, "at most 3 in a row")
      // the run goes on across ticks: 2 more make 5, then 2 failures (not enough to take it again)
      for (let i = 0; i < 2; i++) ended(active)
      for (let i = 0; i < 2; i++) ended(active, http500)
      yield* TestClock.adjust(100)
      assert.isUndefined(yield* problem, "5 in a row, then 2 failed")
    }).pipe(Effect.scoped, Effect.provide(t.layer))
  })

  it.effect("what the request or the agent caused neither counts nor ends the run", () => {
    const t = setup()
    return Effect.gen(function* () {
      const active = new ActiveCalls()
      yield* StallWatchdog.fork(active)
      const others: ReadonlyArray<GenerateError> = [
        new EngineError({ reason: "Http", status: 400, message: "bad request" }),
        new EngineError({ reason: "Http", status: 429, message: "too many" }),
        new Overloaded({ maxInflight: 1, maxQueue: 1 })
      ]
      for (let i = 0; i < 4; i++) ended(active, http500)
      for (const e of others) ended(active, e)
      // the caller's cancel: no failure recorded on the relay
      const cancelled = new Relay(1024)
      active.add(cancelled)
      cancelled.finish(Exit.interrupt())
      active.delete(cancelled)
      yield* TestClock.adjust(100)
      assert.isUndefined(yield* problem)
      ended(active, new EngineError({ reason: "Connect", message: "connect ECONNREFUSED 127.0.0.1:8000" }))
      yield* TestClock.adjust(100)
      assert.match((yield* problem) ?? "", /the last 5 calls .* engine unreachable: connect ECONNREFUSED/)
    }).pipe(Effect.scoped, Effect.provide(t.layer))
  })

  it.effect('"0" turns it off', () => {
    const t = setup({ failed_calls_unhealthy: 0 })
    return Effect.gen(function* () {
      const active = new ActiveCalls()
      yield* StallWatchdog.fork(active)
      for (let i = 0; i < 100; i++) ended(active, http500)
      yield* TestClock.adjust(100)
      assert.isUndefined(yield* problem)
      assert.strictEqual(yield* Effect.promise(() => streaks(t.registry)), 0)
    }).pipe(Effect.scoped, Effect.provide(t.layer))
  })

  it.effect("still failing after engine.stall_restart_after: restarted as a stalled engine is, once", () => {
    const t = setup({ stall_restart_after: "5s" })
    return Effect.gen(function* () {
      const active = new ActiveCalls()
      yield* StallWatchdog.fork(active)
      yield* TestClock.adjust(100)
      for (let i = 0; i < 5; i++) ended(active, http500)
      yield* TestClock.adjust(100) // taken as failing at 200
      yield* TestClock.adjust(4_999)
      const control = yield* EngineTest.EngineProcessControl
      assert.deepStrictEqual(yield* control.restartRequests, [], "not a millisecond early")
      yield* TestClock.adjust(1)
      const [request, ...more] = yield* control.restartRequests
      assert.deepStrictEqual(more, [])
      assert.strictEqual(request?.source, "stall")
      assert.strictEqual(request?.reason, `${REASON}, for 5s (engine.stall_restart_after)`)
      yield* TestClock.adjust(60_000)
      assert.strictEqual((yield* control.restartRequests).length, 1, "one request per episode")
    }).pipe(Effect.scoped, Effect.provide(t.layer))
  })
})

/** A decode leg (Relay.readsHandoff) from `peer` that ended with `failure`, after some text when `wroteText`. */
const endedLeg = (active: ActiveCalls, failure: GenerateError, wroteText = false, peer = "10.0.0.5:5600") => {
  const relay = new Relay(1024)
  relay.readsHandoff = true
  relay.handoffPeer = peer
  relay.streamRequested(0)
  active.add(relay)
  if (wroteText) relay.onChunks([{ choices: [{ text: "a" }] }], () => undefined)
  relay.finish(Exit.fail(failure))
  active.delete(relay)
}

describe("decode legs the engine failed before their first text (their prefill node may be the cause)", () => {
  const handoffReason = REASON // the legs' last failure, as any failed call's

  it.effect("are judged by the engine's own test, sent with calls in flight: one it completes counts none", () => {
    const t = setup()
    return Effect.gen(function* () {
      const active = new ActiveCalls()
      yield* StallWatchdog.fork(active)
      t.engine.answer = "ok"
      const busy = new Relay(1024) // the decode node keeps its traffic: the test does not wait for calls to end
      active.add(busy)
      for (let i = 0; i < 4; i++) endedLeg(active, http500)
      yield* TestClock.adjust(100)
      assert.strictEqual(t.engine.requests, 0, "four: no test yet")
      endedLeg(active, http500)
      yield* TestClock.adjust(100)
      assert.strictEqual(t.engine.requests, 1, "the fifth: the test")
      assert.isUndefined(yield* problem, "the engine completed it: the node stays in traffic")
      assert.strictEqual(yield* Effect.promise(() => streaks(t.registry)), 0)
      // the next run is tested again, at the test's pace (once per stream_idle_timeout)
      for (let i = 0; i < 5; i++) endedLeg(active, http500)
      yield* TestClock.adjust(100)
      assert.strictEqual(t.engine.requests, 1, "not before stream_idle_timeout")
      yield* TestClock.adjust(IDLE_MS)
      assert.strictEqual(t.engine.requests, 2)
      assert.isUndefined(yield* problem)
      active.delete(busy)
    }).pipe(Effect.scoped, Effect.provide(t.layer))
  })

  it.effect("a test the engine fails too makes them the engine's failed calls: the node unhealthy", () => {
    const t = setup()
    return Effect.gen(function* () {
      const active = new ActiveCalls()
      yield* StallWatchdog.fork(active)
      for (let i = 0; i < 5; i++) endedLeg(active, http500)
      yield* TestClock.adjust(200)
      assert.isAtLeast(t.engine.requests, 1)
      assert.strictEqual(yield* problem, handoffReason)
      assert.strictEqual(yield* Effect.promise(() => streaks(t.registry)), 1)
    }).pipe(Effect.scoped, Effect.provide(t.layer))
  })

  it.effect(
    "a leg that failed after its first text counts as any call the engine failed; a completion ends the run",
    () => {
      const t = setup()
      return Effect.gen(function* () {
        const active = new ActiveCalls()
        yield* StallWatchdog.fork(active)
        t.engine.answer = "ok"
        for (let i = 0; i < 4; i++) endedLeg(active, http500)
        ended(active)
        endedLeg(active, http500)
        yield* TestClock.adjust(100)
        assert.strictEqual(t.engine.requests, 0, "4, a completion, 1: no run of five")
        t.engine.answer = "fail"
        for (let i = 0; i < 5; i++) endedLeg(active, http500, true)
        yield* TestClock.adjust(100)
        assert.strictEqual(yield* problem, handoffReason, "five that wrote text: the engine's, at once")
      }).pipe(Effect.scoped, Effect.provide(t.layer))
    }
  )

  it.effect("a test a busy engine refuses (503) concludes nothing: the legs are not counted", () => {
    const t = setup()
    return Effect.gen(function* () {
      const active = new ActiveCalls()
      yield* StallWatchdog.fork(active)
      t.engine.answer = "busy"
      for (let i = 0; i < 5; i++) endedLeg(active, http500)
      yield* TestClock.adjust(200)
      assert.strictEqual(t.engine.requests, 1)
      assert.isUndefined(yield* problem)
      assert.strictEqual(yield* Effect.promise(() => streaks(t.registry)), 0)
    }).pipe(Effect.scoped, Effect.provide(t.layer))
  })

  it.effect(
    "after a test forgave a run, the next run is tested engine.liveness_interval on: a broken engine is out then",
    () => {
      const t = setup({ liveness_interval: "300ms" })
      return Effect.gen(function* () {
        const active = new ActiveCalls()
        yield* StallWatchdog.fork(active)
        t.engine.answer = "ok"
        for (let i = 0; i < 5; i++) endedLeg(active, http500)
        yield* TestClock.adjust(100)
        assert.strictEqual(t.engine.requests, 1)
        // the engine breaks: every leg fails, and its test too
        t.engine.answer = "fail"
        for (let i = 0; i < 5; i++) endedLeg(active, http500)
        yield* TestClock.adjust(100)
        assert.strictEqual(t.engine.requests, 1, "not before liveness_interval")
        yield* TestClock.adjust(200)
        assert.isAtLeast(t.engine.requests, 2, "liveness_interval after the last test began, not stream_idle_timeout")
        // it failed too: the legs are the engine's (and the failing engine's own test follows at once)
        assert.strictEqual(yield* problem, handoffReason)
      }).pipe(Effect.scoped, Effect.provide(t.layer))
    }
  )

  it.effect(
    "legs from two prefill nodes, none completing between: this engine's KV path, unhealthy with no test",
    () => {
      const t = setup()
      return Effect.gen(function* () {
        const active = new ActiveCalls()
        yield* StallWatchdog.fork(active)
        t.engine.answer = "ok" // a test would pass: it reads no KV
        const busy = new Relay(1024)
        active.add(busy)
        for (let i = 0; i < 3; i++) endedLeg(active, http500, false, "10.0.0.5:5600")
        for (let i = 0; i < 2; i++) endedLeg(active, http500, false, "10.0.0.6:5600")
        yield* TestClock.adjust(100)
        assert.strictEqual(t.engine.requests, 0)
        assert.strictEqual(
          yield* problem,
          "engine failing calls: the last 5 calls failed in the engine with none completed (engine.failed_calls_unhealthy), " +
            "the last with: engine answered HTTP 500 (InternalServerError): simulated error (http500) (decode legs reading " +
            "from 2 prefill nodes, 10.0.0.5:5600, 10.0.0.6:5600, failed before their first token with no call completing: " +
            "this engine's KV transfer fails)"
        )
        active.delete(busy)
      }).pipe(Effect.scoped, Effect.provide(t.layer))
    }
  )
})
