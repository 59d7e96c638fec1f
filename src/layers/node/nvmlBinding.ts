/**
 * The libnvidia-ml entry points the GPU probe uses, bound through koffi (FFI, no nvidia-smi subprocess).
 * Entry points an older driver (or MIG, or a consumer board) may lack are optional and read as absent.
 */
type Koffi = typeof import("koffi")["default"]

/** The NVML entry points the probe calls, as koffi functions. */
export interface Binding {
  readonly init: () => number
  readonly shutdown: () => number
  readonly count: (out: Array<number>) => number
  readonly handle: (index: number, out: Array<unknown>) => number
  readonly name: (device: unknown, buf: Uint8Array, len: number) => number
  readonly uuid: (device: unknown, buf: Uint8Array, len: number) => number
  readonly memory: (device: unknown, out: Record<string, unknown>) => number
  readonly utilization: (device: unknown, out: Record<string, unknown>) => number
  // Optional entry points: older drivers (or MIG, or a consumer board) may lack them; a missing one is unreported.
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

/** Loads `library` and binds the entry points; throws when the library or a required symbol is missing. */
export const bind = (koffi: Koffi, library: string): Binding => {
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
