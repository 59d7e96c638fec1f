// A prefill leg past [agent].handoff_timeout (layers/grpc/EngineLegs.ts) on a TestClock, over an engine that never
// answers it: the engine's own stall (EngineStall, "prefill") only when the engine alone can be blamed. vLLM answers
// a prefill leg without its decode peer; a leg the engine held at least half the deadline, with no call completed
// meanwhile, is a stall. Not one that spent most of the deadline waiting for admission, not while other calls
// complete (a busy engine), and never on SGLang, whose prefill waits for the decode peer.
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber, Layer } from "effect"
import { TestClock } from "effect/testing"
import { layerFromObject } from "../../src/layers/config/Config.ts"
import * as EngineStallLive from "../../src/layers/engine/EngineStall.ts"
import { ActiveCalls } from "../../src/layers/grpc/ActiveCalls.ts"
import * as EngineLegs from "../../src/layers/grpc/EngineLegs.ts"
import { Relay } from "../../src/layers/grpc/Relay.ts"
import { EngineClient } from "../../src/services/engine/EngineClient.ts"
import { EngineStall } from "../../src/services/engine/EngineStall.ts"
import { Admission } from "../../src/services/grpc/Admission.ts"
import type { LegPlan } from "../../src/services/grpc/Handoff.ts"
import * as EngineTest from "../../src/testing/EngineProcess.ts"

const TIMEOUT_MS = 10_000

const layerFor = (kind: "vllm" | "sglang") => {
  const config = layerFromObject({
    models: { m: { hf_repo: "org/m" } },
    engine: { kind, kv_offload: kind === "vllm" ? "nixl" : "none" },
    agent: { role: "prefill", handoff_timeout: `${TIMEOUT_MS}ms` }
  })
  // an engine that takes every request and never answers
  const client = EngineClient.of({
    streamTo: () => Effect.never,
    load: Effect.succeed({ running: undefined, waiting: undefined, kvUsage: undefined })
  })
  return Layer.mergeAll(
    config,
    Layer.succeed(EngineClient, client),
    EngineStallLive.layer.pipe(Layer.provide(EngineTest.layerTest()), Layer.provide(config))
  )
}

const vllmLeg: LegPlan = { _tag: "VllmPrefill", body: { prompt: "p", max_tokens: 1 } }
const sglangLeg: LegPlan = { _tag: "SglangLeg", leg: "prefill", body: { prompt: "p", max_tokens: 1 } }

/** An admission that hands a slot `queuedMs` after it is asked (the leg waited behind busy ones that long). */
const admissionAfter = (queuedMs: number) =>
  Admission.of({
    acquire: Effect.as(Effect.sleep(queuedMs), { queuedMs }),
    inflight: Effect.succeed(0),
    queued: Effect.succeed(0),
    stats: Effect.die("unused"),
    close: () => Effect.void,
    awaitIdle: Effect.void
  })

/**
 * Runs one leg to its deadline, over an admission that takes `queuedMs` of it (none: admitted at once); `during`
 * runs while the engine has the leg.
 */
const legPastDeadline = (
  leg: LegPlan,
  options: { readonly queuedMs?: number; readonly during?: (active: ActiveCalls) => void } = {}
) =>
  Effect.gen(function* () {
    const active = new ActiveCalls()
    const runLeg = yield* EngineLegs.make(active).pipe(
      options.queuedMs === undefined ? (e) => e : Effect.provideService(Admission, admissionAfter(options.queuedMs))
    )
    const relay = new Relay(1024)
    const fiber = yield* Effect.forkChild(Effect.exit(runLeg(relay, { path: "/v1/completions", body: {} }, leg, {})))
    yield* TestClock.adjust((options.queuedMs ?? 0) + 1)
    options.during?.(active)
    yield* TestClock.adjust(TIMEOUT_MS)
    const exit = yield* Fiber.join(fiber)
    return { exit, stall: yield* Effect.flatMap(EngineStall, (s) => s.state) }
  })

describe("a prefill leg past handoff_timeout", () => {
  it.effect("vLLM, held by the engine the whole deadline with no call completed: a prefill stall", () =>
    Effect.gen(function* () {
      const { exit, stall } = yield* legPastDeadline(vllmLeg)
      assert.match(JSON.stringify(exit), /LegDeadline/)
      assert.strictEqual(stall.stalledPrefills, 1)
      assert.strictEqual(stall.stalledStreams, 0)
    }).pipe(Effect.scoped, Effect.provide(layerFor("vllm")))
  )

  it.effect("vLLM, while another call completed: busy, not wedged", () =>
    Effect.gen(function* () {
      const { exit, stall } = yield* legPastDeadline(vllmLeg, {
        during: (active) => {
          const other = new Relay(1024)
          active.add(other)
          other.completed = true
          active.delete(other)
        }
      })
      assert.match(JSON.stringify(exit), /LegDeadline/)
      assert.strictEqual(stall.stalledPrefills, 0)
    }).pipe(Effect.scoped, Effect.provide(layerFor("vllm")))
  )

  it.effect(
    "vLLM, held by the engine for less than half the deadline (the rest queued for admission): not a stall",
    () =>
      Effect.gen(function* () {
        const { exit, stall } = yield* legPastDeadline(vllmLeg, { queuedMs: TIMEOUT_MS * 0.6 })
        assert.match(JSON.stringify(exit), /LegDeadline/)
        assert.strictEqual(stall.stalledPrefills, 0)
      }).pipe(Effect.scoped, Effect.provide(layerFor("vllm")))
  )

  it.effect("vLLM, queued for less than half the deadline, then held with no answer: a stall", () =>
    Effect.gen(function* () {
      const { stall } = yield* legPastDeadline(vllmLeg, { queuedMs: TIMEOUT_MS * 0.4 })
      assert.strictEqual(stall.stalledPrefills, 1)
    }).pipe(Effect.scoped, Effect.provide(layerFor("vllm")))
  )

  it.effect("SGLang: never (its prefill waits for the decode peer)", () =>
    Effect.gen(function* () {
      const { exit, stall } = yield* legPastDeadline(sglangLeg)
      assert.match(JSON.stringify(exit), /LegDeadline/)
      assert.strictEqual(stall.stalledPrefills, 0)
    }).pipe(Effect.scoped, Effect.provide(layerFor("sglang")))
  )
})
