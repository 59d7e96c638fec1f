/**
 * Gpus: the pure decisions about the host's GPUs. Which GPUs the engine gets (configured or the first
 * healthy ones, or one MIG device: Mig.ts), the CUDA environment that says so, which GPU faults make the node
 * unhealthy, and whether the engine's GPUs are free enough to (re)start it. No I/O: NVML is read by
 * layers/node/Nvml.ts and the waiting is done by layers/engine/GpuGate.ts.
 */
import type { Gpu, GpuProcess } from "../../gen/cgn/agent/v1/agent.ts"
import {
  absentMig,
  assignMig,
  findMig,
  heldByProcesses,
  type MemoryUse,
  migProcesses,
  migRef,
  migRefProblem,
  migUsedMemory,
  notCounted,
  wholeMigProblem,
  wholeUsable
} from "./Mig.ts"
import { isUnknown } from "./NvmlValues.ts"
import { defaultXidRule, describeXid, type XidRule, xidIsFault } from "./Xid.ts"

/** A GPU as the config names it: an NVML index or a UUID (`GPU-...`, `MIG-...`). */
export type GpuRef = number | string

export const refMatches = (ref: GpuRef, gpu: Gpu): boolean =>
  typeof ref === "number" ? gpu.index === ref : gpu.uuid === ref

/**
 * A GPU the engine must not be started on: fallen off the bus, a critical Xid other than an application error this
 * boot (Xid.ts; kept across NVML sessions and agent restarts, XidLedger.ts), a failed or pending row remapping, a pending page retirement, or uncorrected ECC errors since
 * driver load. What NVML cannot report is no fault: ECC it cannot count (ECC off, a board without it), Xid events,
 * row remapping or page retirement a board does not support. Most such boards are fine, and refusing them would
 * refuse every GPU without the feature.
 * `rule`: the operator's changes to which Xids are faults (`[engine].ignore_xids`, `[engine].fault_xids`).
 */
export const gpuFault = (gpu: Gpu, rule: XidRule = defaultXidRule): string | undefined => {
  if (gpu.lost) return `GPU ${gpu.index} is lost (NVML_ERROR_GPU_IS_LOST: fallen off the bus)`
  const xids = gpu.criticalXids.filter((x) => xidIsFault(x.xid, rule))
  if (xids.length > 0) {
    return `GPU ${gpu.index} reported ${xids.map((x) => describeXid(x.xid)).join(", ")}: it needs a GPU reset or a reboot`
  }
  // NVML's row-remapping documentation: a failure means the GPU should be replaced; a pending remap is applied only
  // by a GPU reset (https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/, "Row-Remapping").
  if (gpu.rowRemapFailure) return `GPU ${gpu.index} has a failed row remapping: it needs replacing`
  if (gpu.eccUncorrected > 0) return `GPU ${gpu.index} has ${gpu.eccUncorrected} uncorrected ECC errors`
  if (gpu.rowRemapPending) return `GPU ${gpu.index} has a row remapping pending: it needs a GPU reset`
  // Dynamic page retirement, row remapping's forerunner on the boards before Ampere (V100, T4): a page marked for
  // retirement is retired only at the next GPU reset or reboot
  // (https://docs.nvidia.com/deploy/dynamic-page-retirement/); DCGM's memory health watch flags it (NVIDIA/DCGM
  // modules/health/DcgmHealthWatch.cpp, DCGM_FR_PENDING_PAGE_RETIREMENTS) and its diagnostics skip such a GPU, as
  // one with a row remapping pending.
  if (gpu.retiredPagesPending) {
    return `GPU ${gpu.index} has retired memory pages pending: it needs a GPU reset or a reboot`
  }
  return undefined
}

/** Why an assigned GPU absent from NVML's sample counts as a fault. */
export const missingGpu = (index: number): string =>
  `GPU ${index} is not in NVML's list (its handle query failed): it cannot be watched, so it is not used`

export type Assignment =
  | {
      readonly _tag: "Assigned"
      readonly indices: ReadonlyArray<number>
      readonly automatic: boolean
      /** The faults of the faulty GPUs an automatic choice took, too few being healthy (the gate holds the engine). */
      readonly faults?: ReadonlyArray<string>
      /** The MIG device given to the engine (its UUID), on the GPU `indices` names; absent: whole GPUs. */
      readonly mig?: string
    }
  /** NVML is absent and nothing is configured: the engine sees whatever the container gives it. */
  | { readonly _tag: "Unknown" }
  | { readonly _tag: "Impossible"; readonly reason: string }

