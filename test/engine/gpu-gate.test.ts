// The live GpuGate (layers/engine/GpuGate.ts) on a TestClock with a scripted NVML: what a wait for the engine's
// GPUs publishes (status, the node's problem, cgn_agent_engine_gpu_wait) is withdrawn when the wait ends, also
// when a stop interrupts it (the supervisor's stop interrupts its loop, and with it the wait before a spawn).
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber, Layer, Logger } from "effect"
import { TestClock } from "effect/testing"
import type { Gpu } from "../../src/gen/cgn/agent/v1/agent.ts"
import { layerFromObject } from "../../src/layers/config/Config.ts"
import * as GpuGateLive from "../../src/layers/engine/GpuGate.ts"
import { pgidOf } from "../../src/layers/engine/GpuGate.ts"
import { EnginePlan } from "../../src/services/engine/Engine.ts"
import { GpuGate, gateProblem } from "../../src/services/engine/GpuGate.ts"
import { gpuWith, Nvml } from "../../src/services/node/Nvml.ts"
import { Metrics } from "../../src/services/observability/Metrics.ts"
import { testPlan } from "../../src/testing/EngineProcess.ts"
import * as MetricsTest from "../../src/testing/Metrics.ts"

const GiB = 2 ** 30

/** GPU 0 with 75 GiB held by a process that is not the engine's: the gate waits while NVML says so. */
const held = [gpuWith({ index: 0, memoryUsedBytes: 75 * GiB, processes: [{ pid: 4242, usedMemoryBytes: 75 * GiB }] })]

/** The gate over a scripted NVML: `nvml.down` set says NVML cannot be opened (its sample is then empty). */
const nvml = { down: undefined as string | undefined }
const sampled = Effect.sync(() => (nvml.down === undefined ? held : []))
const gateLayer = GpuGateLive.layer.pipe(
  Layer.provideMerge(MetricsTest.layerTest),
  Layer.provide(
    Layer.succeed(
      Nvml,
      Nvml.of({
        gpus: sampled,
        sampleNow: sampled,
        unavailable: Effect.sync(() => nvml.down),
        clearXids: () => Effect.succeed([]),
        remembered: Effect.succeed([])
      })
    )
  ),
  Layer.provide(Layer.succeed(EnginePlan, testPlan({ gpus: [0] }))),
  Layer.provide(
    layerFromObject({ engine: { kind: "vllm", gpu_free_timeout: "2s" }, models: { m: { hf_repo: "org/m" } } })
  )
)

/** A scripted NVML whose sample the test sets, and which can be down (its sample then empty). */
const scripted = { down: undefined as string | undefined, gpus: [] as Array<Gpu> }
const scriptedSample = Effect.sync(() => (scripted.down === undefined ? scripted.gpus : []))
const scriptedGate = GpuGateLive.layer.pipe(
  Layer.provideMerge(MetricsTest.layerTest),
  Layer.provide(
    Layer.succeed(
      Nvml,
      Nvml.of({
        gpus: scriptedSample,
        sampleNow: scriptedSample,
        unavailable: Effect.sync(() => scripted.down),
        clearXids: () => Effect.succeed([]),
        remembered: Effect.succeed([])
      })
    )
  ),
  Layer.provide(Layer.succeed(EnginePlan, testPlan({ gpus: [0] }))),
  Layer.provide(layerFromObject({ engine: { kind: "vllm" }, models: { m: { hf_repo: "org/m" } } }))
)

/** NVML down as the agent starts, with the Xids this boot's record keeps; `models.m.gpus` as given. */
const restarted = {
  down: "NVML call stuck" as string | undefined,
  gpus: [] as Array<Gpu>,
  remembered: [{ uuid: "GPU-dead", xids: [{ xid: 79, events: 1 }] }]
}
const restartedSample = Effect.sync(() => (restarted.down === undefined ? restarted.gpus : []))
const restartedGate = (gpus: ReadonlyArray<number | string>, planGpus?: Array<number>) =>
  GpuGateLive.layer.pipe(
    Layer.provideMerge(MetricsTest.layerTest),
    Layer.provide(
      Layer.succeed(
        Nvml,
        Nvml.of({
          gpus: restartedSample,
          sampleNow: restartedSample,
          unavailable: Effect.sync(() => restarted.down),
          clearXids: () => Effect.succeed([]),
          remembered: Effect.sync(() => restarted.remembered)
        })
      )
    ),
    Layer.provide(Layer.succeed(EnginePlan, testPlan(planGpus === undefined ? {} : { gpus: planGpus }))),
    Layer.provide(layerFromObject({ engine: { kind: "vllm" }, models: { m: { hf_repo: "org/m", gpus } } }))
  )
const resetRestarted = Effect.sync(() => {
  restarted.down = "NVML call stuck"
  restarted.gpus = []
})

