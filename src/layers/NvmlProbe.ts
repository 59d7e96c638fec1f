/**
 * NvmlProbe: the Nvml service over libnvidia-ml through koffi (FFI, no nvidia-smi subprocess).
 * Loads the library once, nvmlInit_v2 at acquire and nvmlShutdown at release; samples on demand, cached
 * for `maxAge`, and mirrors each sample into the GPU gauges at scrape time. Any failure to load or init
 * leaves the agent running with no GPUs and one log line saying why.
 */
import { Duration, Effect, Layer } from "effect"
import type { Gpu } from "../gen/cgn/agent/v1/agent.ts"
import { Metrics } from "../services/Metrics.ts"
import { cString, DEFAULT_NVML_LIBRARY, Nvml, type NvmlService, nvmlReturnName, toNumber } from "../services/Nvml.ts"

export interface NvmlOptions {
  /** Path or soname of the library; default: env CGN_NVML_LIBRARY, else libnvidia-ml.so.1. "" or "none": off. */
  readonly library?: string
  /** How old a sample may be before `gpus` takes a new one. Default 2 seconds. */
  readonly maxAge?: Duration.Input
}

// nvml.h: NVML_DEVICE_NAME_V2_BUFFER_SIZE and NVML_DEVICE_UUID_V2_BUFFER_SIZE are both 96.
const STRING_BUFFER = 96

type Koffi = typeof import("koffi")["default"]

interface Binding {
  readonly init: () => number
  readonly shutdown: () => number
  readonly count: (out: Array<number>) => number
  readonly handle: (index: number, out: Array<unknown>) => number
  readonly name: (device: unknown, buf: Uint8Array, len: number) => number
  readonly uuid: (device: unknown, buf: Uint8Array, len: number) => number
  readonly memory: (device: unknown, out: Record<string, unknown>) => number
  readonly utilization: (device: unknown, out: Record<string, unknown>) => number
  readonly unload: () => void
}

const bind = (koffi: Koffi, library: string): Binding => {
  const lib = koffi.load(library)
  // anonymous types: koffi's type names are process-global, and a second layer build must not clash
  const device = koffi.pointer(koffi.opaque())
  const memory = koffi.struct({ total: "unsigned long long", free: "unsigned long long", used: "unsigned long long" })
  const utilization = koffi.struct({ gpu: "unsigned int", memory: "unsigned int" })
  return {
    init: lib.func("nvmlInit_v2", "int", []),
    shutdown: lib.func("nvmlShutdown", "int", []),
    count: lib.func("nvmlDeviceGetCount_v2", "int", [koffi.out(koffi.pointer("unsigned int"))]),
    handle: lib.func("nvmlDeviceGetHandleByIndex_v2", "int", ["unsigned int", koffi.out(koffi.pointer(device))]),
    name: lib.func("nvmlDeviceGetName", "int", [device, "uint8_t *", "unsigned int"]),
    uuid: lib.func("nvmlDeviceGetUUID", "int", [device, "uint8_t *", "unsigned int"]),
    memory: lib.func("nvmlDeviceGetMemoryInfo", "int", [device, koffi.out(koffi.pointer(memory))]),
    utilization: lib.func("nvmlDeviceGetUtilizationRates", "int", [device, koffi.out(koffi.pointer(utilization))]),
    unload: () => lib.unload()
  }
}