/**
 * The engine's GPUs. Configured refs must all exist (when NVML lists GPUs) and none be in MIG mode (CUDA cannot use
 * one whole); otherwise the first `needed` healthy GPUs in index order, skipping GPUs in MIG mode and those whose MIG
 * mode NVML could not read. A configured MIG device (`MIG-...`) must be the only ref, for one worker (Mig.ts
 * migRefProblem), and resolves to the GPU that lists it (Mig.ts assignMig).
 * `gpus` empty means NVML is absent: configured indices are taken on trust, UUIDs too (they go into
 * CUDA_VISIBLE_DEVICES as written). `rule` says which Xids are faults (gpuFault).
 */
export const assignGpus = (
  configured: ReadonlyArray<GpuRef>,
  needed: number,
  gpus: ReadonlyArray<Gpu>,
  rule: XidRule = defaultXidRule
): Assignment => {
  const migProblem = migRefProblem(configured, needed)
  if (migProblem !== undefined) return { _tag: "Impossible", reason: migProblem }
  if (gpus.length === 0) {
    if (configured.length === 0) return { _tag: "Unknown" }
    const indices = configured.filter((r): r is number => typeof r === "number")
    return indices.length === configured.length ? { _tag: "Assigned", indices, automatic: false } : { _tag: "Unknown" }
  }
  const mig = migRef(configured)
  if (mig !== undefined) return assignMig(mig, gpus)
  if (configured.length > 0) {
    const indices: Array<number> = []
    for (const ref of configured) {
      const gpu = gpus.find((g) => refMatches(ref, g))
      // a UUID NVML cannot match while some GPU's UUID is unreadable (lost at NVML's open) may be that one: no refusal;
      // the engine gets the refs as written, and the gate holds it until NVML lists the UUID (unlistedRef)
      if (gpu === undefined && typeof ref === "string" && gpus.some((g) => g.uuid === "")) return { _tag: "Unknown" }
      if (gpu === undefined) {
        return {
          _tag: "Impossible",
          reason: `GPU ${JSON.stringify(ref)} is not on this host (NVML lists ${gpus.map((g) => `${g.index} ${g.uuid}`).join(", ")})`
        }
      }
      const whole = wholeMigProblem(ref, gpu)
      if (whole !== undefined) return { _tag: "Impossible", reason: whole }
      // Two spellings of one GPU (its index and its UUID): the config's own check sees only equal spellings.
      if (indices.includes(gpu.index))
        return { _tag: "Impossible", reason: `GPU ${gpu.index} is listed twice (also as ${JSON.stringify(ref)})` }
      indices.push(gpu.index)
    }
    return { _tag: "Assigned", indices, automatic: false }
  }
  // A GPU in MIG mode (or maybe in it) is not usable whole by CUDA: never picked (Mig.ts wholeUsable). A lost one is
  // (its MIG mode unreadable because it fell off the bus): it is the host's GPU, with a fault.
  const candidates = gpus.filter((g) => wholeUsable(g) || (g.lost && !g.migEnabled))
  const healthy = candidates.filter((g) => gpuFault(g, rule) === undefined)
  if (healthy.length >= needed)
    return { _tag: "Assigned", indices: healthy.slice(0, needed).map((g) => g.index), automatic: true }
  // Too few healthy GPUs, but enough: faulty ones fill in, and the gate holds the engine on their fault (node unhealthy,
  // agent up) until it clears (/gpus/clear-xids). Refusing instead made an agent restart after a fault a crash loop.
  if (candidates.length >= needed) {
    const filling = candidates.filter((g) => !healthy.includes(g)).slice(0, needed - healthy.length)
    const indices = [...healthy, ...filling].map((g) => g.index).sort((a, b) => a - b)
    return { _tag: "Assigned", indices, automatic: true, faults: filling.map((g) => gpuFault(g, rule) ?? "") }
  }
  return {
    _tag: "Impossible",
    reason: `the engine needs ${needed} GPUs (tp x dp) but this host has ${candidates.length} usable of ${gpus.length} (${healthy.length} healthy)${notCounted(gpus.filter((g) => !candidates.includes(g)))}`
  }
}

/**
 * The variables that give the engine its GPUs. CUDA numbers devices fastest-first unless told otherwise,
 * while NVML (and so the config's indices) counts in PCI bus order: CUDA_DEVICE_ORDER=PCI_BUS_ID makes the
 * two agree (CUDA Programming Guide, "CUDA Environment Variables").
 */