const gaugeLine = Effect.gen(function* () {
  const { body } = yield* (yield* Metrics).render
  return body.split("\n").find((l) => l.startsWith("cgn_agent_engine_gpu_wait "))
})

describe("GpuGate", () => {
  it.effect("a stop during the wait for GPUs withdraws the wait: status, the node's problem and the gauge", () =>
    Effect.gen(function* () {
      const gate = yield* GpuGate
      const waiting = yield* Effect.forkChild(gate.awaitFree)
      // past gpu_free_timeout: the wait is overdue, which makes the node unhealthy
      yield* TestClock.adjust("3 seconds")
      const during = yield* gate.status
      assert.isTrue(during.waiting?.overdue, "waiting, overdue")
      assert.match(gateProblem(during) ?? "", /^waiting for GPU memory: /)
      assert.strictEqual(yield* gaugeLine, "cgn_agent_engine_gpu_wait 1")

      yield* Fiber.interrupt(waiting)

      const after = yield* gate.status
      assert.isUndefined(after.waiting, "the wait is withdrawn")
      assert.isUndefined(gateProblem(after), "the node is not left unhealthy for a start that is not coming")
      assert.strictEqual(yield* gaugeLine, "cgn_agent_engine_gpu_wait 0")
    }).pipe(Effect.provide(gateLayer))
  )

  it.effect("NVML down (no driver yet, or gone): the gate neither holds the engine nor faults the node", () =>
    Effect.gen(function* () {
      const gate = yield* GpuGate
      // Returns at once: with NVML up, these GPUs (75 GiB held by another process) would be waited for.
      yield* gate.awaitFree
      yield* TestClock.adjust("3 seconds")
      const st = yield* gate.status
      assert.isUndefined(st.waiting)
      assert.isUndefined(st.fault, "no GPU missing from an NVML that is not there")
      assert.isUndefined(gateProblem(st))

      // NVML opened later (the driver installed after the agent started): the gate works from then on.
      nvml.down = undefined
      const waiting = yield* Effect.forkChild(gate.awaitFree)
      yield* TestClock.adjust("1 second")
      assert.match((yield* gate.status).waiting?.reason ?? "", /GPU 0/)
      yield* Fiber.interrupt(waiting)
    }).pipe(
      Effect.provide(gateLayer),
      // down before the gate is built, as on a host whose driver is not loaded yet when the agent starts
      (test) =>
        Effect.andThen(
          Effect.sync(() => {
            nvml.down = "nvmlInit_v2 failed: NVML_ERROR_DRIVER_NOT_LOADED (9)"
          }),
          test
        ),
      Effect.ensuring(
        Effect.sync(() => {
          nvml.down = undefined
        })
      )
    )
  )

  it.effect(
    "a fault NVML reported stands while NVML stops answering (a GPU off the bus hangs it): no start on that GPU",
    () =>
      Effect.gen(function* () {
        const gate = yield* GpuGate
        scripted.gpus = [gpuWith({ index: 0, criticalXids: [{ xid: 79, events: 1 }] })]
        yield* TestClock.adjust("1 second")
        assert.match((yield* gate.status).fault ?? "", /Xid 79/)
        scripted.down = "NVML call stuck"
        yield* TestClock.adjust("3 seconds")
        assert.match((yield* gate.status).fault ?? "", /Xid 79/, "not cleared by NVML's silence")
        // A start (a restart, the next run) waits on it rather than going onto the GPU.
        const waiting = yield* Effect.forkChild(gate.awaitFree)
        yield* TestClock.adjust("2 seconds")
        assert.match((yield* gate.status).waiting?.reason ?? "", /Xid 79.*NVML is not answering/)
        // NVML back, the GPU reset: the fault clears and the start goes on.
        scripted.down = undefined
        scripted.gpus = [gpuWith({ index: 0 })]
        yield* TestClock.adjust("2 seconds")
        yield* Fiber.join(waiting)
        assert.isUndefined((yield* gate.status).fault)
      }).pipe(
        Effect.provide(scriptedGate),
        Effect.ensuring(
          Effect.sync(() => {
            scripted.down = undefined
            scripted.gpus = []
          })
        )
      )
  )

  it.effect(
    "an agent started while NVML does not answer holds the engine on a fault Xid this boot's record keeps (GPUs by index)",
    () =>
      Effect.gen(function* () {
        const gate = yield* GpuGate
        // the very first start waits: the fault is known before it, not a poll later
        assert.match((yield* gate.status).fault ?? "", /GPU-dead reported Xid 79.*earlier in this boot.*names no UUIDs/)
        const waiting = yield* Effect.forkChild(gate.awaitFree)
        yield* TestClock.adjust("3 seconds")
        assert.isUndefined(waiting.pollUnsafe(), "the start is held")
        assert.match(gateProblem(yield* gate.status) ?? "", /Xid 79/)
        // NVML answers, the GPU reset and cleared: its sample judges from then on, the start goes on
        restarted.down = undefined
        restarted.gpus = [gpuWith({ index: 0, uuid: "GPU-dead" })]
        yield* TestClock.adjust("2 seconds")
        yield* Fiber.join(waiting)
        assert.isUndefined((yield* gate.status).fault)
      }).pipe(Effect.provide(restartedGate([0], [0])), Effect.ensuring(resetRestarted))
  )

  it.effect("... not on a fault of a GPU the config does not name, when it names its GPUs by UUID", () =>
    Effect.gen(function* () {
      const gate = yield* GpuGate
      yield* gate.awaitFree
      assert.isUndefined((yield* gate.status).fault)
    }).pipe(Effect.provide(restartedGate(["GPU-good"])), Effect.ensuring(resetRestarted))
  )

  it.effect(
    "GPUs by UUID not resolved at start (NVML silent then): once NVML answers, a fault on a named GPU holds the start",
    () =>
      Effect.gen(function* () {
        const gate = yield* GpuGate
        const fault = (yield* gate.status).fault ?? ""
        assert.match(fault, /GPU-dead reported Xid 79/)
        assert.notMatch(fault, /names no UUIDs/)
        const waiting = yield* Effect.forkChild(gate.awaitFree)
        restarted.down = undefined
        restarted.gpus = [gpuWith({ index: 3, uuid: "GPU-dead", criticalXids: [{ xid: 48, events: 2 }] })]
        yield* TestClock.adjust("2 seconds")
        assert.match((yield* gate.status).fault ?? "", /GPU 3 reported Xid 48/)
        assert.isUndefined(waiting.pollUnsafe(), "still held, on NVML's word now")
        restarted.gpus = [gpuWith({ index: 3, uuid: "GPU-dead" })]
        yield* TestClock.adjust("2 seconds")
        yield* Fiber.join(waiting)
      }).pipe(Effect.provide(restartedGate(["GPU-dead"])), Effect.ensuring(resetRestarted))
  )

  it.effect("a CUDA engine without NVML (no library) and nothing remembered starts at once, as before", () =>
    Effect.gen(function* () {
      const gate = yield* GpuGate
      yield* gate.awaitFree
      assert.isUndefined((yield* gate.status).fault)
      // no GPUs chosen for it: it sees what the container gives it
      assert.deepStrictEqual(yield* gate.runEnv, {})
    }).pipe(
      Effect.provide(restartedGate([])),
      // nothing remembered before the gate is built (its first sample is taken then); a host without the library (an
      // NVML that is there but silent waits instead: gpu-late-choice.test.ts)
      (test) =>
        Effect.andThen(
          Effect.sync(() => {
            restarted.remembered.splice(0)
            restarted.down = "cannot load libnvidia-ml.so.1: libnvidia-ml.so.1: cannot open shared object file"
          }),
          test
        ),
      Effect.ensuring(
        Effect.andThen(
          Effect.sync(() => {
            restarted.remembered = [{ uuid: "GPU-dead", xids: [{ xid: 79, events: 1 }] }]
          }),
          resetRestarted
        )
      )
    )
  )
})

