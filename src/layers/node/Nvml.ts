/**
 * NvmlProbe: the Nvml service over libnvidia-ml through koffi (FFI, no nvidia-smi subprocess).
 * Loads the library once, nvmlInit_v2 at acquire and nvmlShutdown at release; samples on demand, cached
 * for `maxAge`, and mirrors each sample into the GPU gauges at scrape time. Any failure to load or init
 * leaves the agent running with no GPUs and one log line saying why.
 */
import { Duration, Effect, Layer } from "effect"
import type { Gpu, GpuProcess } from "../../gen/cgn/agent/v1/agent.ts"
import { throttleReasonNames, throttleReasons } from "../../services/node/Gpus.ts"
import {
  cString,
  DEFAULT_NVML_LIBRARY,
  gpuWith,
  Nvml,
  type NvmlService,
  nvmlReturnName,
  toNumber
} from "../../services/node/Nvml.ts"
import { Metrics } from "../../services/observability/Metrics.ts"

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
  // Optional entry points: older drivers (or MIG, or a consumer board) may lack them; a missing one reads as 0.
  readonly temperature: ((device: unknown, sensor: number, out: Array<number>) => number) | undefined
  readonly power: ((device: unknown, out: Array<number>) => number) | undefined
  readonly powerLimit: ((device: unknown, out: Array<number>) => number) | undefined
  readonly throttle: ((device: unknown, out: Array<number | bigint>) => number) | undefined
  readonly ecc:
    | ((device: unknown, errorType: number, counter: number, out: Array<number | bigint>) => number)
    | undefined
  readonly processes: ((device: unknown, count: Array<number>, infos: Array<unknown> | null) => number) | undefined
  readonly unload: () => void
}

// nvml.h constants used below.
const NVML_TEMPERATURE_GPU = 0
const NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
const NVML_VOLATILE_ECC = 0
const NVML_ERROR_NOT_SUPPORTED = 3
const NVML_ERROR_INSUFFICIENT_SIZE = 7
const NVML_ERROR_GPU_IS_LOST = 15
// nvml.h NVML_VALUE_NOT_AVAILABLE: usedGpuMemory when the driver cannot say (e.g. no permission).
const VALUE_NOT_AVAILABLE = 0xffffffffffffffffn

const bind = (koffi: Koffi, library: string): Binding => {
  const lib = koffi.load(library)
  // anonymous types: koffi's type names are process-global, and a second layer build must not clash
  const device = koffi.pointer(koffi.opaque())
  const memory = koffi.struct({ total: "unsigned long long", free: "unsigned long long", used: "unsigned long long" })
  const utilization = koffi.struct({ gpu: "unsigned int", memory: "unsigned int" })
  // nvmlProcessInfo_v2_t, the layout nvmlDeviceGetComputeRunningProcesses_v3 fills
  const processInfo = koffi.struct({
    pid: "unsigned int",
    usedGpuMemory: "unsigned long long",
    gpuInstanceId: "unsigned int",
    computeInstanceId: "unsigned int"
  })
  const uint = koffi.out(koffi.pointer("unsigned int"))
  const ull = koffi.out(koffi.pointer("unsigned long long"))
  const optional = <F>(make: () => F): F | undefined => {
    try {
      return make()
    } catch {
      return undefined // symbol not exported by this driver
    }
  }
  return {
    init: lib.func("nvmlInit_v2", "int", []),
    shutdown: lib.func("nvmlShutdown", "int", []),
    count: lib.func("nvmlDeviceGetCount_v2", "int", [uint]),
    handle: lib.func("nvmlDeviceGetHandleByIndex_v2", "int", ["unsigned int", koffi.out(koffi.pointer(device))]),
    name: lib.func("nvmlDeviceGetName", "int", [device, "uint8_t *", "unsigned int"]),
    uuid: lib.func("nvmlDeviceGetUUID", "int", [device, "uint8_t *", "unsigned int"]),
    memory: lib.func("nvmlDeviceGetMemoryInfo", "int", [device, koffi.out(koffi.pointer(memory))]),
    utilization: lib.func("nvmlDeviceGetUtilizationRates", "int", [device, koffi.out(koffi.pointer(utilization))]),
    temperature: optional(() => lib.func("nvmlDeviceGetTemperature", "int", [device, "int", uint])),
    power: optional(() => lib.func("nvmlDeviceGetPowerUsage", "int", [device, uint])),
    powerLimit: optional(() => lib.func("nvmlDeviceGetEnforcedPowerLimit", "int", [device, uint])),
    // renamed in driver 535 (CUDA 12.2); the old name stays exported, deprecated
    throttle:
      optional(() => lib.func("nvmlDeviceGetCurrentClocksEventReasons", "int", [device, ull])) ??
      optional(() => lib.func("nvmlDeviceGetCurrentClocksThrottleReasons", "int", [device, ull])),
    ecc: optional(() => lib.func("nvmlDeviceGetTotalEccErrors", "int", [device, "int", "int", ull])),
    processes: optional(() =>
      lib.func("nvmlDeviceGetComputeRunningProcesses_v3", "int", [
        device,
        koffi.inout(koffi.pointer("unsigned int")),
        koffi.out(koffi.pointer(processInfo))
      ])
    ),
    unload: () => lib.unload()
  }
}

