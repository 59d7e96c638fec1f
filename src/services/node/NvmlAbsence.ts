/** NVML's `unavailable` reasons for a host with no NVML: a module of no imports, which the NVML worker thread loads too. */

const CANNOT_LOAD = "cannot load "

/**
 * The `unavailable` reasons that say this host has no NVML at all (switched off, no FFI module, its library not
 * loadable: a host without the NVIDIA driver, often on purpose: a CPU engine, a dev box), written by layers/node/Nvml.ts
 * and its worker; any other is an NVML that is there and fails or hangs (its driver not loaded yet, a GPU off the bus),
 * which will answer. `nvmlAbsent` reads them: the log says the first kind at info, the GPU gate waits for the second.
 */
export const NvmlAbsence = {
  disabled: "disabled (library set to none)",
  noFfi: "the koffi FFI module could not be loaded",
  cannotLoad: (library: string, why: string): string => `${CANNOT_LOAD}${library}: ${why}`
} as const

/** Whether NVML's `unavailable` reason says this host has no NVML (NvmlAbsence), rather than one that fails. */
export const nvmlAbsent = (unavailable: string): boolean =>
  unavailable === NvmlAbsence.disabled || unavailable === NvmlAbsence.noFfi || unavailable.startsWith(CANNOT_LOAD)
