// Shedding calls that can no longer meet their deadline, on a TestClock: the live Admission (a queued call that
// reaches its slot too late fails ShedAtSlot and the slot goes on; one too late to wait at all fails ShedAtArrival;
// no estimate or no deadline never sheds; the refusals in /metrics), then EngineLegs feeding it: each call's time
// from its slot to its first chunk (prefill: its answer) measured on the Clock, the caller's grpc-timeout and the
// leg's handoff_timeout as the deadline, and a shed call never reaching the engine.
import { assert, describe, it } from "@effect/vitest"
import { Cause, Context, Effect, Exit, Fiber, Layer, Scope } from "effect"
import { TestClock } from "effect/testing"
import { layerFromObject } from "../../src/layers/config/Config.ts"
import * as AdmissionLive from "../../src/layers/grpc/Admission.ts"
import * as EngineLegs from "../../src/layers/grpc/EngineLegs.ts"
import { Relay } from "../../src/layers/grpc/Relay.ts"
import { EngineClient } from "../../src/services/engine/EngineClient.ts"
import {
  Admission,
  type AdmissionService,
  type CallDeadline,
  ShedAtArrival,
  ShedAtSlot
} from "../../src/services/grpc/Admission.ts"
import type { LegPlan } from "../../src/services/grpc/Handoff.ts"
import { MIN_SAMPLES } from "../../src/services/grpc/ServiceTimes.ts"
import { Metrics } from "../../src/services/observability/Metrics.ts"
import { EngineClientRecorder, layerTest as engineTest, textChunk } from "../../src/testing/EngineClient.ts"
import { layerTest as metricsTest } from "../../src/testing/Metrics.ts"
import { hold, settle } from "../support/admission.ts"

const prefillWithin = (ms: number): CallDeadline => ({ ms, kind: "prefill", source: "agent.handoff_timeout = 1s" })
const learn = (a: AdmissionService, kind: "prefill" | "normal", ms: number, n = MIN_SAMPLES) => {
  for (let i = 0; i < n; i++) a.observe(kind, ms)
}
const queuedCount = (a: AdmissionService, n: number) => settle(Effect.map(a.queued, (q) => q === n))