const lostGpu = (index: number): Gpu => gpuWith({ index, lost: true })

/** The compute processes on one GPU, by NVML's two-call protocol (ask the count, then fill). */
const processesOf = (nvml: Binding, device: unknown, note: (what: string, rc: number) => void): Array<GpuProcess> => {
  if (nvml.processes === undefined) return []
  const count = [0]
  let rc = nvml.processes(device, count, null)
  if (rc === 0) return []
  if (rc !== NVML_ERROR_INSUFFICIENT_SIZE) {
    note("nvmlDeviceGetComputeRunningProcesses_v3", rc)
    return []
  }
  // a process may start between the two calls: leave room for a few more
  const room = [(count[0] ?? 0) + 4]
  const infos: Array<unknown> = Array.from({ length: room[0]! }, () => ({}))
  rc = nvml.processes(device, room, infos)
  if (rc !== 0) {
    note("nvmlDeviceGetComputeRunningProcesses_v3", rc)
    return []
  }
  return (infos.slice(0, room[0]) as Array<{ pid: number; usedGpuMemory: number | bigint }>).map((p) => ({
    pid: p.pid,
    usedMemoryBytes: BigInt(p.usedGpuMemory) === VALUE_NOT_AVAILABLE ? 0 : toNumber(p.usedGpuMemory)
  }))
}

/**
 * One pass over the devices. Per-field failures (e.g. utilization unsupported under MIG) leave zeros; a GPU
 * that answers NVML_ERROR_GPU_IS_LOST to any query is reported as lost.
 */
const sample = (nvml: Binding, problems: Set<string>): ReadonlyArray<Gpu> => {
  const count = [0]
  const rc = nvml.count(count)
  if (rc !== 0) {
    problems.add(`nvmlDeviceGetCount_v2: ${nvmlReturnName(rc)}`)
    return []
  }
  const gpus: Array<Gpu> = []
  for (let index = 0; index < (count[0] ?? 0); index++) {
    let lost = false
    const note = (what: string, code: number) => {
      if (code === NVML_ERROR_GPU_IS_LOST) lost = true
      else if (code !== NVML_ERROR_NOT_SUPPORTED) problems.add(`${what}(${index}): ${nvmlReturnName(code)}`)
    }
    const out: Array<unknown> = [null]
    const hrc = nvml.handle(index, out)
    if (hrc !== 0) {
      note("nvmlDeviceGetHandleByIndex_v2", hrc)
      if (lost) gpus.push(lostGpu(index))
      continue
    }
    const device = out[0]
    const text = (fn: Binding["name"], what: string) => {
      const buf = new Uint8Array(STRING_BUFFER)
      const r = fn(device, buf, STRING_BUFFER)
      if (r !== 0) note(what, r)
      return r === 0 ? cString(buf) : ""
    }
    const scalar = <T extends number | bigint>(
      what: string,
      call: ((out: Array<T>) => number) | undefined,
      zero: T
    ): number => {
      if (call === undefined) return 0
      const v: Array<T> = [zero]
      const r = call(v)
      if (r !== 0) note(what, r)
      return r === 0 ? toNumber(v[0]) : 0
    }
    const mem: Record<string, unknown> = {}
    const mrc = nvml.memory(device, mem)
    if (mrc !== 0) note("nvmlDeviceGetMemoryInfo", mrc)
    const util: Record<string, unknown> = {}
    const urc = nvml.utilization(device, util)
    if (urc !== 0) note("nvmlDeviceGetUtilizationRates", urc)
    const { temperature, power, powerLimit, throttle, ecc } = nvml
    const throttleMask: Array<number | bigint> = [0]
    const trc = throttle === undefined ? NVML_ERROR_NOT_SUPPORTED : throttle(device, throttleMask)
    if (trc !== 0) note("nvmlDeviceGetCurrentClocksEventReasons", trc)
    const gpu: Gpu = {
      index,
      name: text(nvml.name, "nvmlDeviceGetName"),
      uuid: text(nvml.uuid, "nvmlDeviceGetUUID"),
      memoryTotalBytes: mrc === 0 ? toNumber(mem.total) : 0,
      memoryUsedBytes: mrc === 0 ? toNumber(mem.used) : 0,
      memoryFreeBytes: mrc === 0 ? toNumber(mem.free) : 0,
      utilizationPercent: urc === 0 ? toNumber(util.gpu) : 0,
      temperatureCelsius: scalar(
        "nvmlDeviceGetTemperature",
        temperature && ((o: Array<number>) => temperature(device, NVML_TEMPERATURE_GPU, o)),
        0
      ),
      powerWatts: scalar("nvmlDeviceGetPowerUsage", power && ((o: Array<number>) => power(device, o)), 0) / 1000,
      powerLimitWatts:
        scalar("nvmlDeviceGetEnforcedPowerLimit", powerLimit && ((o: Array<number>) => powerLimit(device, o)), 0) /
        1000,
      throttleReasons: trc === 0 ? [...throttleReasons(throttleMask[0] ?? 0)] : [],
      eccUncorrected: scalar(
        "nvmlDeviceGetTotalEccErrors",
        ecc && ((o: Array<number | bigint>) => ecc(device, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, o)),
        0
      ),
      processes: processesOf(nvml, device, note),
      lost: false
    }
    gpus.push(lost ? lostGpu(index) : gpu)
  }
  return gpus
}

