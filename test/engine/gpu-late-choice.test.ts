// The engine's GPUs chosen after the agent's start (models.x.gpus unset, NVML listing none then: hung, its driver not
// loaded yet): the pure rule (services/engine/GpuGate.ts lateChoice) and the live GpuGate (layers/engine/GpuGate.ts)
// on a TestClock with a scripted NVML. The first start waits for NVML, the choice is made once it lists GPUs (healthy
// ones first, as planFor's), fixed from then on, and the gate's GPUs and the run's CUDA variables follow it. A start
// a remembered fault holds past gpu_free_timeout has not gone on unpinned: NVML's later answer still chooses a sound
// GPU beside the faulty one; with NVML switched off the fault says what releases it (POST /gpus/clear-xids).
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber, Layer, Logger } from "effect"
import { TestClock } from "effect/testing"
import type { Gpu } from "../../src/gen/cgn/agent/v1/agent.ts"
import { layerFromObject } from "../../src/layers/config/Config.ts"
import * as GpuGateLive from "../../src/layers/engine/GpuGate.ts"
import { EnginePlan } from "../../src/services/engine/Engine.ts"
import { GpuGate, gateProblem, lateChoice } from "../../src/services/engine/GpuGate.ts"
import { gpuWith, Nvml } from "../../src/services/node/Nvml.ts"
import { NvmlAbsence, nvmlAbsent } from "../../src/services/node/NvmlAbsence.ts"
import { defaultXidRule } from "../../src/services/node/Xid.ts"
import { testPlan } from "../../src/testing/EngineProcess.ts"
import * as MetricsTest from "../../src/testing/Metrics.ts"

const KEY = 'models."m".gpus'
const faulty = gpuWith({ index: 0, uuid: "GPU-dead", criticalXids: [{ xid: 79, events: 1 }] })
const sound = gpuWith({ index: 1, uuid: "GPU-good" })
const STUCK = "an NVML sample (an open, or one round of reads over every GPU) has taken over 10s (a GPU off the bus?)"

describe("lateChoice", () => {
  it("waits while NVML is there but silent, until given up; NVML listing none, or none at all: no GPUs, as ever", () => {
    const stuck = lateChoice(KEY, 1, [], STUCK, defaultXidRule)
    assert.strictEqual(stuck._tag, "Waiting")
    assert.match(
      stuck._tag === "Waiting" ? stuck.reason : "",
      /^NVML is not answering \(an NVML sample \(an open, or one round of reads over every GPU\) has taken over 10s.*\): the engine's GPUs \(models."m".gpus unset\) are chosen once it lists them \(on a host without GPUs, CGN_NVML_LIBRARY=none\)$/
    )
    const noDriver = "nvmlInit_v2 failed: Driver Not Loaded (9)"
    assert.strictEqual(lateChoice(KEY, 1, [], noDriver, defaultXidRule)._tag, "Waiting")
    const unknown = { _tag: "Chosen", assignment: { _tag: "Unknown" } } as const
    // the start waited engine.gpu_free_timeout: as without NVML (a CPU host with the NVIDIA libraries, no driver)
    assert.deepStrictEqual(lateChoice(KEY, 1, [], noDriver, defaultXidRule, true), unknown)
    // NVML answers and lists none (a container given no GPU): taken at its word, as at the start
    assert.deepStrictEqual(lateChoice(KEY, 1, [], undefined, defaultXidRule), unknown)
    for (const absent of [
      "cannot load libnvidia-ml.so.1: libnvidia-ml.so.1: cannot open shared object file",
      "disabled (library set to none)",
      "the koffi FFI module could not be loaded"
    ]) {
      assert.isTrue(nvmlAbsent(absent), absent)
      assert.deepStrictEqual(lateChoice(KEY, 1, [], absent, defaultXidRule), {
        _tag: "Chosen",
        assignment: { _tag: "Unknown" }
      })
    }
    assert.isFalse(nvmlAbsent(STUCK))
  })

  it("chooses as planFor does once NVML lists GPUs: healthy first, faulty ones filling in; too few refused", () => {
    assert.deepStrictEqual(lateChoice(KEY, 1, [faulty, sound], undefined, defaultXidRule), {
      _tag: "Chosen",
      assignment: { _tag: "Assigned", indices: [1], automatic: true }
    })
    const filled = lateChoice(KEY, 2, [faulty, sound], undefined, defaultXidRule)
    assert.deepStrictEqual(filled._tag === "Chosen" ? filled.assignment : undefined, {
      _tag: "Assigned",
      indices: [0, 1],
      automatic: true,
      faults: ["GPU 0 reported Xid 79 (fallen off the bus): it needs a GPU reset or a reboot"]
    })
    const refused = lateChoice(KEY, 3, [faulty, sound], undefined, defaultXidRule)
    assert.match(refused._tag === "Refused" ? refused.reason : "", /^models."m".gpus: the engine needs 3 GPUs/)
  })
})