describe("Admission sheds calls that cannot meet their deadline", () => {
  it.effect("at the slot: too late fails ShedAtSlot, not admitted; the slot goes to the next waiter", () =>
    Effect.gen(function* () {
      const a = AdmissionLive.make({ maxInflight: 1, maxQueue: 5 })
      learn(a, "prefill", 900)
      const holder = yield* hold(a)
      const late = yield* Effect.forkChild(Effect.flip(Effect.scoped(a.acquireWithin(prefillWithin(1000)))))
      const inTime = yield* Effect.forkChild(Effect.scoped(a.acquireWithin(prefillWithin(3000))))
      yield* queuedCount(a, 2)
      yield* TestClock.adjust("200 millis")
      yield* Scope.close(holder, Exit.void)
      const e = yield* Fiber.join(late)
      assert.instanceOf(e, ShedAtSlot)
      assert.deepInclude(e, { kind: "prefill", leftMs: 800, needMs: 900, queuedMs: 200 })
      assert.strictEqual(
        e.message,
        "~800 ms left of its deadline (agent.handoff_timeout = 1s) after 200 ms waiting for a slot (agent.max_inflight); prefill legs here need ~900 ms from a slot to their answer; not sent to the engine"
      )
      assert.deepStrictEqual(yield* Fiber.join(inTime), { queuedMs: 200, at: 200 })
      const s = yield* a.stats
      assert.deepInclude(s, { inflight: 0, queued: 0, shedAtSlot: 1, shedAtArrival: 0, admitted: 2 })
      assert.deepStrictEqual(s.needMs, { prefill: 900 })
    })
  )

  // Waking a waiter runs its fiber in the same call (Effect's Deferred resumes it at once): a shed waiter's exit
  // code that throws must find the ledger settled, not stop the release half-way (a slot lost for good, the drain's
  // awaitIdle waiting for ever).
  it.effect("a shed waiter whose exit code throws leaves the ledger settled and the slot free", () =>
    Effect.gen(function* () {
      const a = AdmissionLive.make({ maxInflight: 1, maxQueue: 5 })
      learn(a, "prefill", 500)
      const holder = yield* hold(a)
      const run = Effect.runCallbackWith(yield* Effect.context<never>())
      let exited = false
      run(Effect.scoped(a.acquireWithin(prefillWithin(600))), {
        onExit: () => {
          exited = true
          throw new Error("a bug in the call's exit code")
        }
      })
      yield* queuedCount(a, 1)
      yield* TestClock.adjust("200 millis")
      yield* Effect.exit(Scope.close(holder, Exit.void))
      assert.isTrue(exited)
      assert.deepInclude(yield* a.stats, { inflight: 0, queued: 0, shedAtSlot: 1 })
      yield* a.awaitIdle
    })
  )

  it.effect("never sheds without an estimate, nor a call without a deadline", () =>
    Effect.gen(function* () {
      const a = AdmissionLive.make({ maxInflight: 1, maxQueue: 5 })
      learn(a, "prefill", 900, MIN_SAMPLES - 1)
      const holder = yield* hold(a)
      const noEstimate = yield* Effect.forkChild(Effect.scoped(a.acquireWithin(prefillWithin(10))))
      yield* queuedCount(a, 1)
      yield* Scope.close(holder, Exit.void)
      assert.strictEqual((yield* Fiber.join(noEstimate)).queuedMs, 0)
      a.observe("prefill", 900)
      const holder2 = yield* hold(a)
      const noDeadline = yield* Effect.forkChild(Effect.scoped(a.acquire))
      yield* queuedCount(a, 1)
      yield* TestClock.adjust("10 seconds")
      yield* Scope.close(holder2, Exit.void)
      assert.strictEqual((yield* Fiber.join(noDeadline)).queuedMs, 10_000)
      assert.deepInclude(yield* a.stats, { shedAtSlot: 0, shedAtArrival: 0 })
    })
  )

  it.effect("at arrival: all slots busy and less time than a call needs, refused at once; a free slot takes it", () =>
    Effect.gen(function* () {
      const a = AdmissionLive.make({ maxInflight: 1, maxQueue: 5 })
      learn(a, "prefill", 900)
      const holder = yield* hold(a)
      const e = yield* Effect.flip(Effect.scoped(a.acquireWithin(prefillWithin(500))))
      assert.instanceOf(e, ShedAtArrival)
      // the advice to retry elsewhere is the status's (StatusMessage.ts asSent), not the error's
      assert.match(
        e.message,
        /^not queued: all 1 slots are busy .* ~500 ms left .* need ~900 ms .*not sent to the engine$/
      )
      assert.deepInclude(yield* a.stats, { inflight: 1, queued: 0, shedAtArrival: 1 })
      yield* Scope.close(holder, Exit.void)
      assert.deepStrictEqual(yield* Effect.scoped(a.acquireWithin(prefillWithin(500))), { queuedMs: 0, at: 0 })
    })
  )

  it.effect("/metrics: cgn_agent_admission_refusals_total by reason, 0 from the start", () =>
    Effect.gen(function* () {
      const a = yield* Admission
      const metrics = yield* Metrics
      const before = (yield* metrics.render).body
      for (const reason of ["overloaded", "draining", "deadline_at_arrival", "deadline_at_slot"])
        assert.include(before, `cgn_agent_admission_refusals_total{reason="${reason}"} 0`)
      learn(a, "prefill", 900)
      const holder = yield* hold(a)
      // two shed at arrival, one at the slot: each reason's own count, not another's
      yield* Effect.flip(Effect.scoped(a.acquireWithin(prefillWithin(100))))
      yield* Effect.flip(Effect.scoped(a.acquireWithin(prefillWithin(200))))
      const late = yield* Effect.forkChild(Effect.flip(Effect.scoped(a.acquireWithin(prefillWithin(1000)))))
      yield* queuedCount(a, 1)
      yield* Effect.flip(Effect.scoped(a.acquire)) // the queue (1) is full
      yield* TestClock.adjust("500 millis")
      yield* Scope.close(holder, Exit.void)
      assert.instanceOf(yield* Fiber.join(late), ShedAtSlot)
      const after = (yield* metrics.render).body
      for (const [reason, n] of [
        ["overloaded", 1],
        ["draining", 0],
        ["deadline_at_arrival", 2],
        ["deadline_at_slot", 1]
      ] as const)
        assert.include(after, `cgn_agent_admission_refusals_total{reason="${reason}"} ${n}`)
    }).pipe(
      Effect.provide(
        AdmissionLive.layer.pipe(
          Layer.provideMerge(metricsTest),
          Layer.provide(
            layerFromObject({ agent: { max_inflight: 1, max_queue: 1 }, models: { m: { hf_repo: "org/m" } } })
          )
        )
      )
    )
  )
})

