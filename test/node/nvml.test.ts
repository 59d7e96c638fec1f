// The live Nvml layer (layers/node/Nvml.ts) through the real FFI: a fake libnvidia-ml.so compiled from
// test/fixtures/fake_nvml.c with the system C compiler answers for two GPUs; a missing library and a failing
// nvmlInit_v2 leave no GPUs. NVML runs in a worker thread: a hung call (FAKE_NVML_BLOCK_FILE) leaves the event loop
// free and readers get no GPUs after `callTimeout`. The pure naming of NvmlValues.ts (return codes, a GPU's identity
// from an earlier sample) is checked directly at the end.
import { once } from "node:events"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import type { Worker } from "node:worker_threads"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Clock, Effect, Layer, Schedule } from "effect"
import { TestClock } from "effect/testing"
import * as NvmlLive from "../../src/layers/node/Nvml.ts"
import { nvmlWorkerEntry } from "../../src/programs/programPaths.ts"
import { type Gpu, gpuWith, Nvml } from "../../src/services/node/Nvml.ts"
import { type GpuIdentity, gpuFields, nameGpus, nvmlReturnName } from "../../src/services/node/NvmlValues.ts"
import { Metrics } from "../../src/services/observability/Metrics.ts"
import * as MetricsTest from "../../src/testing/Metrics.ts"
import { blockNvml, buildFakeNvml } from "../support/nvml.ts"

let dir = ""
let library = ""

beforeAll(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-nvml-"))
  library = buildFakeNvml(dir)
})

afterAll(() => {
  if (dir) fs.rmSync(dir, { recursive: true, force: true })
})

const withProbe = <A>(options: NvmlLive.NvmlOptions, use: Effect.Effect<A, never, Nvml | Metrics>) =>
  Effect.runPromise(
    use.pipe(Effect.provide(NvmlLive.layer(nvmlWorkerEntry(), options).pipe(Layer.provideMerge(MetricsTest.layerTest))))
  )

/** The worker threads a layer starts, each with a promise of its exit (bounded by the test's timeout). */
const watchWorkers = () => {
  const started: Array<{ readonly worker: Worker; readonly exit: Promise<unknown> }> = []
  return {
    started,
    onWorker: (worker: Worker) => void started.push({ worker, exit: once(worker, "exit").then(([code]) => code) })
  }
}

/** Samples until NVML reports GPUs (bounded: 500 tries 10 ms apart), for the tests that wait for a re-open. */
const untilGpus = (sampleNow: Effect.Effect<ReadonlyArray<Gpu>>) =>
  sampleNow.pipe(
    Effect.filterOrFail(
      (gpus) => gpus.length > 0,
      () => new Error("no GPUs yet")
    ),
    Effect.retry({ schedule: Schedule.spaced("10 millis"), times: 500 }),
    Effect.orDie
  )