/** One pass over the devices. Per-field failures (e.g. utilization unsupported under MIG) leave zeros. */
const sample = (nvml: Binding, problems: Set<string>): ReadonlyArray<Gpu> => {
  const note = (what: string, rc: number) => problems.add(`${what}: ${nvmlReturnName(rc)}`)
  const count = [0]
  const rc = nvml.count(count)
  if (rc !== 0) {
    note("nvmlDeviceGetCount_v2", rc)
    return []
  }
  const gpus: Array<Gpu> = []
  for (let index = 0; index < (count[0] ?? 0); index++) {
    const out: Array<unknown> = [null]
    const hrc = nvml.handle(index, out)
    if (hrc !== 0) {
      note(`nvmlDeviceGetHandleByIndex_v2(${index})`, hrc)
      continue
    }
    const device = out[0]
    const text = (fn: Binding["name"], what: string) => {
      const buf = new Uint8Array(STRING_BUFFER)
      const r = fn(device, buf, STRING_BUFFER)
      if (r !== 0) note(`${what}(${index})`, r)
      return r === 0 ? cString(buf) : ""
    }
    const mem: Record<string, unknown> = {}
    const mrc = nvml.memory(device, mem)
    if (mrc !== 0) note(`nvmlDeviceGetMemoryInfo(${index})`, mrc)
    const util: Record<string, unknown> = {}
    const urc = nvml.utilization(device, util)
    if (urc !== 0) note(`nvmlDeviceGetUtilizationRates(${index})`, urc)
    gpus.push({
      index,
      name: text(nvml.name, "nvmlDeviceGetName"),
      uuid: text(nvml.uuid, "nvmlDeviceGetUUID"),
      memoryTotalBytes: mrc === 0 ? toNumber(mem.total) : 0,
      memoryUsedBytes: mrc === 0 ? toNumber(mem.used) : 0,
      utilizationPercent: urc === 0 ? toNumber(util.gpu) : 0
    })
  }
  return gpus
}

const unavailable = (reason: string): Effect.Effect<NvmlService> =>
  Effect.logInfo("NVML not available; reporting no GPUs", { reason }).pipe(
    Effect.as({ gpus: Effect.succeed([]), unavailable: reason })
  )

const acquire = (library: string, maxAge: Duration.Input) =>
  Effect.gen(function* () {
    const koffi = yield* Effect.tryPromise(() => import("koffi")).pipe(Effect.option)
    if (koffi._tag === "None") return yield* unavailable("the koffi FFI module could not be loaded")
    let nvml: Binding
    try {
      nvml = bind(koffi.value.default, library)
    } catch (e) {
      return yield* unavailable(`cannot load ${library}: ${e instanceof Error ? e.message : String(e)}`)
    }
    const rc = nvml.init()
    if (rc !== 0) {
      nvml.unload()
      return yield* unavailable(`nvmlInit_v2 failed: ${nvmlReturnName(rc)}`)
    }
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        nvml.shutdown()
        nvml.unload()
      })
    )
    const logged = new Set<string>()
    const take = Effect.gen(function* () {
      const problems = new Set<string>()
      const gpus = sample(nvml, problems)
      // each distinct problem once per process: a GPU without utilization support must not flood the log
      for (const p of problems) {
        if (logged.has(p)) continue
        logged.add(p)
        yield* Effect.logWarning("NVML query failed", { problem: p })
      }
      return gpus
    })
    const gpus = yield* take.pipe(Effect.cachedWithTTL(maxAge))
    const first = yield* gpus
    yield* Effect.logInfo("NVML loaded", { library, gpus: first.length })
    return { gpus, unavailable: undefined } satisfies NvmlService
  })

/** Mirrors the GPU list into the gauges at every scrape. */
const mirrorToMetrics = (service: NvmlService) =>
  Effect.gen(function* () {
    const m = yield* Metrics
    yield* m.onCollect(
      Effect.map(service.gpus, (gpus) => {
        for (const g of gpus) {
          const labels = { gpu: String(g.index), uuid: g.uuid }
          m.gpuUtilization.set(labels, g.utilizationPercent / 100)
          m.gpuMemoryUsed.set(labels, g.memoryUsedBytes)
          m.gpuMemoryTotal.set(labels, g.memoryTotalBytes)
        }
      })
    )
  })

/** The live probe; needs Metrics for the GPU gauges. */
export const layer = (options: NvmlOptions = {}): Layer.Layer<Nvml, never, Metrics> =>
  Layer.effect(
    Nvml,
    Effect.gen(function* () {
      const library = options.library ?? process.env.CGN_NVML_LIBRARY ?? DEFAULT_NVML_LIBRARY
      const service =
        library === "" || library === "none"
          ? yield* unavailable("disabled (library set to none)")
          : yield* acquire(library, options.maxAge ?? Duration.seconds(2))
      yield* mirrorToMetrics(service)
      return service
    })
  )

/** A fixed GPU list, for tests of the services that read GPUs. */
export const layerFixed = (gpus: ReadonlyArray<Gpu>): Layer.Layer<Nvml> =>
  Layer.succeed(Nvml, { gpus: Effect.succeed(gpus), unavailable: gpus.length === 0 ? "fixed: none" : undefined })
