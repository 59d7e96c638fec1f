/**
 * Mig: the pure facts about MIG (Multi-Instance GPU) devices the GPU decisions (Gpus.ts) and the config checks use:
 * which refs name a MIG device (both name forms), how many an engine may have, which GPU holds one, whether a GPU in
 * or maybe in MIG mode may be given whole, which processes run on one, and what memory it has in use. No I/O: NVML's
 * MIG queries are made by layers/node/nvmlMig.ts.
 */
import type { Gpu, GpuProcess, MigDevice } from "../../gen/cgn/agent/v1/agent.ts"
import type { Assignment } from "./Gpus.ts"

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

/**
 * The parts of a MIG device name of the form drivers before R470 gave (`MIG-GPU-<gpu uuid>/<gi>/<ci>`), which the
 * config accepts and NVML still resolves (NVIDIA/go-nvml issue #57), or undefined for another form. Parsed as NVIDIA
 * k8s-device-plugin internal/rm/health.go parseMigDeviceUUID does: the parent GPU's UUID, the GPU and compute
 * instance ids.
 */
export const legacyMigRef = (
  ref: string
): { readonly parent: string; readonly gi: number; readonly ci: number } | undefined => {
  const m = /^MIG-(GPU-[^/]+)\/(\d+)\/(\d+)$/.exec(ref)
  return m === null ? undefined : { parent: m[1]!, gi: Number(m[2]), ci: Number(m[3]) }
}

/**
 * The MIG device `ref` names and the GPU that lists it in this sample, or undefined: by UUID (`MIG-<uuid>`, what NVML
 * reports since R470), or by the parent GPU's UUID and the instance ids for the form before R470.
 */
export const findMig = (
  gpus: ReadonlyArray<Gpu>,
  ref: string
): { readonly gpu: Gpu; readonly device: MigDevice } | undefined => {
  const legacy = legacyMigRef(ref)
  for (const gpu of gpus) {
    const device =
      legacy === undefined
        ? gpu.migDevices.find((m) => m.uuid === ref)
        : gpu.uuid === legacy.parent
          ? gpu.migDevices.find(
              (m) => m.uuid === ref || (m.gpuInstanceId === legacy.gi && m.computeInstanceId === legacy.ci)
            )
          : undefined
    if (device !== undefined) return { gpu, device }
  }
  return undefined
}

const listed = (gpus: ReadonlyArray<Gpu>): ReadonlyArray<string> =>
  gpus.flatMap((g) => g.migDevices.map((m) => `${m.uuid} on GPU ${g.index}`))

/** The MIG devices NVML lists, for a message saying a configured one is not among them. */
export const listedMigs = (gpus: ReadonlyArray<Gpu>): string => {
  const all = listed(gpus)
  return all.length > 0 ? `NVML lists ${all.join(", ")}` : "NVML lists no MIG device: no GPU here is in MIG mode"
}

/**
 * Why GPU `gpu`, named whole in the config, cannot be the engine's: it is in MIG mode, which CUDA cannot use whole (it
 * enumerates the MIG devices instead: NVIDIA MIG User Guide, "CUDA Device Enumeration"); undefined otherwise.
 */
export const wholeMigProblem = (ref: number | string, gpu: Gpu): string | undefined => {
  if (!gpu.migEnabled) return undefined
  const mine = listed([gpu])
  const which = mine.length > 0 ? `NVML lists ${mine.join(", ")}` : `NVML lists none on GPU ${gpu.index}`
  return `GPU ${JSON.stringify(ref)} is in MIG mode, and CUDA cannot use a GPU in MIG mode whole (it enumerates its MIG devices instead: NVIDIA MIG User Guide, CUDA device enumeration): name one of its MIG devices instead (${which})`
}

/**
 * Whether the automatic choice may give GPU `g` whole: not in MIG mode, and its MIG mode known. A GPU whose mode query
 * failed with a real error (not NOT_SUPPORTED: layers/node/nvmlMig.ts) may be in MIG mode, which CUDA cannot use whole.
 */
export const wholeUsable = (g: Gpu): boolean => !g.migEnabled && !g.unreportedFields.includes("mig_enabled")

/** What the automatic choice left out for MIG (`; ...` each), for the message saying the host has too few GPUs. */
export const notCounted = (gpus: ReadonlyArray<Gpu>): string => {
  const inMig = gpus.filter((g) => g.migEnabled).map((g) => g.index)
  const unknown = gpus.filter((g) => !g.migEnabled && !wholeUsable(g)).map((g) => g.index)
  return [
    ...(inMig.length === 0
      ? []
      : [
          `; GPU ${inMig.join(", ")} in MIG mode, not counted (CUDA cannot use a GPU in MIG mode whole: name one of its MIG devices in gpus)`
        ]),
    ...(unknown.length === 0
      ? []
      : [`; GPU ${unknown.join(", ")} not counted: NVML could not read whether it is in MIG mode`])
  ].join("")
}

/**
 * The GPUs whose MIG devices NVML could not read completely this sample (`mig_devices` unreported) and that may hold
 * `ref` (for the form before R470, only its parent GPU).
 */
const unreadLists = (gpus: ReadonlyArray<Gpu>, ref: string): ReadonlyArray<Gpu> => {
  const legacy = legacyMigRef(ref)
  return gpus.filter(
    (g) => g.unreportedFields.includes("mig_devices") && (legacy === undefined || g.uuid === legacy.parent)
  )
}

/**
 * The engine's MIG device `ref` (Gpus.ts assignGpus, with NVML's GPUs): the GPU that lists it, CUDA given the UUID
 * NVML reports (`MIG-<uuid>`, whichever form the config wrote). Not listed while NVML could not read the MIG devices
 * of a GPU that may hold it (a transient failure, not a config error): assigned to those GPUs, the start gate holds
 * the engine until the list reads (engineFault); CUDA is given `ref` as written then. Not listed otherwise: not on
 * this host.
 */