describe("Nvml live layer", () => {
  it("reads two GPUs through the FFI, fills the gauges and shuts NVML down at release", async () => {
    const shutdownFile = path.join(dir, "shutdown.log")
    process.env.FAKE_NVML_SHUTDOWN_FILE = shutdownFile
    const workers = watchWorkers()
    try {
      const { gpus, unavailable, body } = await withProbe(
        { library, onWorker: workers.onWorker },
        Effect.gen(function* () {
          const nvml = yield* Nvml
          const gpus = yield* nvml.gpus
          const body = (yield* (yield* Metrics).render).body
          return { gpus, unavailable: yield* nvml.unavailable, body }
        })
      )
      expect(unavailable).toBeUndefined()
      expect(gpus).toEqual([
        {
          index: 0,
          name: "NVIDIA H100 80GB HBM3",
          uuid: "GPU-00000000-1111-2222-3333-444444444444",
          memoryTotalBytes: 85899345920,
          memoryUsedBytes: 21474836480,
          memoryFreeBytes: 64424509440,
          utilizationPercent: 37,
          temperatureCelsius: 54,
          powerWatts: 312,
          powerLimitWatts: 700,
          throttleReasons: [],
          eccUncorrected: 0,
          processes: [],
          lost: false,
          unreportedFields: [],
          criticalXids: [],
          rowRemapPending: false,
          rowRemapFailure: false,
          retiredPagesPending: false,
          migEnabled: false,
          migDevices: []
        },
        {
          index: 1,
          name: "NVIDIA H100 80GB HBM3",
          uuid: "GPU-55555555-6666-7777-8888-999999999999",
          memoryTotalBytes: 85899345920,
          memoryUsedBytes: 4294967297,
          memoryFreeBytes: 81604378623,
          utilizationPercent: 100,
          temperatureCelsius: 71,
          powerWatts: 689.5,
          powerLimitWatts: 700,
          throttleReasons: ["sw_power_cap"],
          eccUncorrected: 0,
          processes: [],
          lost: false,
          unreportedFields: [],
          criticalXids: [],
          rowRemapPending: false,
          rowRemapFailure: false,
          retiredPagesPending: false,
          migEnabled: false,
          migDevices: []
        }
      ])
      expect(body).toContain(
        'cgn_agent_gpu_utilization_ratio{gpu="0",uuid="GPU-00000000-1111-2222-3333-444444444444"} 0.37'
      )
      expect(body).toContain(
        'cgn_agent_gpu_memory_used_bytes{gpu="1",uuid="GPU-55555555-6666-7777-8888-999999999999"} 4294967297'
      )
      expect(body).toContain(
        'cgn_agent_gpu_memory_total_bytes{gpu="1",uuid="GPU-55555555-6666-7777-8888-999999999999"} 85899345920'
      )
      const g1 = 'gpu="1",uuid="GPU-55555555-6666-7777-8888-999999999999"'
      expect(body).toContain(`cgn_agent_gpu_temperature_celsius{${g1}} 71`)
      expect(body).toContain(`cgn_agent_gpu_power_watts{${g1}} 689.5`)
      expect(body).toContain(`cgn_agent_gpu_power_limit_watts{${g1}} 700`)
      expect(body).toContain(`cgn_agent_gpu_clock_throttled{${g1},reason="sw_power_cap"} 1`)
      expect(body).toContain(`cgn_agent_gpu_clock_throttled{${g1},reason="hw_slowdown"} 0`)
      expect(body).toContain(`cgn_agent_gpu_ecc_uncorrected_errors{${g1}} 0`)
      expect(body).toContain(`cgn_agent_gpu_lost{${g1}} 0`)
      // released: NVML shut down in the worker, and the worker (the only one) gone
      expect(fs.readFileSync(shutdownFile, "utf8")).toBe("event_set_free\nshutdown\n")
      expect(workers.started).toHaveLength(1)
      expect(await workers.started[0]?.exit).toBe(0)
    } finally {
      delete process.env.FAKE_NVML_SHUTDOWN_FILE
    }
  })

  it("reads processes, ECC errors, throttling and a lost GPU as the driver reports them (scripted state)", async () => {
    const state = path.join(dir, "state-1")
    // 20 processes: more than a first guess at the buffer, so the two-call protocol is exercised
    const procs = Array.from({ length: 20 }, (_, i) => `${1000 + i}:${(i + 1) * 2 ** 30}`).join(",")
    fs.writeFileSync(
      state,
      [`gpu.0.procs=${procs}`, "gpu.0.ecc=3", "gpu.0.throttle=0x49", "gpu.0.temp=91", "gpu.1.lost=1"].join("\n")
    )
    process.env.FAKE_NVML_STATE = state
    try {
      const { gpus, body, after } = await withProbe(
        { library },
        Effect.gen(function* () {
          const nvml = yield* Nvml
          const gpus = yield* nvml.gpus
          const body = (yield* (yield* Metrics).render).body
          // the processes exit: their series go at the next scrape (Metrics.ts: reset at every scrape)
          fs.writeFileSync(state, "gpu.0.procs=1000:1073741824")
          yield* nvml.sampleNow
          return { gpus, body, after: (yield* (yield* Metrics).render).body }
        })
      )
      const [g0, g1] = gpus
      expect(g0?.processes).toHaveLength(20)
      expect(g0?.processes[19]).toEqual({ pid: 1019, usedMemoryBytes: 20 * 2 ** 30 })
      expect(g0?.eccUncorrected).toBe(3)
      // 0x49 = gpu_idle (left out) | hw_slowdown | hw_thermal_slowdown
      expect(g0?.throttleReasons).toEqual(["hw_slowdown", "hw_thermal_slowdown"])
      expect(g0?.temperatureCelsius).toBe(91)
      expect(g1).toEqual(gpuWith({ index: 1, lost: true, unreportedFields: [...gpuFields] }))
      const g0l = 'gpu="0",uuid="GPU-00000000-1111-2222-3333-444444444444"'
      expect(body).toContain(`cgn_agent_gpu_process_memory_bytes{${g0l},pid="1019"} ${20 * 2 ** 30}`)
      expect(body).toContain(`cgn_agent_gpu_ecc_uncorrected_errors{${g0l}} 3`)
      expect(body).toContain('cgn_agent_gpu_lost{gpu="1",uuid=""} 1')
      expect(after).toContain(`cgn_agent_gpu_process_memory_bytes{${g0l},pid="1000"} ${2 ** 30}`)
      expect(after).not.toContain('pid="1019"')
      // a lost GPU reports nothing else
      expect(body).not.toMatch(/cgn_agent_gpu_memory_used_bytes\{gpu="1"/)
    } finally {
      delete process.env.FAKE_NVML_STATE
    }
  })

  it("reads throttling from a driver before 535, which exports only nvmlDeviceGetCurrentClocksThrottleReasons", async () => {
    // nvmlBinding.ts: "renamed in driver 535 (CUDA 12.2); the old name stays exported": the fake built with its
    // entry point under the old name is such a driver
    const old = buildFakeNvml(dir, ["nvmlDeviceGetCurrentClocksEventReasons=nvmlDeviceGetCurrentClocksThrottleReasons"])
    const state = path.join(dir, "state-pre-535")
    fs.writeFileSync(state, "gpu.0.throttle=0x49")
    process.env.FAKE_NVML_STATE = state
    try {
      const [g0] = await withProbe(
        { library: old },
        Effect.flatMap(Nvml, (n) => n.gpus)
      )
      expect(g0?.throttleReasons).toEqual(["hw_slowdown", "hw_thermal_slowdown"])
      expect(g0?.unreportedFields).toEqual([])
    } finally {
      delete process.env.FAKE_NVML_STATE
    }
  })

  it("takes the library path from CGN_NVML_LIBRARY", async () => {
    process.env.CGN_NVML_LIBRARY = library
    try {
      const count = await withProbe(
        {},
        Effect.flatMap(Nvml, (n) => Effect.map(n.gpus, (g) => g.length))
      )
      expect(count).toBe(2)
    } finally {
      delete process.env.CGN_NVML_LIBRARY
    }
  })

  it("runs on with no GPUs when the library is missing", async () => {
    const missing = path.join(dir, "no-such-libnvidia-ml.so.1")
    const workers = watchWorkers()
    const result = await withProbe(
      { library: missing, onWorker: workers.onWorker },
      Effect.gen(function* () {
        const nvml = yield* Nvml
        return {
          gpus: yield* nvml.gpus,
          unavailable: yield* nvml.unavailable,
          body: (yield* (yield* Metrics).render).body
        }
      })
    )
    expect(result.gpus).toEqual([])
    expect(result.unavailable).toContain(`cannot load ${missing}`)
    expect(result.body).not.toMatch(/cgn_agent_gpu_memory_total_bytes\{/)
    // the library is tried in the main thread first: a host without the driver pays for no worker thread
    expect(workers.started).toEqual([])
  })

  it("with no library configured, opens the driver's soname libnvidia-ml.so.1 (the bare .so is the -dev package's)", async () => {
    const configured = process.env.CGN_NVML_LIBRARY
    delete process.env.CGN_NVML_LIBRARY
    try {
      const unavailable = await withProbe(
        {},
        Effect.flatMap(Nvml, (n) => n.unavailable)
      )
      // a host without the driver (this test's usual one) says the name it tried; where the driver is installed,
      // the soname opens and nothing is said of the name
      if (unavailable?.startsWith("cannot load ")) expect(unavailable).toMatch(/^cannot load libnvidia-ml\.so\.1: /)
    } finally {
      if (configured !== undefined) process.env.CGN_NVML_LIBRARY = configured
    }
  })

  it("runs on with no GPUs when nvmlInit_v2 fails (driver not loaded)", async () => {
    process.env.FAKE_NVML_INIT_RC = "9"
    const workers = watchWorkers()
    try {
      const result = await withProbe(
        { library, onWorker: workers.onWorker },
        Effect.flatMap(Nvml, (n) =>
          Effect.zipWith(n.gpus, n.unavailable, (gpus, unavailable) => ({ gpus, unavailable }))
        )
      )
      expect(result.gpus).toEqual([])
      expect(result.unavailable).toBe("nvmlInit_v2 failed: NVML_ERROR_DRIVER_NOT_LOADED (9)")
      // the worker that failed to init is ended (terminated: exit code 1), not kept idle until the next try
      expect(workers.started).toHaveLength(1)
      expect(await workers.started[0]?.exit).toBe(1)
    } finally {
      delete process.env.FAKE_NVML_INIT_RC
    }
  })

  it("opens NVML once the driver answers (init failing at start), with backoff; nvml_up says which", async () => {
    process.env.FAKE_NVML_INIT_RC = "9"
    try {
      const result = await withProbe(
        { library, maxAge: 0, retryMax: "20 millis" },
        Effect.gen(function* () {
          const nvml = yield* Nvml
          const metrics = yield* Metrics
          const before = {
            gpus: yield* nvml.sampleNow,
            why: yield* nvml.unavailable,
            body: (yield* metrics.render).body
          }
          delete process.env.FAKE_NVML_INIT_RC // the driver is loaded now
          const gpus = yield* untilGpus(nvml.sampleNow)
          return { before, gpus, why: yield* nvml.unavailable, body: (yield* metrics.render).body }
        })
      )
      expect(result.before).toMatchObject({ gpus: [], why: "nvmlInit_v2 failed: NVML_ERROR_DRIVER_NOT_LOADED (9)" })
      expect(result.before.body).toContain("cgn_agent_nvml_up 0")
      expect(result.gpus.map((g) => g.index)).toEqual([0, 1])
      expect(result.why).toBeUndefined()
      expect(result.body).toMatch(/^cgn_agent_nvml_up 1$/m)
    } finally {
      delete process.env.FAKE_NVML_INIT_RC
    }
  })

  it("NVML that stops answering under a running agent is shut down and opened again", async () => {
    const shutdownFile = path.join(dir, "gone-shutdown.log")
    process.env.FAKE_NVML_SHUTDOWN_FILE = shutdownFile
    try {
      const result = await withProbe(
        { library, maxAge: 0, retryMax: "20 millis" },
        Effect.gen(function* () {
          const nvml = yield* Nvml
          const first = yield* nvml.sampleNow
          const up = (yield* (yield* Metrics).render).body
          process.env.FAKE_NVML_COUNT_RC = "999" // "Unknown Error" after hours
          const gone = {
            gpus: yield* nvml.sampleNow,
            why: yield* nvml.unavailable,
            body: (yield* (yield* Metrics).render).body
          }
          const shutdowns = fs.readFileSync(shutdownFile, "utf8")
          delete process.env.FAKE_NVML_COUNT_RC
          const back = yield* untilGpus(nvml.sampleNow)
          return { first, up, gone, shutdowns, back, why: yield* nvml.unavailable }
        })
      )
      expect(result.first).toHaveLength(2)
      expect(result.up).toContain('cgn_agent_gpu_lost{gpu="1",uuid="GPU-55555555-6666-7777-8888-999999999999"} 0')
      expect(result.gone).toMatchObject({
        gpus: [],
        why: "NVML stopped answering: nvmlDeviceGetCount_v2: NVML_ERROR_UNKNOWN (999)"
      })
      // No GPU series of the last good sample stays behind as if current, gpu_lost included.
      expect(result.gone.body).toContain("cgn_agent_nvml_up 0")
      expect(result.gone.body).not.toMatch(/^cgn_agent_gpu_\w+\{/m)
      expect(result.shutdowns).toBe("event_set_free\nshutdown\n")
      expect(result.back).toHaveLength(2)
      expect(result.why).toBeUndefined()
    } finally {
      delete process.env.FAKE_NVML_COUNT_RC
      delete process.env.FAKE_NVML_SHUTDOWN_FILE
    }
  })

  it("a hung NVML call blocks only the worker: readers get no GPUs at the deadline, nvml_up 0, until it answers", async () => {
    const shutdownFile = path.join(dir, "hung-shutdown.log")
    process.env.FAKE_NVML_SHUTDOWN_FILE = shutdownFile
    const workers = watchWorkers()
    let ticks = 0
    const ticker = setInterval(() => ticks++, 5)
    let hang: ReturnType<typeof blockNvml> | undefined
    try {
      const result = await withProbe(
        // a long maxAge: the cached list must follow the stall and the recovery at once all the same
        { library, maxAge: "1 hour", callTimeout: "200 millis", onWorker: workers.onWorker },
        Effect.gen(function* () {
          const nvml = yield* Nvml
          const metrics = yield* Metrics
          // the first answer may miss the short deadline on a loaded machine (worker start, nvmlInit): wait for it
          const first = yield* untilGpus(nvml.gpus)
          hang = blockNvml(path.join(dir, "nvml.block")) // a GPU falls off the bus: NVML calls hang
          const t0 = yield* Clock.currentTimeMillis
          const ticksBefore = ticks
          const stuck = yield* nvml.sampleNow
          const waitedMs = (yield* Clock.currentTimeMillis) - t0
          const ticked = ticks - ticksBefore
          // the call is still stuck: the next reader does not wait, and no second request queues behind it
          const t1 = yield* Clock.currentTimeMillis
          const again = yield* nvml.sampleNow
          const againMs = (yield* Clock.currentTimeMillis) - t1
          const during = { gpus: yield* nvml.gpus, why: yield* nvml.unavailable, body: (yield* metrics.render).body }
          hang.unblock()
          const back = yield* untilGpus(nvml.sampleNow)
          return {
            first,
            stuck,
            waitedMs,
            ticked,
            again,
            againMs,
            during,
            back,
            gpus: yield* nvml.gpus,
            why: yield* nvml.unavailable,
            body: (yield* metrics.render).body
          }
        })
      )
      expect(result.first).toHaveLength(2)
      expect(result.stuck).toEqual([])
      expect(result.waitedMs).toBeGreaterThanOrEqual(190)
      expect(result.waitedMs).toBeLessThan(2_000)
      // the event loop ran on while the call was stuck (every 5 ms over ~200 ms; blocked, it could not tick at all)
      expect(result.ticked).toBeGreaterThanOrEqual(5)
      expect(result.again).toEqual([])
      expect(result.againMs).toBeLessThan(200) // not a deadline: nothing was waited for
      expect(result.during.gpus).toEqual([])
      expect(result.during.why).toBe(
        "an NVML sample (an open, or one round of reads over every GPU) has taken over 200ms (a GPU off the bus?)"
      )
      expect(result.during.body).toContain("cgn_agent_nvml_up 0")
      expect(result.during.body).not.toMatch(/^cgn_agent_gpu_\w+\{/m)
      // the stuck call answered: the same worker samples again, nothing was re-opened
      expect(result.back).toHaveLength(2)
      expect(result.gpus).toHaveLength(2)
      expect(result.why).toBeUndefined()
      expect(result.body).toMatch(/^cgn_agent_nvml_up 1$/m)
      expect(workers.started).toHaveLength(1)
      expect(fs.readFileSync(shutdownFile, "utf8")).toBe("event_set_free\nshutdown\n")
    } finally {
      hang?.unblock()
      clearInterval(ticker)
      delete process.env.FAKE_NVML_SHUTDOWN_FILE
    }
  })

  it("a GPU whose UUID query fails keeps the UUID its index had this session (what is kept by UUID stays with it)", async () => {
    const state = path.join(dir, "state-uuid-later")
    fs.writeFileSync(state, "")
    process.env.FAKE_NVML_STATE = state
    try {
      const result = await withProbe(
        { library, maxAge: 0 },
        Effect.gen(function* () {
          const nvml = yield* Nvml
          const before = yield* nvml.sampleNow
          fs.writeFileSync(state, "gpu.1.uuid_rc=999\n")
          const after = yield* nvml.sampleNow
          return { before, after }
        })
      )
      expect(result.before[1]?.uuid).toBe("GPU-55555555-6666-7777-8888-999999999999")
      expect(result.after[1]).toEqual(result.before[1])
    } finally {
      delete process.env.FAKE_NVML_STATE
    }
  })

  it("a GPU that falls off the bus keeps the UUID and name it had, so the operator knows which to replace", async () => {
    const state = path.join(dir, "state-lost-later")
    fs.writeFileSync(state, "")
    process.env.FAKE_NVML_STATE = state
    try {
      const result = await withProbe(
        { library, maxAge: 0, retryMax: "20 millis" },
        Effect.gen(function* () {
          const nvml = yield* Nvml
          const before = yield* nvml.sampleNow
          fs.writeFileSync(state, "gpu.1.lost=1\n")
          const after = yield* nvml.sampleNow
          const body = (yield* (yield* Metrics).render).body
          // NVML opened again (a driver reloaded) enumerates anew: an index of the old session names nothing
          process.env.FAKE_NVML_COUNT_RC = "999"
          yield* nvml.sampleNow
          // ... while it does not answer, the GPU lost before stays lost on /metrics (its alert must not resolve)
          const down = (yield* (yield* Metrics).render).body
          delete process.env.FAKE_NVML_COUNT_RC
          const reopened = yield* untilGpus(nvml.sampleNow)
          return { before, after, body, down, reopened }
        })
      )
      expect(result.before[1]?.lost).toBe(false)
      expect(result.after[1]).toEqual(
        gpuWith({
          index: 1,
          lost: true,
          uuid: "GPU-55555555-6666-7777-8888-999999999999",
          name: "NVIDIA H100 80GB HBM3",
          // its identity is known from before, and its Xids (none) since it was registered for them; nothing else is
          unreportedFields: gpuFields.filter((f) => f !== "name" && f !== "uuid" && f !== "critical_xids")
        })
      )
      expect(result.after[0]).toEqual(result.before[0])
      expect(result.body).toContain('cgn_agent_gpu_lost{gpu="1",uuid="GPU-55555555-6666-7777-8888-999999999999"} 1')
      expect(result.down).toContain("cgn_agent_nvml_up 0")
      expect(result.down).toContain('cgn_agent_gpu_lost{gpu="1",uuid="GPU-55555555-6666-7777-8888-999999999999"} 1')
      expect(result.down).not.toContain('cgn_agent_gpu_lost{gpu="0"')
      expect(result.reopened[1]).toEqual(gpuWith({ index: 1, lost: true, unreportedFields: [...gpuFields] }))
    } finally {
      delete process.env.FAKE_NVML_COUNT_RC
      delete process.env.FAKE_NVML_STATE
    }
  })

  it.effect("the backoff between opens: none before it is due (from 1 s), and a success starts it again from 1 s", () =>
    // README: NVML is "opened again with backoff (from 1 s, capped at 1 min)"; each try is a worker thread and an
    // nvmlInit, which must not come at every sample where NVML keeps failing. Time is the TestClock's.
    Effect.suspend(() => {
      const workers = watchWorkers()
      process.env.FAKE_NVML_INIT_RC = "9"
      return Effect.gen(function* () {
        const nvml = yield* Nvml
        // the layer's first sample tried once; samples within the backoff (500 ms at least) try nothing
        yield* nvml.sampleNow
        yield* nvml.sampleNow
        expect(workers.started).toHaveLength(1)
        yield* TestClock.adjust("1 second") // past the first backoff (at most 1 s): tried again, failing
        yield* nvml.sampleNow
        expect(workers.started).toHaveLength(2)
        delete process.env.FAKE_NVML_INIT_RC
        yield* TestClock.adjust("2 seconds") // past the second (at most 2 s): opened
        expect(yield* nvml.sampleNow).toHaveLength(2)
        // the worker lost under a running agent: the backoff counts from a success, so at most 1 s again
        yield* Effect.promise(() => workers.started[2]!.worker.terminate())
        expect(yield* nvml.sampleNow).toEqual([])
        yield* TestClock.adjust("1 second")
        expect(yield* nvml.sampleNow).toHaveLength(2)
        expect(workers.started).toHaveLength(4)
      }).pipe(
        Effect.provide(
          NvmlLive.layer(nvmlWorkerEntry(), { library, maxAge: 0, onWorker: workers.onWorker }).pipe(
            Layer.provide(MetricsTest.layerTest)
          )
        ),
        Effect.ensuring(Effect.sync(() => delete process.env.FAKE_NVML_INIT_RC))
      )
    })
  )

  it("a worker thread that ends under a running agent is replaced at the next open, with backoff", async () => {
    const workers = watchWorkers()
    const result = await withProbe(
      { library, maxAge: 0, retryMax: "20 millis", onWorker: workers.onWorker },
      Effect.gen(function* () {
        const nvml = yield* Nvml
        const first = yield* nvml.sampleNow
        yield* Effect.promise(() => workers.started[0]!.worker.terminate()) // as an exception in it would
        const gone = { gpus: yield* nvml.sampleNow, why: yield* nvml.unavailable }
        const back = yield* untilGpus(nvml.sampleNow)
        return { first, gone, back, why: yield* nvml.unavailable }
      })
    )
    expect(result.first).toHaveLength(2)
    expect(result.gone).toEqual({ gpus: [], why: "NVML worker ended: exit code 1" })
    expect(result.back).toHaveLength(2)
    expect(result.why).toBeUndefined()
    expect(workers.started).toHaveLength(2)
  })

  it("a worker thread that throws: the exception's message is why NVML is not in use, not only its exit code", async () => {
    // nvmlThread.ts: an exception in the worker ends the worker, whose exit then settles the request in flight
    const program = path.join(dir, "throwing-worker.mjs")
    fs.writeFileSync(
      program,
      'import { parentPort } from "node:worker_threads"\nparentPort.on("message", () => { throw new Error("no NVML here") })\n'
    )
    const why = await Effect.runPromise(
      Effect.flatMap(Nvml, (n) => n.unavailable).pipe(
        Effect.provide(
          NvmlLive.layer(program, { library, retryMax: "1 hour" }).pipe(Layer.provide(MetricsTest.layerTest))
        )
      )
    )
    expect(why).toBe("NVML worker ended: no NVML here")
  })

  it("the worker thread's program loads koffi and nothing big (V8 keeps each module's source in the thread's heap)", () => {
    // the modules it loads at run time: value imports, followed from programs/nvmlWorker.ts
    const packages = new Set<string>()
    const seen = new Set<string>()
    const walk = (file: string) => {
      if (seen.has(file)) return
      seen.add(file)
      const source = fs.readFileSync(file, "utf8")
      // `import x from "m"`, `export * from "m"`, and `import "m"` (loaded for its side effects, no `from`)
      for (const m of source.matchAll(/^\s*(?:import|export)\s+(?!type\s)(?:[^"']*?\bfrom\s+)?["']([^"']+)["']/gm)) {
        const spec = m[1]!
        if (spec.startsWith(".")) walk(path.resolve(path.dirname(file), spec))
        else packages.add(spec.startsWith("@") ? spec.split("/").slice(0, 2).join("/") : spec.split("/")[0]!)
      }
    }
    walk(nvmlWorkerEntry())
    expect(seen.size).toBeGreaterThan(3)
    expect([...packages].sort()).toEqual(["koffi", "node:worker_threads"])
  })

  it("can be switched off", async () => {
    const unavailable = await withProbe(
      { library: "none" },
      Effect.flatMap(Nvml, (n) => n.unavailable)
    )
    expect(unavailable).toContain("disabled")
  })
})

describe("NvmlValues", () => {
  it("names NVML's return codes in problems and log lines, GPU_IS_LOST (15) included", () => {
    expect(nvmlReturnName(9)).toBe("NVML_ERROR_DRIVER_NOT_LOADED (9)")
    expect(nvmlReturnName(15)).toBe("NVML_ERROR_GPU_IS_LOST (15)")
    expect(nvmlReturnName(42)).toBe("NVML_RETURN (42)")
  })

  it("nameGpus fills a UUID this sample lacks from its index's identity; a name this sample did report stays", () => {
    const known = new Map<number, GpuIdentity>([
      [0, { uuid: "GPU-a", name: "Name before" }],
      [1, { uuid: "GPU-b", name: "NVIDIA H100 80GB HBM3" }]
    ])
    const named = nameGpus(
      [
        gpuWith({ index: 0, uuid: "", name: "Name now", unreportedFields: ["uuid"] }),
        gpuWith({ index: 1, uuid: "", name: "", unreportedFields: ["name", "uuid"] })
      ],
      known
    )
    expect(named).toEqual([
      gpuWith({ index: 0, uuid: "GPU-a", name: "Name now", unreportedFields: [] }),
      gpuWith({ index: 1, uuid: "GPU-b", name: "NVIDIA H100 80GB HBM3", unreportedFields: [] })
    ])
  })
})
