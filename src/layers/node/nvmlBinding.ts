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
  /** nvmlDeviceGetRemappedRows: rows remapped for correctable and uncorrectable errors, isPending, failureOccurred. */
  readonly remappedRows:
    | ((
        device: unknown,
        corrected: Array<number>,
        uncorrected: Array<number>,
        pending: Array<number>,
        failure: Array<number>
      ) => number)
    | undefined
  /**
   * nvmlDeviceGetRetiredPagesPendingStatus: whether memory pages wait for a GPU reset to be retired
   * (nvmlEnableState_t, 0 or 1). Dynamic page retirement, the boards before Ampere; NOT_SUPPORTED where rows are
   * remapped instead.
   */
  readonly retiredPagesPending: ((device: unknown, isPending: Array<number>) => number) | undefined
  /** The event-set entry points, all or none (Xid events: nvmlEvents.ts). */
  readonly events: EventBinding | undefined
  /** The MIG entry points, all or none (nvmlMig.ts); absent on a driver before R450, which has no MIG. */
  readonly mig?: MigBinding | undefined
  readonly unload: () => void
}

/**
 * NVML's event sets (nvml.h "Event Handling Methods"): create a set, register devices on it for event types, wait on
 * it (timeout in ms; 0 returns at once), free it.
 */
export interface EventBinding {
  readonly create: (out: Array<unknown>) => number
  readonly supported: (device: unknown, out: Array<number | bigint>) => number
  readonly register: (device: unknown, types: bigint, set: unknown) => number
  /** Fills `data` as nvmlEventData_t: device (its address), eventType, eventData (the Xid), gpuInstanceId... */
  readonly wait: (set: unknown, data: Record<string, unknown>, timeoutMs: number) => number
  readonly free: (set: unknown) => number
  /** A device handle's address, as nvmlEventData_t.device reads it (the fallback to `index`: nvmlEvents.ts). */
  readonly address: (device: unknown) => bigint
  /**
   * nvmlDeviceGetIndex on an event's device as read (its address): NVML's own index of the GPU an event came from.
   * Absent where the driver lacks it.
   */
  readonly index: ((device: bigint, out: Array<number>) => number) | undefined
}

/**
 * NVML's MIG queries (nvml.h "Multi Instance GPU Management"; signatures as in NVIDIA/go-nvml gen/nvml/nvml.h). A MIG
 * handle answers nvmlDeviceGetUUID and nvmlDeviceGetMemoryInfo as a GPU handle does (the Binding's `uuid`, `memory`).
 */
export interface MigBinding {
  /** nvmlDeviceGetMigMode: currentMode and pendingMode, NVML_DEVICE_MIG_DISABLE (0) or NVML_DEVICE_MIG_ENABLE (1). */
  readonly mode: (device: unknown, current: Array<number>, pending: Array<number>) => number
  /** nvmlDeviceGetMaxMigDeviceCount: the MIG device slots under a GPU (0 when MIG is off). */
  readonly maxCount: (device: unknown, out: Array<number>) => number
  /** nvmlDeviceGetMigDeviceHandleByIndex: NVML_ERROR_NOT_FOUND for a slot with no MIG device. */
  readonly handle: (device: unknown, index: number, out: Array<unknown>) => number
  /** nvmlDeviceGetGpuInstanceId and nvmlDeviceGetComputeInstanceId of a MIG handle. */
  readonly gpuInstanceId: (migDevice: unknown, out: Array<number>) => number
  readonly computeInstanceId: (migDevice: unknown, out: Array<number>) => number
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
  // nvmlEventData_t (nvml.h; the layout of NVIDIA/go-nvml gen/nvml/nvml.h). `device` is read as an address, to be
  // matched with the handles' (koffi.address): koffi gives each pointer it returns a new object.
  const eventData = koffi.struct({
    device: "uintptr_t",
    eventType: "unsigned long long",
    eventData: "unsigned long long",
    gpuInstanceId: "unsigned int",
    computeInstanceId: "unsigned int"
  })
  const eventSet = koffi.pointer(koffi.opaque())
  const uint = koffi.out(koffi.pointer("unsigned int"))
  const ull = koffi.out(koffi.pointer("unsigned long long"))
  const optional = <F>(make: () => F): F | undefined => {
    try {
      return make()
    } catch {
      return undefined // symbol not exported by this driver
    }
  }
  const waitOn = (name: string): EventBinding["wait"] =>
    lib.func(name, "int", [eventSet, koffi.out(koffi.pointer(eventData)), "unsigned int"])
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
    remappedRows: optional(() => lib.func("nvmlDeviceGetRemappedRows", "int", [device, uint, uint, uint, uint])),
    // nvmlEnableState_t is a C enum: an int
    retiredPagesPending: optional(() =>
      lib.func("nvmlDeviceGetRetiredPagesPendingStatus", "int", [device, koffi.out(koffi.pointer("int"))])
    ),
    events: optional(() => ({
      create: lib.func("nvmlEventSetCreate", "int", [koffi.out(koffi.pointer(eventSet))]),
      supported: lib.func("nvmlDeviceGetSupportedEventTypes", "int", [device, ull]),
      register: lib.func("nvmlDeviceRegisterEvents", "int", [device, "unsigned long long", eventSet]),
      // nvml.h maps nvmlEventSetWait to _v2 (go-nvml pkg/nvml/nvml.go #undef's it); an older driver has only the
      // first, which fills the same leading fields of the struct
      wait: optional(() => waitOn("nvmlEventSetWait_v2")) ?? waitOn("nvmlEventSetWait"),
      free: lib.func("nvmlEventSetFree", "int", [eventSet]),
      address: (d: unknown) => koffi.address(d),
      // the handle taken as the address nvmlEventData_t.device was read as: a pointer and a uintptr_t are passed
      // alike in the C ABI, and koffi makes no pointer object of an address
      index: optional(() => lib.func("nvmlDeviceGetIndex", "int", ["uintptr_t", uint]))
    })),
    mig: optional(() => ({
      mode: lib.func("nvmlDeviceGetMigMode", "int", [device, uint, uint]),
      maxCount: lib.func("nvmlDeviceGetMaxMigDeviceCount", "int", [device, uint]),
      handle: lib.func("nvmlDeviceGetMigDeviceHandleByIndex", "int", [
        device,
        "unsigned int",
        koffi.out(koffi.pointer(device))
      ]),
      gpuInstanceId: lib.func("nvmlDeviceGetGpuInstanceId", "int", [device, uint]),
      computeInstanceId: lib.func("nvmlDeviceGetComputeInstanceId", "int", [device, uint])
    })),
    unload: () => lib.unload()
  }
}
