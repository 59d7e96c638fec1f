/**
 * The compute processes NVML lists for one device handle: a whole GPU's (nvmlSample.ts) or a MIG device's
 * (nvmlMig.ts), each with the MIG instance it runs on. Runs in the NVML worker thread, synchronously, so it imports
 * nothing that loads `effect`.
 */
import type { GpuProcess } from "../../gen/cgn/agent/v1/agent.ts"
import { toNumber } from "../../services/node/NvmlValues.ts"
import type { Binding } from "./nvmlBinding.ts"

// nvml.h constants used below.
const NVML_ERROR_INSUFFICIENT_SIZE = 7
// nvml.h NVML_VALUE_NOT_AVAILABLE: usedGpuMemory when the driver cannot say (nvml.h nvmlProcessInfo_v2_t: always under
// WDDM; also without permission, and per process on MIG-enabled GPUs, where nvidia-smi shows it as "N/A").
const VALUE_NOT_AVAILABLE = 0xffffffffffffffffn
// nvml.h nvmlProcessInfo_v2_t: gpuInstanceId and computeInstanceId of a process not on a MIG instance.
const NOT_ON_MIG = 0xffffffff

/**
 * The compute processes on one device handle, by NVML's two-call protocol (ask the count, then fill); undefined when
 * NVML did not say (an empty list is a real answer: no process). `what` names the device in a failure's report.
 */
export const processesOf = (
  nvml: Binding,
  device: unknown,
  note: (what: string, rc: number) => void,
  what = ""
): Array<GpuProcess> | undefined => {
  if (nvml.processes === undefined) return undefined
  const call = `nvmlDeviceGetComputeRunningProcesses_v3${what}`
  const count = [0]
  let rc = nvml.processes(device, count, null)
  if (rc === 0) return []
  if (rc !== NVML_ERROR_INSUFFICIENT_SIZE) {
    note(call, rc)
    return undefined
  }
  // a process may start between the two calls: leave room for a few more
  const room = [(count[0] ?? 0) + 4]
  const infos: Array<unknown> = Array.from({ length: room[0]! }, () => ({}))
  rc = nvml.processes(device, room, infos)
  if (rc !== 0) {
    note(call, rc)
    return undefined
  }
  type Info = { pid: number; usedGpuMemory: number | bigint; gpuInstanceId: number; computeInstanceId: number }
  return (infos.slice(0, room[0]) as Array<Info>).map((p) => ({
    pid: p.pid,
    // 0 where NVML cannot say (the proto's GpuProcess.used_memory_bytes); the gate never takes it for free (Mig.ts)
    usedMemoryBytes: BigInt(p.usedGpuMemory) === VALUE_NOT_AVAILABLE ? 0 : toNumber(p.usedGpuMemory),
    // the MIG instance it runs on (the GPU gate tells an engine's instance from its neighbours' by them)
    ...(p.gpuInstanceId === NOT_ON_MIG ? {} : { gpuInstanceId: p.gpuInstanceId }),
    ...(p.computeInstanceId === NOT_ON_MIG ? {} : { computeInstanceId: p.computeInstanceId })
  }))
}
