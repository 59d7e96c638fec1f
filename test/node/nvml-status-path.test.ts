// NVML off the status path (layers/node/Nvml.ts): a sample that hangs (the fake's FAKE_NVML_BLOCK_FILE) or an
// on-demand re-open of NVML that hangs must not hold a reader of `gpus` (the etcd heartbeat's record, admin /status
// and /metrics, GetNodeHealth), which gets the last answer at once; once the call's deadline passes, the stuck state
// is reported as before (no GPUs, `unavailable`, nvml_up 0). Through the Nvml layer, and through NodeStatus.
import * as path from "node:path"
import type { Worker } from "node:worker_threads"
import { Clock, Effect, Layer } from "effect"
import { describe, expect, it } from "vitest"
import * as ConfigLayer from "../../src/layers/config/Config.ts"
import * as AdmissionLayer from "../../src/layers/grpc/Admission.ts"
import * as NodeStatusLayer from "../../src/layers/node/NodeStatus.ts"
import * as NvmlLive from "../../src/layers/node/Nvml.ts"
import { nvmlWorkerEntry } from "../../src/programs/programPaths.ts"
import { EngineClient } from "../../src/services/engine/EngineClient.ts"
import { Drain } from "../../src/services/node/Drain.ts"
import { NodeStatus } from "../../src/services/node/NodeStatus.ts"
import { type Gpu, Nvml } from "../../src/services/node/Nvml.ts"
import { Metrics } from "../../src/services/observability/Metrics.ts"
import * as CordonTest from "../../src/testing/Cordon.ts"
import { layerTest as engineLayerTest } from "../../src/testing/EngineProcess.ts"
import * as MetricsTest from "../../src/testing/Metrics.ts"
import { blockNvml, useFakeNvml } from "../support/nvml.ts"

const nvml = useFakeNvml("cgn-nvml-status-")

/** A call's deadline here (CALL_TIMEOUT is 10 s), and the most a reader may take: far shorter still. */
const CALL_TIMEOUT_MS = 1_500
const READER_BOUND_MS = 150
const STUCK =
  "an NVML sample (an open, or one round of reads over every GPU) has taken over 1s 500ms (a GPU off the bus?)"

/** `read` timed on the Clock. */
const timed = <A, R>(read: Effect.Effect<A, never, R>) =>
  Effect.gen(function* () {
    const t0 = yield* Clock.currentTimeMillis
    const value = yield* read
    return { value, ms: (yield* Clock.currentTimeMillis) - t0 }
  })

/** Reads until `done` holds (bounded: 500 reads 10 ms apart); every read's time, to hold to the reader bound. */
const readUntil = <A, R>(read: Effect.Effect<A, never, R>, done: (a: A) => boolean) =>
  Effect.gen(function* () {
    let slowestMs = 0
    for (let i = 0; i < 500; i++) {
      const r = yield* timed(read)
      slowestMs = Math.max(slowestMs, r.ms)
      if (done(r.value)) return { value: r.value, slowestMs }
      yield* Effect.sleep("10 millis")
    }
    return yield* Effect.die(new Error("condition not reached in 500 reads"))
  })

const probe = (options: NvmlLive.NvmlOptions) =>
  NvmlLive.layer(nvmlWorkerEntry(), {
    library: nvml.library,
    maxAge: 0, // every read wants a new sample: the worst case for a reader
    callTimeout: `${CALL_TIMEOUT_MS} millis`,
    ...options
  }).pipe(Layer.provideMerge(MetricsTest.layerTest))

const twoGpus = (gpus: ReadonlyArray<Gpu>) => gpus.length === 2