/** GPU 0's Xid 79 in this boot's record (gpu-xids.json). */
const DEAD = [{ uuid: "GPU-dead", xids: [{ xid: 79, events: 1 }] }]
/** NVML as the agent starts: silent (`down`); `remembered`: this boot's record, which a clear-xids changes. */
const host = {
  down: STUCK as string | undefined,
  gpus: [] as Array<Gpu>,
  remembered: [] as ReadonlyArray<(typeof DEAD)[number]>
}
const sample = Effect.sync(() => (host.down === undefined ? host.gpus : []))
const gateOf = (remembered: boolean, model: Record<string, unknown> = {}) => {
  host.remembered = remembered ? DEAD : []
  return GpuGateLive.layer.pipe(
    Layer.provideMerge(MetricsTest.layerTest),
    Layer.provide(
      Layer.succeed(
        Nvml,
        Nvml.of({
          gpus: sample,
          sampleNow: sample,
          unavailable: Effect.sync(() => host.down),
          clearXids: () => Effect.succeed([]),
          remembered: Effect.sync(() => host.remembered)
        })
      )
    ),
    // the plan as planFor rendered it with no GPUs from NVML: none chosen, no CUDA variables
    Layer.provide(Layer.succeed(EnginePlan, testPlan())),
    Layer.provide(
      layerFromObject({
        engine: { kind: "vllm", gpu_free_timeout: "5s" },
        models: { m: { hf_repo: "org/m", ...model } }
      })
    )
  )
}
const reset = Effect.sync(() => {
  host.down = STUCK
  host.gpus = []
  host.remembered = []
})

/** The gate over NVML whose driver is not loaded when the test starts (nothing remembered). */
const withoutDriver = <A, E>(test: Effect.Effect<A, E, GpuGate>) =>
  Effect.andThen(
    Effect.sync(() => {
      host.down = "nvmlInit_v2 failed: Driver Not Loaded (9)"
    }),
    test
  ).pipe(Effect.provide(gateOf(false)), Effect.ensuring(reset))

