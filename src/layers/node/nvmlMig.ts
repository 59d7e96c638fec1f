/**
 * The MIG part of one GPU's sample (nvmlSample.ts): whether MIG mode is on, and its MIG devices (UUID, GPU and
 * compute instance ids, the instance's memory, the processes on it). Runs in the NVML worker thread, synchronously, so it imports nothing
 * that loads `effect`.
 */
import type { MigDevice } from "../../gen/cgn/agent/v1/agent.ts"
import { cString, type GpuField, toNumber } from "../../services/node/NvmlValues.ts"
import type { Binding } from "./nvmlBinding.ts"
import { processesOf } from "./nvmlProcesses.ts"

// nvml.h constants used below.
const NVML_DEVICE_MIG_ENABLE = 1
const NVML_ERROR_NOT_SUPPORTED = 3
const NVML_ERROR_NOT_FOUND = 6
const NVML_ERROR_FUNCTION_NOT_FOUND = 13
// nvml.h NVML_DEVICE_UUID_V2_BUFFER_SIZE
const UUID_BUFFER = 96

export interface MigSample {
  readonly enabled: boolean
  readonly devices: ReadonlyArray<MigDevice>
  /** The GPU's MIG fields NVML did not report (`unreported_fields`). */
  readonly unknown: ReadonlyArray<GpuField>
}

const OFF: MigSample = { enabled: false, devices: [], unknown: [] }

/**
 * MIG mode and the MIG devices of the GPU `device`. `note` is the GPU's failure report (nvmlSample.ts: a lost GPU,
 * a problem to log; NOT_SUPPORTED silently). A driver without the entry points predates MIG (R450) and a board
 * that answers NOT_SUPPORTED (or FUNCTION_NOT_FOUND) has none: MIG is off, known. A slot with no MIG device (NOT_FOUND) is skipped; a MIG
 * device whose handle, UUID or instance ids cannot be read is left out, and the list then said to be incomplete:
 * without them the device could be neither named in the config nor told apart from its neighbours.
 * Each MIG device's processes are asked of its own handle: nvml.h (nvmlDeviceGetComputeRunningProcesses) "In MIG
 * mode, if device handle is provided, the API returns aggregate information, only if the caller has appropriate
 * privileges. Per-instance information can be queried by using specific MIG device handles." In a container without
 * CAP_SYS_ADMIN and the mig/monitor capability (NVIDIA/nvidia-container-runtime README, NVIDIA_MIG_MONITOR_DEVICES)
 * the GPU's own list is refused or empty, and only these lists show an earlier run's process on the engine's device.
 */
export const migOf = (nvml: Binding, device: unknown, note: (what: string, rc: number) => void): MigSample => {
  const mig = nvml.mig
  if (mig === undefined) return OFF
  const current = [0]
  const rc = mig.mode(device, current, [0])
  if (rc === NVML_ERROR_NOT_SUPPORTED || rc === NVML_ERROR_FUNCTION_NOT_FOUND) return OFF
  // another failure: MIG mode unknown (the GPU may be in MIG mode), never taken for off: the automatic choice skips
  // such a GPU (Gpus.ts assignGpus)
  if (rc !== 0) {
    note("nvmlDeviceGetMigMode", rc)
    return { enabled: false, devices: [], unknown: ["mig_enabled", "mig_devices"] }
  }
  if (current[0] !== NVML_DEVICE_MIG_ENABLE) return OFF
  const count = [0]
  const crc = mig.maxCount(device, count)
  if (crc !== 0) {
    note("nvmlDeviceGetMaxMigDeviceCount", crc)
    return { enabled: true, devices: [], unknown: ["mig_devices"] }
  }
  const devices: Array<MigDevice> = []
  let incomplete = false
  /** One query of the MIG device in `slot`; false (reported, the list incomplete) unless it succeeded. */
  const ok = (what: string, slot: number, r: number): boolean => {
    if (r === 0) return true
    note(`${what} of MIG slot ${slot}`, r)
    incomplete = true
    return false
  }
  for (let slot = 0; slot < (count[0] ?? 0); slot++) {
    const out: Array<unknown> = [null]
    const hrc = mig.handle(device, slot, out)
    if (hrc === NVML_ERROR_NOT_FOUND) continue // no MIG device in this slot (nvml.h)
    if (!ok("nvmlDeviceGetMigDeviceHandleByIndex", slot, hrc)) continue
    const handle = out[0]
    const buf = new Uint8Array(UUID_BUFFER)
    const gi = [0]
    const ci = [0]
    if (!ok("nvmlDeviceGetUUID", slot, nvml.uuid(handle, buf, UUID_BUFFER))) continue
    if (!ok("nvmlDeviceGetGpuInstanceId", slot, mig.gpuInstanceId(handle, gi))) continue
    if (!ok("nvmlDeviceGetComputeInstanceId", slot, mig.computeInstanceId(handle, ci))) continue
    const mem: Record<string, unknown> = {}
    const mrc = nvml.memory(handle, mem)
    if (mrc !== 0) note(`nvmlDeviceGetMemoryInfo of MIG slot ${slot}`, mrc)
    const processes = processesOf(nvml, handle, note, ` of MIG slot ${slot}`)
    const unreported = [
      ...(mrc === 0 ? [] : ["memory_total_bytes", "memory_used_bytes"]),
      ...(processes === undefined ? ["processes"] : [])
    ]
    devices.push({
      uuid: cString(buf),
      gpuInstanceId: gi[0] ?? 0,
      computeInstanceId: ci[0] ?? 0,
      memoryTotalBytes: mrc === 0 ? toNumber(mem.total) : 0,
      memoryUsedBytes: mrc === 0 ? toNumber(mem.used) : 0,
      unreportedFields: unreported,
      processes: processes ?? []
    })
  }
  return { enabled: true, devices, unknown: incomplete ? ["mig_devices"] : [] }
}