describe("Nvml off the status path", () => {
  it("a hung sample: `gpus` answers the last sample at once, then, past the deadline, no GPUs and NVML stuck", async () => {
    let hang: ReturnType<typeof blockNvml> | undefined
    try {
      const r = await Effect.runPromise(
        Effect.gen(function* () {
          const n = yield* Nvml
          const metrics = yield* Metrics
          // the first answer may miss the deadline on a loaded machine: wait for it
          yield* readUntil(n.gpus, twoGpus)
          hang = blockNvml(path.join(nvml.dir, "sample.block"))
          const hungAt = yield* Clock.currentTimeMillis
          // this read starts the sample that hangs, and the next ones find it in flight
          const during = [yield* timed(n.gpus), yield* timed(n.gpus)]
          const scrape = yield* timed(metrics.render)
          const why = yield* n.unavailable
          const stuck = yield* readUntil(n.unavailable, (w) => w !== undefined)
          const stuckAfterMs = (yield* Clock.currentTimeMillis) - hungAt
          const after = { gpus: yield* timed(n.gpus), body: (yield* metrics.render).body }
          hang.unblock()
          const back = yield* readUntil(n.gpus, twoGpus)
          return { during, scrape, why, stuck, stuckAfterMs, after, back, whyBack: yield* n.unavailable }
        }).pipe(Effect.provide(probe({})))
      )
      for (const d of [...r.during, r.scrape]) expect(d.ms).toBeLessThan(READER_BOUND_MS)
      expect(r.during[0]?.value).toHaveLength(2) // the last sample, while the new one hangs
      expect(r.during[1]?.value).toHaveLength(2)
      expect(r.why).toBeUndefined()
      expect(r.scrape.value.body).toMatch(/^cgn_agent_nvml_up 1$/m)
      // stuck as before, once the deadline has passed, and no reader waited for it
      expect(r.stuck.value).toBe(STUCK)
      expect(r.stuck.slowestMs).toBeLessThan(READER_BOUND_MS)
      // the sample that hangs may be one the last read above started just before the block (maxAge 0): its deadline
      // runs from its start, up to a read's interval (10 ms) before hungAt, more on a loaded host, where the worker
      // thread may not have reached the blocking call yet (CI runs saw 35 ms and 230 ms): not stuck long before it
      expect(r.stuckAfterMs).toBeGreaterThanOrEqual(CALL_TIMEOUT_MS - 500)
      expect(r.after.gpus.value).toEqual([])
      expect(r.after.gpus.ms).toBeLessThan(READER_BOUND_MS)
      expect(r.after.body).toContain("cgn_agent_nvml_up 0")
      expect(r.after.body).not.toMatch(/^cgn_agent_gpu_\w+\{/m)
      expect(r.back.slowestMs).toBeLessThan(READER_BOUND_MS)
      expect(r.whyBack).toBeUndefined()
    } finally {
      hang?.unblock()
    }
  })

  it("a re-open of NVML after a failure, hung in nvmlInit, holds no reader; past its deadline NVML is stuck", async () => {
    const workers: Array<Worker> = []
    let hang: ReturnType<typeof blockNvml> | undefined
    try {
      const r = await Effect.runPromise(
        Effect.gen(function* () {
          const n = yield* Nvml
          yield* readUntil(n.gpus, twoGpus)
          process.env.FAKE_NVML_COUNT_RC = "999" // "Unknown Error": NVML shut down, to be opened again on demand
          const gone = yield* n.sampleNow
          const goneWhy = yield* n.unavailable
          delete process.env.FAKE_NVML_COUNT_RC
          hang = blockNvml(path.join(nvml.dir, "open.block"))
          // reads start the re-open once the backoff allows: a second worker, its nvmlInit hanging
          const reopening = yield* readUntil(n.gpus, () => workers.length === 2)
          const openAt = yield* Clock.currentTimeMillis
          const during = { gpus: yield* timed(n.gpus), why: yield* n.unavailable }
          const stuck = yield* readUntil(n.unavailable, (w) => w === STUCK)
          const stuckAfterMs = (yield* Clock.currentTimeMillis) - openAt
          hang.unblock()
          const back = yield* readUntil(n.gpus, twoGpus)
          return { gone, goneWhy, reopening, during, stuck, stuckAfterMs, back }
        }).pipe(Effect.provide(probe({ retryMax: "20 millis", onWorker: (w) => void workers.push(w) })))
      )
      expect(r.gone).toEqual([])
      expect(r.goneWhy).toBe("NVML stopped answering: nvmlDeviceGetCount_v2: NVML_ERROR_UNKNOWN (999)")
      expect(r.reopening.slowestMs).toBeLessThan(READER_BOUND_MS)
      expect(r.during.gpus).toMatchObject({ value: [] })
      expect(r.during.gpus.ms).toBeLessThan(READER_BOUND_MS)
      expect(r.during.why).toBe(r.goneWhy) // still down: the re-open has not answered
      expect(r.stuck.slowestMs).toBeLessThan(READER_BOUND_MS)
      // the deadline counts from the read that started the re-open, a read or two before `openAt`
      expect(r.stuckAfterMs).toBeGreaterThanOrEqual(CALL_TIMEOUT_MS - 200)
      expect(r.back.value).toHaveLength(2)
    } finally {
      hang?.unblock()
      delete process.env.FAKE_NVML_COUNT_RC
    }
  })

  it("NodeStatus' snapshot (the heartbeat's record) does not wait for a hung sample, and shows it stuck after", async () => {
    const config = ConfigLayer.layerFromObject({
      models: { m: { hf_repo: "org/m" } },
      cluster: { name: "c1" },
      agent: { node_id: "n1", heartbeat: "1s", advertise_addr: "10.1.2.3:7071" }
    })
    const client = Layer.succeed(EngineClient, {
      streamTo: () => Effect.void,
      load: Effect.succeed({ running: undefined, waiting: undefined, kvUsage: undefined })
    })
    const deps = Layer.mergeAll(
      engineLayerTest(),
      client,
      AdmissionLayer.layerWith({ maxInflight: 4, maxQueue: 2 }),
      Drain.layer,
      CordonTest.layerMemory,
      probe({})
    ).pipe(Layer.provideMerge(config))
    const layer = NodeStatusLayer.layer({ agentVersion: "9.9.9" }).pipe(Layer.provideMerge(deps))
    let hang: ReturnType<typeof blockNvml> | undefined
    const gpusOf = (h: { readonly capacity?: { readonly gpus: ReadonlyArray<Gpu> } | undefined }) =>
      h.capacity?.gpus ?? []
    try {
      const r = await Effect.runPromise(
        Effect.scoped(
          Effect.gen(function* () {
            const status = yield* NodeStatus
            yield* readUntil(status.snapshot, (h) => gpusOf(h).length === 2)
            hang = blockNvml(path.join(nvml.dir, "status.block"))
            const during = yield* timed(status.snapshot)
            const stuck = yield* readUntil(status.snapshot, (h) => gpusOf(h).length === 0)
            hang.unblock()
            return { during, stuck }
          })
        ).pipe(Effect.provide(layer))
      )
      expect(r.during.ms).toBeLessThan(READER_BOUND_MS)
      expect(gpusOf(r.during.value)).toHaveLength(2)
      expect(r.stuck.slowestMs).toBeLessThan(READER_BOUND_MS)
    } finally {
      hang?.unblock()
    }
  })
})
