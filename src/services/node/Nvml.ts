/**
 * Nvml: the GPUs of this host as NVML sees them (memory, utilization, temperature, power, throttling, ECC,
 * processes). Owns the service interface and the pure helpers around NVML return codes; the live layer is
 * layers/node/Nvml.ts (FFI binding: layers/node/nvmlBinding.ts). A host without NVML is a normal case:
 * `gpus` is then empty, never an error; and an NVML that fails (no driver yet, "Unknown Error" after hours, a
 * driver upgraded underneath) is opened again with backoff, never a reason to stop serving.
 */
import { Context, type Effect } from "effect"
import { Gpu } from "../../gen/cgn/agent/v1/agent.ts"

export type { Gpu } from "../../gen/cgn/agent/v1/agent.ts"

export interface NvmlService {
  /** The GPUs now (a sample at most `maxAge` old); empty on a host without NVML. */
  readonly gpus: Effect.Effect<ReadonlyArray<Gpu>>
  /** A sample taken now, for decisions that must not act on an old one (the GPU wait before a spawn). */
  readonly sampleNow: Effect.Effect<ReadonlyArray<Gpu>>
  /**
   * Why NVML is not in use now (library missing, init failed, NVML gone from under a running agent, disabled), or
   * undefined while it is. The live layer opens it again with backoff, so this changes over time.
   */
  readonly unavailable: Effect.Effect<string | undefined>
}

export class Nvml extends Context.Service<Nvml, NvmlService>()("cgn-agent/Nvml") {}

/** The library loaded when nothing else is configured (the driver ships it under this soname). */
export const DEFAULT_NVML_LIBRARY = "libnvidia-ml.so.1"

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

/** A GPU record with every field not given zero (a lost GPU, test fixtures): the generated defaults. */
export const gpuWith = (fields: Partial<Gpu> & { readonly index: number }): Gpu => Gpu.fromPartial(fields)

/** NVML gives 64-bit counters as number or bigint depending on size; the proto field is a number. */
export const toNumber = (v: unknown): number => (typeof v === "bigint" ? Number(v) : typeof v === "number" ? v : 0)