/** What the gate logs (level and message), over the scripted NVML. */
const gateLogs: Array<string> = []
const loggedGate = scriptedGate.pipe(
  Layer.provide(
    Logger.layer([Logger.make(({ logLevel, message }) => void gateLogs.push(`${logLevel} ${[message].flat()[0]}`))])
  )
)
const MiB = 2 ** 20
/** A start that goes ahead without a poll's wait (one that waited would hang the test on its TestClock). */
const startsAtOnce = (gate: typeof GpuGate.Service) =>
  Effect.gen(function* () {
    const start = yield* Effect.forkChild(gate.awaitFree)
    yield* TestClock.adjust("1 millis")
    assert.isDefined(start.pollUnsafe(), "the start goes ahead at once")
  })
const resetScripted = Effect.sync(() => {
  scripted.down = undefined
  scripted.gpus = []
  gateLogs.splice(0)
})

describe("GpuGate: what holds a start (README engine.gpu_free_below_mib)", () => {
  it.effect("gpu_free_below_mib is MiB: at most 1024 MiB in use (the default) is free, 1025 MiB holds the start", () =>
    Effect.gen(function* () {
      const gate = yield* GpuGate
      scripted.gpus = [gpuWith({ index: 0, memoryUsedBytes: 1024 * MiB })]
      yield* startsAtOnce(gate)
      scripted.gpus = [gpuWith({ index: 0, memoryUsedBytes: 1025 * MiB })]
      const waiting = yield* Effect.forkChild(gate.awaitFree)
      yield* TestClock.adjust("1 second")
      assert.isUndefined(waiting.pollUnsafe(), "held")
      assert.match((yield* gate.status).waiting?.reason ?? "", /^GPU 0 has .* in use/)
      yield* Fiber.interrupt(waiting)
    }).pipe(Effect.provide(scriptedGate), Effect.ensuring(resetScripted))
  )

  it.effect(
    "a process of an earlier run of the engine (its group recorded at the spawn) holds the start, however little it holds",
    () =>
      Effect.gen(function* () {
        const gate = yield* GpuGate
        // this process stands for the dead engine's worker: 1 MiB, well under gpu_free_below_mib
        const pgid = pgidOf(process.pid)
        assert.isDefined(pgid)
        scripted.gpus = [
          gpuWith({ index: 0, memoryUsedBytes: MiB, processes: [{ pid: process.pid, usedMemoryBytes: MiB }] })
        ]
        // not a group the engine ran in: the GPU is free
        yield* startsAtOnce(gate)
        yield* gate.spawned(pgid as number)
        const waiting = yield* Effect.forkChild(gate.awaitFree)
        yield* TestClock.adjust("3 seconds")
        assert.isUndefined(waiting.pollUnsafe(), "the restart waits for the earlier run's process")
        assert.match(
          (yield* gate.status).waiting?.reason ?? "",
          new RegExp(
            `^a process of an earlier engine run still holds GPU memory: pid ${process.pid} \\(earlier engine run\\)`
          )
        )
        // the process gone from the GPU: the start goes on
        scripted.gpus = [gpuWith({ index: 0 })]
        yield* TestClock.adjust("1 second")
        yield* Fiber.join(waiting)
      }).pipe(Effect.provide(scriptedGate), Effect.ensuring(resetScripted))
  )

  it.effect("overdue exactly at gpu_free_timeout (2s here), not a poll later", () =>
    Effect.gen(function* () {
      const gate = yield* GpuGate
      const waiting = yield* Effect.forkChild(gate.awaitFree)
      yield* TestClock.adjust("1999 millis")
      assert.isFalse((yield* gate.status).waiting?.overdue, "not overdue before gpu_free_timeout")
      yield* TestClock.adjust("1 millis")
      assert.isTrue((yield* gate.status).waiting?.overdue, "overdue at gpu_free_timeout")
      yield* Fiber.interrupt(waiting)
    }).pipe(Effect.provide(gateLayer))
  )
})

