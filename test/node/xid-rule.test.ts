// The operator's Xid rule (`[engine].ignore_xids`, `[engine].fault_xids`; NVIDIA k8s-device-plugin's
// DP_DISABLE_HEALTHCHECKS and DP_ENABLE_HEALTHCHECKS) reaches every decision on a GPU's Xids: the live GpuGate's fault
// view and its wait before a spawn (which make the node unhealthy, NodeStatus), and the engine's automatic GPUs
// (planFor, the first healthy ones).
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber, Layer, Result } from "effect"
import { TestClock } from "effect/testing"
import { decodeConfigObject, layerFromObject } from "../../src/layers/config/Config.ts"
import { planFor } from "../../src/layers/engine/EnginePlan.ts"
import * as GpuGateLive from "../../src/layers/engine/GpuGate.ts"
import { EnginePlan } from "../../src/services/engine/Engine.ts"
import { GpuGate } from "../../src/services/engine/GpuGate.ts"
import { gpuWith, Nvml } from "../../src/services/node/Nvml.ts"
import { testPlan } from "../../src/testing/EngineProcess.ts"
import * as MetricsTest from "../../src/testing/Metrics.ts"

/** GPU 0 reported Xid 92 (a fault by the table), GPU 1 Xid 13 (an application error: none); both idle. */
const host = [
  gpuWith({ index: 0, criticalXids: [{ xid: 92, events: 1 }] }),
  gpuWith({ index: 1, criticalXids: [{ xid: 13, events: 3 }] }),
  gpuWith({ index: 2 })
]

const engine = (xids: { readonly ignore_xids?: Array<number>; readonly fault_xids?: Array<number> }) => ({
  engine: { kind: "vllm", ...xids },
  models: { m: { hf_repo: "org/m" } }
})

/** The gate of an engine on `gpus`, over NVML's `host`, with the config's Xid rule. */
const gate = (gpus: ReadonlyArray<number>, xids: Parameters<typeof engine>[0]) => {
  const sampled = Effect.succeed(host)
  return GpuGateLive.layer.pipe(
    Layer.provide(MetricsTest.layerTest),
    Layer.provide(
      Layer.succeed(
        Nvml,
        Nvml.of({
          gpus: sampled,
          sampleNow: sampled,
          unavailable: Effect.succeed(undefined),
          clearXids: () => Effect.succeed([]),
          remembered: Effect.succeed([])
        })
      )
    ),
    Layer.provide(Layer.succeed(EnginePlan, testPlan({ gpus }))),
    Layer.provide(layerFromObject(engine(xids)))
  )
}

/** The gate's fault view once its first poll ran, and whether a start on its GPUs goes ahead at once. */
const verdict = Effect.gen(function* () {
  const g = yield* GpuGate
  const start = yield* Effect.forkChild(g.awaitFree)
  yield* TestClock.adjust("1 second")
  const started = start.pollUnsafe() !== undefined
  yield* Fiber.interrupt(start)
  return { fault: (yield* g.status).fault, started }
})

describe("the Xid rule from the config", () => {
  it.effect("ignore_xids: the gate lets a start on a GPU whose only fault Xid is ignored go ahead, unfaulted", () =>
    Effect.gen(function* () {
      assert.deepStrictEqual(yield* verdict, { fault: undefined, started: true })
    }).pipe(Effect.provide(gate([0], { ignore_xids: [92] })))
  )

  it.effect("without it, the same GPU is a fault: the node is unhealthy and the start waits", () =>
    Effect.gen(function* () {
      assert.deepStrictEqual(yield* verdict, {
        fault: "GPU 0 reported Xid 92 (high single-bit ECC error rate): it needs a GPU reset or a reboot",
        started: false
      })
    }).pipe(Effect.provide(gate([0], {})))
  )

  it.effect("fault_xids: an application Xid listed there makes its GPU a fault for the gate", () =>
    Effect.gen(function* () {
      assert.deepStrictEqual(yield* verdict, {
        fault: "GPU 1 reported Xid 13 (graphics engine exception): it needs a GPU reset or a reboot",
        started: false
      })
    }).pipe(Effect.provide(gate([1], { fault_xids: [13] })))
  )

  it("the engine's automatic GPUs are the healthy ones by the same rule", () => {
    const gpusOf = (xids: Parameters<typeof engine>[0]) => {
      const config = Result.getOrThrow(decodeConfigObject(engine(xids), undefined, {}))
      return Effect.runSync(planFor(config, host)).gpus
    }
    assert.deepStrictEqual(gpusOf({}), [1])
    assert.deepStrictEqual(gpusOf({ ignore_xids: [92] }), [0])
    assert.deepStrictEqual(gpusOf({ fault_xids: [13] }), [2])
  })
})