describe("GpuGate: GPUs the plan could not choose at start", () => {
  it.effect(
    "NVML silent at start: held on the remembered fault; once NVML answers, the healthy GPU is chosen and fixed",
    () =>
      Effect.gen(function* () {
        const gate = yield* GpuGate
        assert.match((yield* gate.status).fault ?? "", /GPU-dead reported Xid 79.*names no UUIDs/)
        const start = yield* Effect.forkChild(gate.awaitFree)
        yield* TestClock.adjust("3 seconds")
        assert.isUndefined(start.pollUnsafe(), "held while NVML is silent")
        assert.deepStrictEqual((yield* gate.status).gpus, [])

        // NVML answers: GPU 0 has the Xid, GPU 1 is sound and free; the choice takes GPU 1 and the start goes on
        host.down = undefined
        host.gpus = [
          { ...faulty, memoryUsedBytes: 0 },
          { ...sound, memoryUsedBytes: 0 }
        ]
        yield* TestClock.adjust("2 seconds")
        yield* Fiber.join(start)
        assert.deepStrictEqual(yield* gate.runEnv, { CUDA_DEVICE_ORDER: "PCI_BUS_ID", CUDA_VISIBLE_DEVICES: "1" })
        const st = yield* gate.status
        assert.deepStrictEqual(st.gpus, [1])
        assert.isUndefined(st.fault, "GPU 0's fault is not the engine's")
        assert.isUndefined(gateProblem(st))

        // fixed: GPU 1 faulty later holds the next start (it is not moved to another GPU), GPU 0's cleared fault does not free it
        host.gpus = [
          { ...sound, index: 0, uuid: "GPU-other" },
          { ...faulty, index: 1 }
        ]
        yield* TestClock.adjust("2 seconds")
        assert.match((yield* gate.status).fault ?? "", /^GPU 1 reported Xid 79/)
        assert.deepStrictEqual((yield* gate.status).gpus, [1])
        assert.deepStrictEqual(yield* gate.runEnv, { CUDA_DEVICE_ORDER: "PCI_BUS_ID", CUDA_VISIBLE_DEVICES: "1" })
      }).pipe(Effect.provide(gateOf(true)), Effect.ensuring(reset))
  )

  it.effect(
    "NVML's driver not loaded at start, nothing remembered: the start waits for NVML, which answers within gpu_free_timeout",
    () =>
      Effect.gen(function* () {
        const gate = yield* GpuGate
        const start = yield* Effect.forkChild(gate.awaitFree)
        yield* TestClock.adjust("2 seconds")
        assert.isUndefined(start.pollUnsafe(), "not spawned seeing every GPU")
        const waiting = (yield* gate.status).waiting
        assert.match(waiting?.reason ?? "", /^NVML is not answering \(nvmlInit_v2 failed.*\): the engine's GPUs/)
        assert.isTrue(waiting?.forNvml)
        assert.isUndefined(gateProblem(yield* gate.status), "not unhealthy before gpu_free_timeout")

        // the driver loaded (a GPU operator installed it): the first GPU is chosen, the start goes on
        host.down = undefined
        host.gpus = [gpuWith({ index: 0, memoryUsedBytes: 0 }), gpuWith({ index: 1, memoryUsedBytes: 0 })]
        yield* TestClock.adjust("1 second")
        yield* Fiber.join(start)
        assert.deepStrictEqual(yield* gate.runEnv, { CUDA_DEVICE_ORDER: "PCI_BUS_ID", CUDA_VISIBLE_DEVICES: "0" })
        assert.deepStrictEqual((yield* gate.status).gpus, [0])
        assert.isUndefined((yield* gate.status).waiting)
      }).pipe(withoutDriver)
  )

  it.effect(
    "NVML that never answers (a CPU host with the NVIDIA libraries, no driver): the start goes on at gpu_free_timeout, as without NVML",
    () =>
      Effect.gen(function* () {
        const gate = yield* GpuGate
        const start = yield* Effect.forkChild(gate.awaitFree)
        yield* TestClock.adjust("4 seconds")
        assert.isUndefined(start.pollUnsafe(), "waiting within gpu_free_timeout")
        yield* TestClock.adjust("2 seconds")
        yield* Fiber.join(start)
        // no CUDA variables: the engine sees what it is given, and the choice stays so
        assert.deepStrictEqual(yield* gate.runEnv, {})
        assert.deepStrictEqual((yield* gate.status).gpus, [])
        assert.isUndefined(gateProblem(yield* gate.status), "never held out of service by NVML alone")
        host.down = undefined
        host.gpus = [gpuWith({ index: 0, memoryUsedBytes: 0 })]
        yield* TestClock.adjust("2 seconds")
        assert.deepStrictEqual(yield* gate.runEnv, {})
      }).pipe(withoutDriver)
  )

  it.effect("NVML lists too few GPUs for tp x dp: the node is unhealthy, naming the key, and the start is held", () =>
    Effect.gen(function* () {
      const gate = yield* GpuGate
      const start = yield* Effect.forkChild(gate.awaitFree)
      host.down = undefined
      host.gpus = [gpuWith({ index: 0, memoryUsedBytes: 0 }), gpuWith({ index: 1, memoryUsedBytes: 0 })]
      yield* TestClock.adjust("2 seconds")
      assert.isUndefined(start.pollUnsafe())
      assert.match(gateProblem(yield* gate.status) ?? "", /^models."m".gpus: the engine needs 4 GPUs/)
      yield* Fiber.interrupt(start)
    }).pipe(Effect.provide(gateOf(false, { tp: 4 })), Effect.ensuring(reset))
  )
})

describe("GpuGate: NVML given up at engine.gpu_free_timeout", () => {
  it.effect("the start goes on exactly at gpu_free_timeout (5s here), with the warning that says so", () => {
    const warnings: Array<string> = []
    const logged = Logger.layer([
      Logger.make(({ logLevel, message }) => {
        if (logLevel === "Warn") warnings.push(String([message].flat()[0]))
      })
    ])
    return Effect.gen(function* () {
      const gate = yield* GpuGate
      const start = yield* Effect.forkChild(gate.awaitFree)
      yield* TestClock.adjust("4999 millis")
      assert.isUndefined(start.pollUnsafe(), "waiting within gpu_free_timeout")
      yield* TestClock.adjust("1 millis")
      assert.isDefined(start.pollUnsafe(), "given up at gpu_free_timeout, not a poll later")
      assert.include(
        warnings,
        "NVML did not answer within engine.gpu_free_timeout: the engine starts without CUDA_VISIBLE_DEVICES (it sees every GPU it is given), and stays so for the agent's life"
      )
    }).pipe(
      // the warning is logged by the start that gives up: the test fiber, as the supervisor's in the agent
      Effect.provide(gateOf(false).pipe(Layer.provideMerge(logged))),
      (test) =>
        Effect.andThen(
          Effect.sync(() => {
            host.down = "nvmlInit_v2 failed: Driver Not Loaded (9)"
          }),
          test
        ),
      Effect.ensuring(reset)
    )
  })
})

/** What the gate logs, level and message, for the tests below. */
const logs: Array<string> = []
const heldGate = (down: string) =>
  Effect.sync(() => {
    host.down = down
  })
/** NVML as the agent starts (`down`, set before the gate takes its first sample), GPU 0's Xid remembered, the gate's
 * lines kept in `logs`. */
const startingWith =
  (down: string) =>
  <A, E>(test: Effect.Effect<A, E, GpuGate>) =>
    Effect.andThen(
      heldGate(down),
      Effect.provide(
        test,
        gateOf(true).pipe(
          Layer.provideMerge(
            Logger.layer([Logger.make(({ logLevel, message }) => void logs.push(`${logLevel} ${[message].flat()[0]}`))])
          )
        )
      )
    ).pipe(
      Effect.ensuring(
        Effect.andThen(
          reset,
          Effect.sync(() => void logs.splice(0))
        )
      )
    )

describe("GpuGate: NVML given up at gpu_free_timeout while a remembered fault holds the start", () => {
  it.effect("NVML answering later still chooses the sound GPU beside the faulty one, and the start goes on", () =>
    Effect.gen(function* () {
      const gpuGate = yield* GpuGate
      const start = yield* Effect.forkChild(gpuGate.awaitFree)
      // past gpu_free_timeout (5s): the wait for NVML is given up, the remembered fault of GPU 0 holds the start
      yield* TestClock.adjust("7 seconds")
      assert.isUndefined(start.pollUnsafe(), "held on the remembered fault")
      assert.match(gateProblem(yield* gpuGate.status) ?? "", /GPU-dead reported Xid 79/)
      assert.notInclude(
        logs.join("\n"),
        "the engine starts without CUDA_VISIBLE_DEVICES",
        "the log does not say the engine starts"
      )
      assert.include(
        logs,
        "Warn NVML did not answer within engine.gpu_free_timeout, and a GPU fault holds the start: the engine's GPUs are chosen once NVML answers (the first tp × dp healthy ones it lists, only their faults holding it); if the fault clears first, it starts without CUDA_VISIBLE_DEVICES"
      )

      // NVML answers: GPU 0 has the Xid, GPU 1 is sound and free; the choice takes GPU 1 and the start goes on on it
      host.down = undefined
      host.gpus = [faulty, sound]
      yield* TestClock.adjust("2 seconds")
      assert.isDefined(start.pollUnsafe(), "the start goes on, on the GPU chosen")
      yield* Fiber.join(start)
      assert.deepStrictEqual(yield* gpuGate.runEnv, { CUDA_DEVICE_ORDER: "PCI_BUS_ID", CUDA_VISIBLE_DEVICES: "1" })
      const st = yield* gpuGate.status
      assert.deepStrictEqual(st.gpus, [1])
      assert.isUndefined(st.fault, "GPU 0's fault is not the engine's")
      assert.isUndefined(gateProblem(st))
    }).pipe(startingWith(STUCK))
  )

  it.effect(
    "NVML switched off: the fault says so and what releases it; clearing the GPU's Xids starts the engine",
    () =>
      Effect.gen(function* () {
        const gpuGate = yield* GpuGate
        const fault = (yield* gpuGate.status).fault ?? ""
        assert.strictEqual(
          fault,
          "GPU GPU-dead reported Xid 79 (fallen off the bus) earlier in this boot and NVML is switched off (CGN_NVML_LIBRARY=none), so it will never say the GPU was reset (the configuration names no UUIDs: without NVML any GPU may be the engine's): after a GPU reset or a reboot, POST /gpus/clear-xids?gpu=GPU-dead releases the start"
        )
        const start = yield* Effect.forkChild(gpuGate.awaitFree)
        yield* TestClock.adjust("7 seconds")
        assert.isUndefined(start.pollUnsafe(), "held on the remembered fault")
        const waiting = (yield* gpuGate.status).waiting
        assert.strictEqual(waiting?.reason, fault, "not 'NVML is not answering': it is off")
        assert.isTrue(waiting?.overdue)
        assert.notMatch(logs.join("\n"), /has not answered|NVML did not answer/)
        assert.include(logs, "Error the engine's GPUs are not free in time; the node is unhealthy until they are")

        // the operator reset the GPU and cleared its Xids (the record forgets it): the start goes on, as without NVML
        host.remembered = []
        yield* TestClock.adjust("2 seconds")
        assert.isDefined(start.pollUnsafe(), "released by the Xids cleared")
        yield* Fiber.join(start)
        assert.deepStrictEqual(yield* gpuGate.runEnv, {})
        assert.isUndefined(gateProblem(yield* gpuGate.status))
      }).pipe(startingWith(NvmlAbsence.disabled))
  )
})
