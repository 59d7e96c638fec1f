// The calls in flight cut the moment the agent begins ending their engine run (layers/grpc/EngineCut.ts cutOnRunEnd),
// over relays of the test's own making and the scripted supervisor: which states cut (services/grpc/EngineCut.ts
// agentCut: the agent's own endings, not an engine that exited by itself), that a call is ended as soon as the state
// is published (its relay's interrupt, which aborts the engine request, is the event awaited: no sleeps), that a call
// slipping in while the run ends is cut too, that a call the drain or the stall watchdog ended keeps its words, and
// that a proxied server's calls are never cut.
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect } from "effect"
import { expect, it as plain } from "vitest"
import { ActiveCalls } from "../../src/layers/grpc/ActiveCalls.ts"
import { cutOnRunEnd } from "../../src/layers/grpc/EngineCut.ts"
import { Relay } from "../../src/layers/grpc/Relay.ts"
import { ADMIN_RESTART_REASON } from "../../src/services/admin/EngineRestart.ts"
import { type EngineState, RunEndWords, type UnhealthyEnding } from "../../src/services/engine/EngineProcess.ts"
import { State } from "../../src/services/engine/EngineState.ts"
import { EngineRunEnded, StreamAborted } from "../../src/services/grpc/CallErrors.ts"
import { agentCut } from "../../src/services/grpc/EngineCut.ts"
import { toGrpcFailure } from "../../src/services/grpc/GrpcStatus.ts"
import { asSent } from "../../src/services/grpc/StatusMessage.ts"
import { EngineProcessControl, layerTest, testExit, testPlan } from "../../src/testing/EngineProcess.ts"

const OPERATOR = "the engine is being restarted (POST /engine/restart by an operator)"
const OPERATOR_RESTART: UnhealthyEnding = { kind: "requested", source: "admin", reason: ADMIN_RESTART_REASON }
/** A Ready run being torn down, its reason worded as the supervisor words it. */
const tornDown = (ending: UnhealthyEnding): EngineState =>
  State.Unhealthy({ reason: RunEndWords.ending(ending), since: 0, run: 0, ending })
const requested = tornDown(OPERATOR_RESTART)
const ready = State.Ready({ since: 0, run: 0 })

describe("agentCut: the states in which the agent itself ends the run", () => {
  const exited = tornDown({ kind: "exited", status: "exit code 137" })
  const cases: ReadonlyArray<[string, EngineState, ReadonlyArray<ReturnType<typeof testExit>>, unknown]> = [
    ["Ready", ready, [], undefined],
    ["an operator's restart", requested, [], { by: "restart", why: OPERATOR }],
    [
      "failed liveness",
      State.Unhealthy({ reason: "3 liveness probes failed in a row, last: timeout", since: 0, run: 0 }),
      [],
      { by: "restart", why: "the engine is being restarted (3 liveness probes failed in a row, last: timeout)" }
    ],
    ["the engine exited by itself: its sockets are closed already", exited, [], undefined],
    ["restarting after an exit", State.Restarting({ attempt: 1, nextAt: 0, lastExit: testExit(0) }), [], undefined],
    [
      "the next run starting after an operator's restart",
      State.Starting({ phase: "loading", since: 0, run: 1 }),
      [testExit(0, OPERATOR_RESTART)],
      { by: "restart", why: OPERATOR }
    ],
    ["the first run starting", State.Starting({ phase: "loading", since: 0, run: 0 }), [], undefined],
    ["stopping", State.Stopping({ since: 0 }), [], { by: "stop", why: "the agent is stopping the engine" }],
    ["stopped", State.Stopped({ lastExit: undefined }), [], { by: "stop", why: "the agent stopped the engine" }]
  ]
  plain.each(cases)("%s", (_, state, exits, cut) => {
    const e = agentCut(state, exits)
    expect(e === undefined ? undefined : { by: e.by, why: e.why }).toEqual(cut)
    if (e !== undefined) expect(e.engine).toBeUndefined()
  })

  plain("its status: UNAVAILABLE, the agent's, why and that the request was aborted, no engine trailers", () => {
    const f = toGrpcFailure(new EngineRunEnded({ by: "restart", why: OPERATOR }))
    assert.deepStrictEqual(f, {
      code: 14,
      message: `${OPERATOR}: the engine request was aborted`,
      trailers: { "cgn-error-source": "agent", "cgn-reason": "engine_run_ended" },
      retryElsewhere: true,
      advised: true
    })
    // as a call that sent nothing sends it (README quotes it)
    assert.strictEqual(asSent(f, false).message, `${OPERATOR}: the engine request was aborted; retry on another node`)
  })
})

/** A relay whose engine fiber is "running": `interrupted` completes when the cut interrupts it. */
const streaming = Effect.gen(function* () {
  const relay = new Relay(1024)
  relay.admit()
  relay.streamRequested(0)
  const interrupted = yield* Deferred.make<void>()
  relay.interrupt = () => Deferred.doneUnsafe(interrupted, Effect.void)
  return { relay, interrupted }
})

const why = (relay: Relay): string | undefined =>
  relay.failure instanceof EngineRunEnded ? relay.failure.why : relay.failure?._tag