describe("GpuGate: the fault it keeps while NVML is silent, and its log lines", () => {
  it.effect(
    "a fault NVML reported stands while it is silent, the reason says so; cleared and logged once, not every poll",
    () =>
      Effect.gen(function* () {
        const gate = yield* GpuGate
        // GPU 0 is missing from the first sample (fail closed), then listed sound: that fault clears, once
        scripted.gpus = [gpuWith({ index: 0 })]
        yield* TestClock.adjust("1 second")
        gateLogs.splice(0)
        yield* TestClock.adjust("3 seconds")
        assert.deepStrictEqual(gateLogs, [], "a sound GPU: nothing logged on each poll")
        scripted.gpus = [gpuWith({ index: 0, criticalXids: [{ xid: 79, events: 1 }] })]
        yield* TestClock.adjust("1 second")
        scripted.down = "NVML call stuck"
        const waiting = yield* Effect.forkChild(gate.awaitFree)
        yield* TestClock.adjust("1 second")
        assert.match(
          (yield* gate.status).waiting?.reason ?? "",
          /Xid 79.* \(NVML is not answering: the fault stands until it does\)$/
        )
        scripted.down = undefined
        scripted.gpus = [gpuWith({ index: 0 })]
        yield* TestClock.adjust("4 seconds")
        yield* Fiber.join(waiting)
        assert.deepStrictEqual(
          gateLogs.filter((l) => /GPU fault/.test(l)),
          ["Error GPU fault: the node is unhealthy", "Info GPU fault cleared"]
        )
      }).pipe(Effect.provide(loggedGate), Effect.ensuring(resetScripted))
  )

  it.effect("a remembered fault NVML said was cleared is not raised again when NVML goes silent after answering", () =>
    Effect.gen(function* () {
      const gate = yield* GpuGate
      assert.match((yield* gate.status).fault ?? "", /GPU-dead reported Xid 79/)
      restarted.down = undefined
      restarted.gpus = [gpuWith({ index: 0, uuid: "GPU-dead" })]
      yield* TestClock.adjust("1 second")
      assert.isUndefined((yield* gate.status).fault, "NVML's word: cleared")
      // NVML silent again: its last answer stands, not this boot's record
      restarted.down = "NVML call stuck"
      yield* TestClock.adjust("3 seconds")
      assert.isUndefined((yield* gate.status).fault)
      yield* gate.awaitFree
    }).pipe(Effect.provide(restartedGate([0], [0])), Effect.ensuring(resetRestarted))
  )
})
