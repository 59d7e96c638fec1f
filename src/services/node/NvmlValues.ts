/**
 * The pure values around NVML: return-code names, C strings, 64-bit counters, GPU records, the fields a GPU may
 * leave unknown, and the identity a lost GPU keeps. Free of `effect` on purpose: the NVML worker thread
 * (programs/nvmlWorker.ts) loads this module, and V8 keeps every loaded module's source in that thread's heap too
 * (Effect's is large: docs/bench.md, "Bundled entry"). services/node/Nvml.ts re-exports it for everyone else.
 */
import type { Gpu } from "../../gen/cgn/agent/v1/agent.ts"

/** NVML return codes we may see, by number (nvml.h `nvmlReturn_t`). */
const NVML_RETURN: Readonly<Record<number, string>> = {
  0: "SUCCESS",
  1: "ERROR_UNINITIALIZED",
  2: "ERROR_INVALID_ARGUMENT",
  3: "ERROR_NOT_SUPPORTED",
  4: "ERROR_NO_PERMISSION",
  6: "ERROR_NOT_FOUND",
  7: "ERROR_INSUFFICIENT_SIZE",
  9: "ERROR_DRIVER_NOT_LOADED",
  10: "ERROR_TIMEOUT",
  12: "ERROR_LIBRARY_NOT_FOUND",
  13: "ERROR_FUNCTION_NOT_FOUND",
  15: "ERROR_GPU_IS_LOST",
  17: "ERROR_OPERATING_SYSTEM",
  18: "ERROR_LIB_RM_VERSION_MISMATCH",
  999: "ERROR_UNKNOWN"
}

/** `NVML_ERROR_DRIVER_NOT_LOADED (9)`-style name of a return code, for log lines. */
export const nvmlReturnName = (code: number): string => `NVML_${NVML_RETURN[code] ?? "RETURN"} (${code})`

/** Decodes a NUL-terminated C string out of a fixed-size buffer. */
export const cString = (buf: Uint8Array): string => {
  const end = buf.indexOf(0)
  return new TextDecoder().decode(end < 0 ? buf : buf.subarray(0, end))
}

/** snake_case of a camelCase key: the proto field name a key of ts-proto's `Gpu` was made from. */
type ProtoName<S extends string> = S extends `${infer H}${infer T}`
  ? `${H extends Lowercase<H> ? H : `_${Lowercase<H>}`}${ProtoName<T>}`
  : S

/** A Gpu field NVML may be unable to report, by the proto field name `unreported_fields` lists it under. */
export type GpuField = Exclude<ProtoName<keyof Gpu & string>, "index" | "lost" | "unreported_fields">

// In proto field-number order (object keys keep it). A record, so that a field added to the proto fails to compile
// until it is placed here (or excluded above).
const FIELDS: Record<GpuField, true> = {
  name: true,
  uuid: true,
  memory_total_bytes: true,
  memory_used_bytes: true,
  utilization_percent: true,
  memory_free_bytes: true,
  temperature_celsius: true,
  power_watts: true,
  power_limit_watts: true,
  throttle_reasons: true,
  ecc_uncorrected: true,
  processes: true,
  critical_xids: true,
  row_remap_pending: true,
  row_remap_failure: true,
  retired_pages_pending: true,
  mig_enabled: true,
  mig_devices: true
}

/** Every field a GPU can leave unknown, in proto field-number order: what a lost GPU lists. */
export const gpuFields: ReadonlyArray<GpuField> = Object.keys(FIELDS) as Array<GpuField>

/** `unreported_fields` in one order (proto field numbers), whatever order the queries failed in. */
export const inFieldOrder = (fields: Iterable<GpuField>): Array<GpuField> => {
  const set = new Set(fields)
  return gpuFields.filter((f) => set.has(f))
}

/** Whether NVML could not report `field` for this GPU in its sample (it then reads 0 and means unknown). */
export const isUnknown = (gpu: Gpu, field: GpuField): boolean => gpu.unreportedFields.includes(field)

/**
 * A GPU record with every field not given zero (a lost GPU, test fixtures): proto3's defaults. Written out rather
 * than `Gpu.fromPartial` so that the worker thread does not load the generated messages and the protobuf runtime
 * (measured: 2.3 MiB of its RSS); typed `Gpu`, so a field added to the proto fails to compile until it is here.
 */
export const gpuWith = (fields: Partial<Gpu> & { readonly index: number }): Gpu => {
  const zero: Gpu = {
    index: 0,
    name: "",
    uuid: "",
    memoryTotalBytes: 0,
    memoryUsedBytes: 0,
    utilizationPercent: 0,
    memoryFreeBytes: 0,
    temperatureCelsius: 0,
    powerWatts: 0,
    powerLimitWatts: 0,
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
  }
  return { ...zero, ...fields }
}

/** NVML gives 64-bit counters as number or bigint depending on size; the proto field is a number. */
export const toNumber = (v: unknown): number => (typeof v === "bigint" ? Number(v) : typeof v === "number" ? v : 0)

/** What names a GPU to an operator: its UUID and model name. */
export interface GpuIdentity {
  readonly uuid: string
  readonly name: string
}

/**
 * A GPU fallen off the bus answers every query with NVML_ERROR_GPU_IS_LOST, its UUID and name included, yet it is
 * the board an operator must replace; a GPU whose UUID query failed this sample (a transient error) is still the
 * board its index named. Either, without a UUID, gets the identity its index had in an earlier sample, so that what
 * is kept by UUID (the Xids of the boot: XidLedger.ts) and the series labelled by it stay with the board.
 * `known` (index -> identity) is updated from the GPUs that answer; its holder keeps one per NVML session, since
 * indices are NVML's enumeration at init and may differ after a re-open (a driver reloaded, a GPU gone).
 */
export const nameGpus = (gpus: ReadonlyArray<Gpu>, known: Map<number, GpuIdentity>): ReadonlyArray<Gpu> => {
  for (const g of gpus) if (!g.lost && g.uuid !== "") known.set(g.index, { uuid: g.uuid, name: g.name })
  return gpus.map((g) => {
    const identity = g.uuid === "" ? known.get(g.index) : undefined
    if (identity === undefined) return g
    const name = g.name === "" ? identity.name : g.name
    // known after all: no longer listed as unknown (a name this sample did report stays as reported)
    const unreportedFields = g.unreportedFields.filter((f) => f !== "uuid" && !(f === "name" && g.name === ""))
    return { ...g, uuid: identity.uuid, name, unreportedFields }
  })
}