const unavailable = (reason: string): Effect.Effect<NvmlService> =>
  Effect.logInfo("NVML not available; reporting no GPUs", { reason }).pipe(
    Effect.as({ gpus: Effect.succeed([]), sampleNow: Effect.succeed([]), unavailable: reason })
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
    return { gpus, sampleNow: take, unavailable: undefined } satisfies NvmlService
  })

/** Mirrors the GPU list into the gauges at every scrape. */
const mirrorToMetrics = (service: NvmlService) =>
  Effect.gen(function* () {
    const m = yield* Metrics
    yield* m.onCollect(
      Effect.map(service.gpus, (gpus) => {
        // per-process series come and go with the processes; a lost GPU keeps only gpu_lost
        for (const g of [m.gpuUtilization, m.gpuMemoryUsed, m.gpuMemoryTotal, m.gpuTemperature, m.gpuPower]) g.reset()
        m.gpuPowerLimit.reset()
        m.gpuThrottled.reset()
        m.gpuEccUncorrected.reset()
        m.gpuProcessMemory.reset()
        for (const g of gpus) {
          const labels = { gpu: String(g.index), uuid: g.uuid }
          m.gpuLost.set(labels, g.lost ? 1 : 0)
          if (g.lost) continue
          m.gpuUtilization.set(labels, g.utilizationPercent / 100)
          m.gpuMemoryUsed.set(labels, g.memoryUsedBytes)
          m.gpuMemoryTotal.set(labels, g.memoryTotalBytes)
          m.gpuTemperature.set(labels, g.temperatureCelsius)
          m.gpuPower.set(labels, g.powerWatts)
          m.gpuPowerLimit.set(labels, g.powerLimitWatts)
          m.gpuEccUncorrected.set(labels, g.eccUncorrected)
          for (const reason of throttleReasonNames) {
            m.gpuThrottled.set({ ...labels, reason }, g.throttleReasons.includes(reason) ? 1 : 0)
          }
          for (const p of g.processes) m.gpuProcessMemory.set({ ...labels, pid: String(p.pid) }, p.usedMemoryBytes)
        }
      })
    )
  })

const open = (options: NvmlOptions) => {
  const library = options.library ?? process.env.CGN_NVML_LIBRARY ?? DEFAULT_NVML_LIBRARY
  return library === "" || library === "none"
    ? unavailable("disabled (library set to none)")
    : acquire(library, options.maxAge ?? Duration.seconds(2))
}

/** The live probe; needs Metrics for the GPU gauges. */
export const layer = (options: NvmlOptions = {}): Layer.Layer<Nvml, never, Metrics> =>
  Layer.effect(Nvml, Effect.tap(open(options), mirrorToMetrics))

/** The probe without gauges, for the CLI (`check`, `render`), which has no registry. */
export const layerBare = (options: NvmlOptions = {}): Layer.Layer<Nvml> => Layer.effect(Nvml, open(options))

/** A fixed GPU list, for tests of the services that read GPUs. */
export const layerFixed = (gpus: ReadonlyArray<Gpu>): Layer.Layer<Nvml> =>
  Layer.succeed(Nvml, {
    gpus: Effect.succeed(gpus),
    sampleNow: Effect.succeed(gpus),
    unavailable: gpus.length === 0 ? "fixed: none" : undefined
  })