export const cudaEnv = (configured: ReadonlyArray<GpuRef>, assignment: Assignment): Record<string, string> => {
  if (assignment._tag === "Assigned") {
    // a MIG device is named by its UUID, the only way CUDA_VISIBLE_DEVICES takes one (CUDA Programming Guide, "CUDA
    // Environment Variables")
    const visible = assignment.mig ?? assignment.indices.join(",")
    return { CUDA_DEVICE_ORDER: "PCI_BUS_ID", CUDA_VISIBLE_DEVICES: visible }
  }
  // UUIDs without NVML to resolve them: CUDA accepts them as they are (indices among them count in PCI bus order).
  if (configured.length > 0)
    return {
      ...(configured.some((r) => typeof r === "number") ? { CUDA_DEVICE_ORDER: "PCI_BUS_ID" } : {}),
      CUDA_VISIBLE_DEVICES: configured.join(",")
    }
  return {}
}

/** A configured UUID NVML does not list (lost at its open: no UUID to match): holds the engine, as missingGpu does. */
export const unlistedRef = (configured: ReadonlyArray<GpuRef>, gpus: ReadonlyArray<Gpu>): string | undefined => {
  const ref = configured.find((r) => typeof r === "string" && !gpus.some((g) => refMatches(r, g)))
  if (ref === undefined) return undefined
  const unreadable = gpus.filter((g) => g.uuid === "").map((g) => g.index)
  const which = unreadable.length === 0 ? "" : ` (NVML cannot read GPU ${unreadable.join(", ")}'s UUID: lost?)`
  return `GPU ${JSON.stringify(ref)} is not among the GPUs NVML lists${which}: the engine waits until it is`
}

export interface Holder {
  readonly gpu: number
  /** The MIG device whose memory it holds (its GPU instance's), for an engine given one. */
  readonly mig?: string
  readonly pid: number
  readonly bytes: number
  /** The process belongs to an earlier run of this agent's engine (its process group). */
  readonly previousRun: boolean
}

export type GateVerdict =
  | { readonly _tag: "Free" }
  | { readonly _tag: "Held"; readonly reason: string; readonly holders: ReadonlyArray<Holder> }
  | { readonly _tag: "Faulty"; readonly reason: string }

const gib = (bytes: number): string => `${(bytes / 2 ** 30).toFixed(1)} GiB`

/**
 * The memory in use on a GPU as far as NVML tells: its memory info; where NVML cannot report that (unified-memory
 * boards such as GB10 answer nvmlDeviceGetMemoryInfo NOT_SUPPORTED for good, while their process list works:
 * https://github.com/kubernetes-sigs/dra-driver-nvidia-gpu/issues/1073), what its listed processes hold; unknown
 * (never free) when NVML reports neither.
 */
const usedMemory = (g: Gpu): MemoryUse => {
  if (!isUnknown(g, "memory_used_bytes")) return { bytes: g.memoryUsedBytes, byProcesses: false }
  return heldByProcesses(isUnknown(g, "processes") ? undefined : g.processes)
}

/** What the gate judges: a whole GPU, or the MIG device the engine is given with the GPU it is on. */
interface Unit {
  readonly label: string
  readonly gpu: number
  readonly mig: string | undefined
  /** The processes holding this unit's memory. */
  readonly processes: ReadonlyArray<GpuProcess>
  readonly used: MemoryUse
}

/**
 * Why the engine's devices cannot take a run whatever their memory, or undefined: an assigned GPU missing from NVML's
 * list (its handle query failed, or the device count did: not known to be free, so the start waits rather than put the
 * engine on a GPU nobody can see), a fault of one (gpuFault), or the assigned MIG device `mig` not in NVML's list
 * (Mig.ts absentMig: a list NVML could not read, or the device gone: its instance destroyed, MIG mode turned off). A
 * MIG device's faults are its GPU's: a lost board, its ECC errors and row remapping are the whole board's, and its
 * Xids are not told apart by instance here (NVIDIA
 * k8s-device-plugin internal/rm/health.go does, by the event's GpuInstanceId and ComputeInstanceId): conservative,
 * any Xid of the board holds the engine.
 */