describe("Admission's series on a registry that has it already", () => {
  it.effect("a second Admission layer on the same registry takes the series there, and /metrics still renders", () =>
    Effect.gen(function* () {
      const metrics = yield* Metrics
      const config = layerFromObject({ agent: { max_inflight: 1 }, models: { m: { hf_repo: "org/m" } } })
      // each build its own (Layer.build memoizes nothing across calls): the layer runs twice on one registry
      const first = Context.get(yield* Layer.build(AdmissionLive.layer.pipe(Layer.provide(config))), Admission)
      const second = Context.get(yield* Layer.build(AdmissionLive.layer.pipe(Layer.provide(config))), Admission)
      assert.notStrictEqual(first, second)
      const body = (yield* metrics.render).body
      assert.strictEqual(
        body.split("\n").filter((l) => l.startsWith("# TYPE cgn_agent_admission_refusals_total ")).length,
        1
      )
      assert.include(body, 'cgn_agent_admission_refusals_total{reason="overloaded"} 0')
    }).pipe(Effect.scoped, Effect.provide(metricsTest))
  )
})

// ---------------------------------------------------------------------------------------------------------
// EngineLegs: what it tells admission, and the deadline it gives

/** The scripted engine, each request taking `engineMs` on the Clock before it answers. */
const slowEngine = (engineMs: number) =>
  Layer.effect(
    EngineClient,
    Effect.map(EngineClient, (c) =>
      EngineClient.of({
        ...c,
        streamTo: (path, body, opts, sink) => Effect.andThen(Effect.sleep(engineMs), c.streamTo(path, body, opts, sink))
      })
    )
  ).pipe(
    Layer.provideMerge(
      engineTest({
        chunks: [textChunk("a"), textChunk("b", "length")],
        completion: {
          object: "text_completion",
          choices: [textChunk("", "length")],
          kv_transfer_params: {
            do_remote_prefill: true,
            remote_block_ids: [1],
            remote_engine_id: "e",
            remote_host: "h",
            remote_port: 1
          }
        }
      })
    )
  )

const legsLayer = (role: "both" | "prefill", engineMs = 300) => {
  const config = layerFromObject({
    agent: { role, max_inflight: 1, max_queue: 4, handoff_timeout: "1s" },
    engine: role === "prefill" ? { kind: "vllm", kv_offload: "nixl" } : { kind: "vllm" },
    models: { m: { hf_repo: "org/m" } }
  })
  return Layer.mergeAll(slowEngine(engineMs), AdmissionLive.layer).pipe(Layer.provideMerge(config))
}

const plan = { path: "/v1/completions", body: { prompt: "p" } } as const
const normal: LegPlan = { _tag: "Normal", body: plan.body }
const prefill: LegPlan = { _tag: "Prefill", protocol: "kv_transfer_params", body: plan.body }