describe("cutOnRunEnd: the calls in flight end as the ending is published", () => {
  it.effect("an operator's restart published: every call in flight is cut with why, at once", () =>
    Effect.gen(function* () {
      const control = yield* EngineProcessControl
      const active = new ActiveCalls()
      yield* cutOnRunEnd(active)
      const calls = [yield* streaming, yield* streaming]
      for (const c of calls) active.add(c.relay)
      assert.deepStrictEqual(
        calls.map((c) => why(c.relay)),
        [undefined, undefined],
        "Ready: nothing cut"
      )
      yield* control.set(requested)
      for (const c of calls) yield* Deferred.await(c.interrupted)
      assert.deepStrictEqual(
        calls.map((c) => why(c.relay)),
        [OPERATOR, OPERATOR]
      )
    }).pipe(Effect.scoped, Effect.provide(layerTest({ initial: ready })))
  )

  it.effect("a call that slips in while the run ends is cut as it is added", () =>
    Effect.gen(function* () {
      const control = yield* EngineProcessControl
      const active = new ActiveCalls()
      yield* cutOnRunEnd(active)
      const first = yield* streaming
      active.add(first.relay)
      yield* control.set(requested)
      yield* Deferred.await(first.interrupted)
      const late = yield* streaming
      active.add(late.relay)
      assert.strictEqual(why(late.relay), OPERATOR)
      assert.isTrue(Deferred.isDoneUnsafe(late.interrupted))
    }).pipe(Effect.scoped, Effect.provide(layerTest({ initial: ready })))
  )

  it.effect("the cut lifted (a run Ready again: agentCut is undefined there): a call added is relayed", () =>
    Effect.gen(function* () {
      const active = new ActiveCalls()
      active.cutWhile(new EngineRunEnded({ by: "restart", why: OPERATOR }))
      active.cutWhile(agentCut(State.Ready({ since: 1, run: 1 }), []))
      const next = yield* streaming
      active.add(next.relay)
      assert.isUndefined(why(next.relay))
      assert.isFalse(Deferred.isDoneUnsafe(next.interrupted))
    })
  )

  it.effect("a call the drain already ended keeps its words when the engine's stop reaches it", () =>
    Effect.gen(function* () {
      const control = yield* EngineProcessControl
      const active = new ActiveCalls()
      yield* cutOnRunEnd(active)
      const drained = yield* streaming
      const other = yield* streaming
      active.add(drained.relay)
      active.add(other.relay)
      drained.relay.abort(new StreamAborted({ reason: "node drained before the stream finished" }))
      yield* control.set(State.Stopping({ since: 0 }))
      yield* Deferred.await(other.interrupted)
      assert.strictEqual(why(drained.relay), "StreamAborted")
      assert.strictEqual(why(other.relay), "the agent is stopping the engine")
    }).pipe(Effect.scoped, Effect.provide(layerTest({ initial: ready })))
  )

  it.effect(
    "an engine that exited by itself: nothing cut (its calls keep the transport's words after the exit's)",
    () =>
      Effect.gen(function* () {
        const control = yield* EngineProcessControl
        const active = new ActiveCalls()
        yield* cutOnRunEnd(active)
        const call = yield* streaming
        active.add(call.relay)
        yield* control.set(tornDown({ kind: "exited", status: "signal SIGKILL" }))
        // then a state that cuts: the cutter has seen the one before it when this one reaches the call
        yield* control.set(State.Stopping({ since: 0 }))
        yield* Deferred.await(call.interrupted)
        assert.strictEqual(why(call.relay), "the agent is stopping the engine")
      }).pipe(Effect.scoped, Effect.provide(layerTest({ initial: ready })))
  )

  it.effect("the next run Starting after an operator's restart cuts too: the previous run's exit says why", () =>
    Effect.gen(function* () {
      const control = yield* EngineProcessControl
      const active = new ActiveCalls()
      yield* cutOnRunEnd(active)
      const call = yield* streaming
      active.add(call.relay)
      yield* control.recordExit(testExit(0, OPERATOR_RESTART))
      yield* control.set(State.Starting({ phase: "loading", since: 0, run: 1 }))
      // then a state that cuts with other words: the cutter has seen Starting when this one reaches the call
      yield* control.set(State.Stopping({ since: 0 }))
      yield* Deferred.await(call.interrupted)
      assert.strictEqual(why(call.relay), OPERATOR)
    }).pipe(Effect.scoped, Effect.provide(layerTest({ initial: ready })))
  )

  it.effect("a proxied server (openai_compat): its states are not followed, its calls never cut", () =>
    Effect.gen(function* () {
      const control = yield* EngineProcessControl
      const active = new ActiveCalls()
      const before = yield* control.subscriptions
      yield* cutOnRunEnd(active)
      assert.strictEqual(yield* control.subscriptions, before)
      const call = yield* streaming
      active.add(call.relay)
      yield* control.set(requested)
      active.add((yield* streaming).relay)
      assert.isUndefined(why(call.relay))
    }).pipe(Effect.scoped, Effect.provide(layerTest({ initial: ready, plan: testPlan({ spawns: false }) })))
  )
})
