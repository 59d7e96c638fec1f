// The live Nvml layer (layers/node/Nvml.ts) through the real FFI: a fake libnvidia-ml.so compiled from
// test/fixtures/fake_nvml.c with the system C compiler answers for two GPUs; a missing library and a failing
// nvmlInit_v2 leave no GPUs.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Effect, Layer, Schedule } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as NvmlLive from "../../src/layers/node/Nvml.ts"
import * as MetricsLayer from "../../src/layers/observability/Metrics.ts"
import { type Gpu, gpuWith, Nvml } from "../../src/services/node/Nvml.ts"
import { Metrics } from "../../src/services/observability/Metrics.ts"
import { buildFakeNvml } from "../support/nvml.ts"

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
  Effect.runPromise(use.pipe(Effect.provide(NvmlLive.layer(options).pipe(Layer.provideMerge(MetricsLayer.layerTest)))))

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
    try {
      const { gpus, unavailable, body } = await withProbe(
        { library },
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
          lost: false
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
          lost: false
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
      expect(fs.readFileSync(shutdownFile, "utf8")).toBe("shutdown\n")
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
      const { gpus, body } = await withProbe(
        { library },
        Effect.gen(function* () {
          const gpus = yield* (yield* Nvml).gpus
          return { gpus, body: (yield* (yield* Metrics).render).body }
        })
      )
      const [g0, g1] = gpus
      expect(g0?.processes).toHaveLength(20)
      expect(g0?.processes[19]).toEqual({ pid: 1019, usedMemoryBytes: 20 * 2 ** 30 })
      expect(g0?.eccUncorrected).toBe(3)
      // 0x49 = gpu_idle (left out) | hw_slowdown | hw_thermal_slowdown
      expect(g0?.throttleReasons).toEqual(["hw_slowdown", "hw_thermal_slowdown"])
      expect(g0?.temperatureCelsius).toBe(91)
      expect(g1).toEqual(gpuWith({ index: 1, lost: true }))
      const g0l = 'gpu="0",uuid="GPU-00000000-1111-2222-3333-444444444444"'
      expect(body).toContain(`cgn_agent_gpu_process_memory_bytes{${g0l},pid="1019"} ${20 * 2 ** 30}`)
      expect(body).toContain(`cgn_agent_gpu_ecc_uncorrected_errors{${g0l}} 3`)
      expect(body).toContain('cgn_agent_gpu_lost{gpu="1",uuid=""} 1')
      // a lost GPU reports nothing else
      expect(body).not.toMatch(/cgn_agent_gpu_memory_used_bytes\{gpu="1"/)
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
    const result = await withProbe(
      { library: missing },
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
  })

  it("runs on with no GPUs when nvmlInit_v2 fails (driver not loaded)", async () => {
    process.env.FAKE_NVML_INIT_RC = "9"
    try {
      const result = await withProbe(
        { library },
        Effect.flatMap(Nvml, (n) =>
          Effect.zipWith(n.gpus, n.unavailable, (gpus, unavailable) => ({ gpus, unavailable }))
        )
      )
      expect(result.gpus).toEqual([])
      expect(result.unavailable).toBe("nvmlInit_v2 failed: NVML_ERROR_DRIVER_NOT_LOADED (9)")
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
      expect(result.body).toContain("cgn_agent_nvml_up 1")
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
      expect(result.shutdowns).toBe("shutdown\n")
      expect(result.back).toHaveLength(2)
      expect(result.why).toBeUndefined()
    } finally {
      delete process.env.FAKE_NVML_COUNT_RC
      delete process.env.FAKE_NVML_SHUTDOWN_FILE
    }
  })

  it("can be switched off", async () => {
    const unavailable = await withProbe(
      { library: "none" },
      Effect.flatMap(Nvml, (n) => n.unavailable)
    )
    expect(unavailable).toContain("disabled")
  })
})