export const assignMig = (ref: string, gpus: ReadonlyArray<Gpu>): Assignment => {
  const found = findMig(gpus, ref)
  if (found !== undefined)
    return { _tag: "Assigned", indices: [found.gpu.index], automatic: false, mig: found.device.uuid }
  const unread = unreadLists(gpus, ref)
  if (unread.length > 0) return { _tag: "Assigned", indices: unread.map((g) => g.index), automatic: false, mig: ref }
  return { _tag: "Impossible", reason: `MIG device ${ref} is not on this host (${listedMigs(gpus)})` }
}

/** Why an assigned MIG device absent from NVML's sample keeps the engine from starting. */
export const missingMig = (uuid: string, gpu: number | undefined): string =>
  `MIG device ${uuid} is not in NVML's list${gpu === undefined ? "" : ` of GPU ${gpu}'s MIG devices`} (its instance destroyed, or MIG mode turned off): it cannot be watched, so it is not used`

/** Why an assigned MIG device NVML may have left out of an incomplete list keeps the engine from starting. */
export const unreadMig = (uuid: string, gpus: ReadonlyArray<number>): string =>
  `NVML could not read GPU ${gpus.join(", ")}'s MIG devices (a MIG query failed), so MIG device ${uuid} cannot be found or watched: it is not used until they read`

/**
 * Why the MIG device `ref` given to the engine (on `indices`) is not in NVML's sample, or undefined when it is: a list
 * NVML could not read completely (unreadMig: failing closed, without blaming the instance), else gone (missingMig).
 */
export const absentMig = (
  gpus: ReadonlyArray<Gpu>,
  ref: string,
  indices: ReadonlyArray<number>
): string | undefined => {
  if (findMig(gpus, ref) !== undefined) return undefined
  const unread = unreadLists(gpus, ref).map((g) => g.index)
  if (unread.length > 0) {
    const assigned = unread.filter((i) => indices.includes(i))
    return unreadMig(ref, assigned.length > 0 ? assigned : unread)
  }
  return missingMig(ref, indices.length === 1 ? indices[0] : undefined)
}

/**
 * Whether process `p` holds memory of MIG device `device`: it runs in the same GPU instance. The compute instances of
 * a GPU instance share its memory (what nvmlDeviceGetMemoryInfo reports for the MIG device), so a process on a sibling
 * compute instance takes from the same memory and is one of its holders too; with the usual one compute instance per
 * GPU instance the two are the same.
 */
export const holdsMigMemory = (p: GpuProcess, device: MigDevice): boolean => p.gpuInstanceId === device.gpuInstanceId

/**
 * The processes holding MIG device `device`'s memory, or undefined when NVML did not list them. Asked of the MIG
 * devices of its GPU instance (nvmlMig.ts: the per-instance lists, which need no privilege), their lists merged; only
 * where one of those is unreported, the GPU's own list filtered to the GPU instance (the aggregate list, refused
 * without the privileges nvmlMig.ts names).
 */
export const migProcesses = (gpu: Gpu, device: MigDevice): ReadonlyArray<GpuProcess> | undefined => {
  const siblings = gpu.migDevices.filter((m) => m.gpuInstanceId === device.gpuInstanceId)
  if (siblings.every((m) => !m.unreportedFields.includes("processes"))) {
    const byPid = new Map<number, GpuProcess>()
    for (const p of siblings.flatMap((m) => m.processes)) if (!byPid.has(p.pid)) byPid.set(p.pid, p)
    return [...byPid.values()]
  }
  if (gpu.unreportedFields.includes("processes")) return undefined
  return gpu.processes.filter((p) => holdsMigMemory(p, device))
}

/** The memory in use on a device as far as NVML tells, or why it is unknown (never taken for free). */
export type MemoryUse = { readonly bytes: number; readonly byProcesses: boolean } | { readonly unknown: string }

/**
 * The memory in use on a MIG device as far as NVML tells: its memory info; where NVML could not report that, what its
 * GPU instance's processes hold (migProcesses); undefined when neither is known: the processes unlisted, or one of
 * them with its memory not available (NVML_VALUE_NOT_AVAILABLE, read as 0 by nvmlProcesses.ts: per process on
 * MIG-enabled GPUs it can be; a CUDA context always holds some), which must not read as free.
 */
export const migUsedMemory = (gpu: Gpu, device: MigDevice): MemoryUse => {
  if (!device.unreportedFields.includes("memory_used_bytes"))
    return { bytes: device.memoryUsedBytes, byProcesses: false }
  return heldByProcesses(migProcesses(gpu, device))
}

/**
 * The memory in use as the processes listed hold it, where NVML does not report the memory itself (a MIG device, a
 * unified-memory board); unknown when the list is unreported, or when a process's memory reads 0: NVML's "not
 * available" (on MIG-enabled GPUs among others), which must never pass for free memory.
 */
export const heldByProcesses = (held: ReadonlyArray<GpuProcess> | undefined): MemoryUse => {
  if (held === undefined) return { unknown: "NVML reports neither its memory nor its processes" }
  const na = held.filter((p) => p.usedMemoryBytes === 0)
  if (na.length > 0) {
    return {
      unknown: `NVML reports neither its memory nor what pid ${na.map((p) => p.pid).join(", ")} on it hold${na.length === 1 ? "s" : ""}`
    }
  }
  return { bytes: held.reduce((sum, p) => sum + p.usedMemoryBytes, 0), byProcesses: true }
}