export const engineFault = (
  gpus: ReadonlyArray<Gpu>,
  indices: ReadonlyArray<number>,
  rule: XidRule = defaultXidRule,
  mig?: string
): string | undefined => {
  // the GPU that lists the MIG device now (NVML's indices stay put within a session), else the one assigned
  const at = mig === undefined ? undefined : findMig(gpus, mig)?.gpu.index
  const mine = at === undefined ? indices : [at]
  const missing = mine.find((i) => !gpus.some((g) => g.index === i))
  if (missing !== undefined) return missingGpu(missing)
  for (const g of gpus.filter((x) => mine.includes(x.index))) {
    const fault = gpuFault(g, rule)
    if (fault !== undefined) return fault
  }
  return mig !== undefined && at === undefined ? absentMig(gpus, mig, indices) : undefined
}

/**
 * Whether the engine's GPUs can take a new run: none faulty, none holding a process of an earlier run, and
 * used memory on each at most `maxUsedBytes` (driver and other tenants' small contexts stay under it).
 * Memory NVML cannot report is never taken as 0: the listed processes' memory stands in for it, and a GPU that
 * reports neither cannot be judged free (the start waits, as for a GPU missing from NVML's list).
 * With `mig` (the engine's MIG device) what is judged is that device: its memory, the processes of its GPU instance
 * (Mig.ts migProcesses: its own per-instance lists, the GPU's aggregate list only where those are unreported); other
 * tenants' MIG devices on the same board do not hold the start (faults: engineFault).
 * `pgidOf` says which process group a pid is in (undefined when it is not visible from here); `rule` which Xids are
 * faults (gpuFault).
 */
export const gateVerdict = (
  gpus: ReadonlyArray<Gpu>,
  indices: ReadonlyArray<number>,
  maxUsedBytes: number,
  previousPgids: ReadonlySet<number>,
  pgidOf: (pid: number) => number | undefined,
  rule: XidRule = defaultXidRule,
  mig?: string
): GateVerdict => {
  const fault = engineFault(gpus, indices, rule, mig)
  if (fault !== undefined) return { _tag: "Faulty", reason: fault }
  const found = mig === undefined ? undefined : findMig(gpus, mig)
  const units: ReadonlyArray<Unit> =
    found !== undefined
      ? [
          {
            label: `MIG device ${found.device.uuid} (GPU ${found.gpu.index})`,
            gpu: found.gpu.index,
            mig: found.device.uuid,
            processes: migProcesses(found.gpu, found.device) ?? [],
            used: migUsedMemory(found.gpu, found.device)
          }
        ]
      : gpus
          .filter((g) => indices.includes(g.index))
          .map((g) => ({
            label: `GPU ${g.index}`,
            gpu: g.index,
            mig: undefined,
            processes: g.processes,
            used: usedMemory(g)
          }))
  const holders: Array<Holder> = units.flatMap((u) =>
    u.processes.map((p) => {
      const pgid = pgidOf(p.pid)
      return {
        gpu: u.gpu,
        ...(u.mig === undefined ? {} : { mig: u.mig }),
        pid: p.pid,
        bytes: p.usedMemoryBytes,
        previousRun: pgid !== undefined && previousPgids.has(pgid)
      }
    })
  )
  const leftovers = holders.filter((h) => h.previousRun)
  const full = units.flatMap((u) => {
    if ("unknown" in u.used || u.used.bytes <= maxUsedBytes) return []
    return u.used.byProcesses
      ? [
          `${u.label}'s processes hold ${gib(u.used.bytes)} (NVML reports no memory use for it; free below ${gib(maxUsedBytes)})`
        ]
      : [`${u.label} has ${gib(u.used.bytes)} in use (free below ${gib(maxUsedBytes)})`]
  })
  const unknown = units.flatMap((u) =>
    "unknown" in u.used ? [`${u.label}'s memory use is unknown (${u.used.unknown}): it cannot be judged free`] : []
  )
  if (leftovers.length === 0 && full.length === 0 && unknown.length === 0) return { _tag: "Free" }
  if (leftovers.length === 0 && full.length === 0) return { _tag: "Held", reason: unknown.join("; "), holders }
  const who =
    holders.length === 0
      ? "no process is listed (held by the driver or another container)"
      : holders
          .map(
            (h) =>
              `pid ${h.pid}${h.previousRun ? " (earlier engine run)" : ""} ${gib(h.bytes)} on ${h.mig ?? `GPU ${h.gpu}`}`
          )
          .join(", ")
  const what = full.length > 0 ? full.join("; ") : "a process of an earlier engine run still holds GPU memory"
  return { _tag: "Held", reason: [`${what}: ${who}`, ...unknown].join("; "), holders }
}