describe("EngineLegs feeds admission and gives it the call's deadline", () => {
  it.effect("normal calls: first chunk timed on the Clock; the caller's deadline sheds one, never sent", () =>
    Effect.gen(function* () {
      const run = yield* EngineLegs.make()
      const a = yield* Admission
      const call = (callerMs?: number) =>
        Effect.forkChild(run(new Relay(1024), plan, normal, { requestId: "r" }, callerMs))
      for (let i = 0; i < MIN_SAMPLES; i++) {
        const f = yield* call()
        yield* TestClock.adjust("300 millis")
        yield* Fiber.join(f)
      }
      assert.deepStrictEqual((yield* a.stats).needMs, { normal: 300 })
      const first = yield* call()
      yield* settle(Effect.map(a.inflight, (n) => n === 1))
      const late = yield* call(500)
      yield* queuedCount(a, 1)
      const inTime = yield* call(1000)
      yield* queuedCount(a, 2)
      yield* TestClock.adjust("300 millis")
      const e = yield* Effect.flip(Fiber.join(late))
      assert.instanceOf(e, ShedAtSlot)
      assert.match(e.message, /~200 ms left of its deadline \(the caller's deadline\).*need ~300 ms .*first token/)
      yield* TestClock.adjust("300 millis")
      yield* Fiber.join(first)
      yield* Fiber.join(inTime)
      const requests = yield* (yield* EngineClientRecorder).requests
      assert.strictEqual(requests.length, MIN_SAMPLES + 2, "the shed call made no engine request")
    }).pipe(Effect.provide(legsLayer("both")))
  )

  it.effect(
    "normal calls without a grpc-timeout are never shed, however long they wait (handoff_timeout is the P/D legs')",
    () =>
      Effect.gen(function* () {
        const run = yield* EngineLegs.make()
        const a = yield* Admission
        const call = () => Effect.forkChild(run(new Relay(1024), plan, normal, { requestId: "r" }))
        for (let i = 0; i < MIN_SAMPLES; i++) {
          const f = yield* call()
          yield* TestClock.adjust("300 millis")
          yield* Fiber.join(f)
        }
        const first = yield* call()
        yield* settle(Effect.map(a.inflight, (n) => n === 1))
        const waiting = []
        for (let i = 1; i <= 4; i++) {
          waiting.push(yield* call())
          yield* queuedCount(a, i)
        }
        // The last one reaches its slot after 1.2 s waiting: past handoff_timeout (1 s) less its need (300 ms)
        for (let i = 0; i < 5; i++) yield* TestClock.adjust("300 millis")
        for (const f of [first, ...waiting]) yield* Fiber.join(f)
        assert.deepInclude(yield* a.stats, { shedAtSlot: 0, shedAtArrival: 0 })
      }).pipe(Effect.provide(legsLayer("both")))
  )

  it.effect("prefill legs: the answer timed; the deadline is the nearer of handoff_timeout and the caller's", () =>
    Effect.gen(function* () {
      const run = yield* EngineLegs.make()
      const a = yield* Admission
      const leg = (callerMs: number) =>
        Effect.forkChild(run(new Relay(1024), plan, prefill, { requestId: "r" }, callerMs))
      for (let i = 0; i < MIN_SAMPLES; i++) {
        const f = yield* leg(60_000)
        yield* TestClock.adjust("300 millis")
        yield* Fiber.join(f)
      }
      assert.deepStrictEqual((yield* a.stats).needMs, { prefill: 300 })
      // All at once, 300 ms each, one slot: the holder 0-300; w0 (the caller's 500 ms) reaches the slot at 300
      // with 200 left: shed; w1 and w2 (handoff_timeout 1s) run 300-600 and 600-900; w3 reaches it at 900 with
      // 100 ms left: shed, where before it would have held the engine until its 1 s deadline aborted it.
      const holder = yield* leg(60_000)
      yield* settle(Effect.map(a.inflight, (n) => n === 1))
      const waiters = []
      for (const callerMs of [500, 60_000, 60_000, 60_000]) {
        waiters.push(yield* leg(callerMs))
        yield* queuedCount(a, waiters.length)
      }
      for (let i = 0; i < 3; i++) yield* TestClock.adjust("300 millis")
      yield* Fiber.join(holder)
      const [w0, w1, w2, w3] = yield* Effect.forEach(waiters, (w) => Effect.exit(Fiber.join(w)))
      assert.isTrue(Exit.isSuccess(w1!) && Exit.isSuccess(w2!))
      const shed = [w0, w3].map((e) => (Exit.isFailure(e!) ? Cause.squash(e.cause) : e))
      assert.instanceOf(shed[0], ShedAtSlot)
      assert.match((shed[0] as ShedAtSlot).message, /^~200 ms left of its deadline \(the caller's deadline\)/)
      assert.instanceOf(shed[1], ShedAtSlot)
      assert.match((shed[1] as ShedAtSlot).message, /^~100 ms left of its deadline \(agent.handoff_timeout = 1s\)/)
      const requests = yield* (yield* EngineClientRecorder).requests
      assert.strictEqual(requests.length, MIN_SAMPLES + 3, "the shed legs made no engine request")
      assert.deepInclude(yield* a.stats, { shedAtSlot: 2, inflight: 0, queued: 0 })
    }).pipe(Effect.provide(legsLayer("prefill")))
  )

  it.effect("legs cut off by their deadline teach it nothing: their time held would hold the estimate down", () =>
    Effect.gen(function* () {
      const run = yield* EngineLegs.make()
      const a = yield* Admission
      const leg = () => Effect.forkChild(Effect.flip(run(new Relay(1024), plan, prefill, { requestId: "r" })))
      // The engine takes 5 s, handoff_timeout is 1 s: every leg is aborted at its deadline, none gets its answer.
      for (let i = 0; i < MIN_SAMPLES; i++) {
        const f = yield* leg()
        yield* TestClock.adjust("1 second")
        assert.strictEqual((yield* Fiber.join(f))._tag, "LegDeadline")
      }
      assert.deepStrictEqual((yield* a.stats).needMs, {})
      // So nothing is shed: a leg queued behind one that holds the slot until its deadline gets the slot.
      const holder = yield* leg()
      yield* settle(Effect.map(a.inflight, (n) => n === 1))
      yield* TestClock.adjust("100 millis")
      const next = yield* leg()
      yield* queuedCount(a, 1)
      yield* TestClock.adjust("900 millis")
      assert.strictEqual((yield* Fiber.join(holder))._tag, "LegDeadline")
      yield* settle(Effect.map(a.inflight, (n) => n === 1))
      yield* TestClock.adjust("100 millis")
      const e = yield* Fiber.join(next)
      assert.deepInclude(e, { _tag: "LegDeadline", queued: false })
      assert.deepInclude(yield* a.stats, { shedAtSlot: 0, shedAtArrival: 0 })
    }).pipe(Effect.provide(legsLayer("prefill", 5000)))
  )
})
