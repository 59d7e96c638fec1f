/**
 * Mig: the pure facts about MIG (Multi-Instance GPU) devices the GPU decisions (Gpus.ts) and the config checks use:
 * which refs name a MIG device, how many an engine may have, which GPU holds one, which processes run on it, and
 * what memory it has in use. No I/O: NVML's MIG queries are made by layers/node/nvmlMig.ts.
 */
import type { Gpu, GpuProcess, MigDevice } from "../../gen/cgn/agent/v1/agent.ts"

/** Whether a configured GPU ref names a MIG device (`MIG-<uuid>`, or `MIG-GPU-<uuid>/<gi>/<ci>` before R470). */
export const isMigRef = (ref: number | string): ref is string => typeof ref === "string" && ref.startsWith("MIG-")

/** The MIG device `configured` gives the engine: its UUID when it names one MIG device and nothing else. */
export const migRef = (configured: ReadonlyArray<number | string>): string | undefined => {
  const [only] = configured
  return configured.length === 1 && only !== undefined && isMigRef(only) ? only : undefined
}

/**
 * NVIDIA MIG User Guide, "CUDA Device Enumeration" and "Running CUDA Applications on Bare-Metal"
 * (https://docs.nvidia.com/datacenter/tesla/mig-user-guide/mig-device-names.html): with CUDA 11/R450 and CUDA 12/R525
 * only the enumeration of a single MIG instance is supported, so a process asked for more (CUDA_VISIBLE_DEVICES
 * listing two MIG devices, or one beside a whole GPU) sees one of them at most.
 */
const ONE_MIG = "CUDA enumerates only one MIG device per process (NVIDIA MIG User Guide, CUDA device enumeration)"

/**
 * Why `configured` cannot be the devices of an engine with `needed` (tp x dp) workers because of a MIG device in it,
 * or undefined (no MIG device, or one alone for one worker). Known from the config alone: refused at load too
 * (layers/config/crossChecks.ts).
 */
export const migRefProblem = (configured: ReadonlyArray<number | string>, needed: number): string | undefined => {
  const migs = configured.filter(isMigRef)
  if (migs.length === 0) return undefined
  if (migs.length > 1) return `lists ${migs.length} MIG devices, but ${ONE_MIG}: give the engine one`
  if (configured.length > 1) {
    return `lists MIG device ${migs[0]} with whole GPUs, but ${ONE_MIG} and none beside a whole GPU: give the engine the MIG device alone`
  }
  if (needed > 1) {
    return `names MIG device ${migs[0]}, one CUDA device, but the engine needs tp x dp = ${needed} and ${ONE_MIG}: set tp and dp to 1`
  }
  return undefined
}

/** The MIG device `uuid` and the GPU that lists it in this sample, or undefined. */
export const findMig = (
  gpus: ReadonlyArray<Gpu>,
  uuid: string
): { readonly gpu: Gpu; readonly device: MigDevice } | undefined => {
  for (const gpu of gpus) {
    const device = gpu.migDevices.find((m) => m.uuid === uuid)
    if (device !== undefined) return { gpu, device }
  }
  return undefined
}

/** The MIG devices NVML lists, for a message saying a configured one is not among them. */
export const listedMigs = (gpus: ReadonlyArray<Gpu>): string => {
  const all = gpus.flatMap((g) => g.migDevices.map((m) => `${m.uuid} on GPU ${g.index}`))
  return all.length > 0 ? `NVML lists ${all.join(", ")}` : "NVML lists no MIG device: no GPU here is in MIG mode"
}

/** Why an assigned MIG device absent from NVML's sample keeps the engine from starting. */
export const missingMig = (uuid: string, gpu: number | undefined): string =>
  `MIG device ${uuid} is not in NVML's list${gpu === undefined ? "" : ` of GPU ${gpu}'s MIG devices`} (its instance destroyed, or MIG mode turned off): it cannot be watched, so it is not used`

/**
 * Whether process `p` of the MIG device's parent GPU holds memory of that MIG device: it runs in the same GPU
 * instance. The compute instances of a GPU instance share its memory (what nvmlDeviceGetMemoryInfo reports for the
 * MIG device), so a process on a sibling compute instance takes from the same memory and is one of its holders too;
 * with the usual one compute instance per GPU instance the two are the same.
 */
export const holdsMigMemory = (p: GpuProcess, device: MigDevice): boolean => p.gpuInstanceId === device.gpuInstanceId

/**
 * The memory in use on a MIG device as far as NVML tells: its memory info; where NVML could not report that, what its
 * GPU instance's listed processes hold; undefined when neither is known (the parent's process list unreported).
 */
export const migUsedMemory = (
  gpu: Gpu,
  device: MigDevice
): { readonly bytes: number; readonly byProcesses: boolean } | undefined => {
  if (!device.unreportedFields.includes("memory_used_bytes"))
    return { bytes: device.memoryUsedBytes, byProcesses: false }
  if (gpu.unreportedFields.includes("processes")) return undefined
  const held = gpu.processes.filter((p) => holdsMigMemory(p, device))
  return { bytes: held.reduce((sum, p) => sum + p.usedMemoryBytes, 0), byProcesses: true }
}
