/**
 * One pass of NVML queries over every device into the agent's Gpu records: memory, utilization,
 * temperature, power, throttle reasons, uncorrected ECC errors and compute processes. Per-field failures
 * leave zeros and are collected as problems; a GPU that answers NVML_ERROR_GPU_IS_LOST is reported lost (by index
 * only: the main thread names it from earlier samples, NvmlValues.ts nameLostGpus). Runs in the NVML worker thread
 * (programs/nvmlWorker.ts), synchronously, so it imports nothing that loads `effect`.
 */
import type { Gpu, GpuProcess } from "../../gen/cgn/agent/v1/agent.ts"
import { throttleReasons } from "../../services/node/Gpus.ts"
import { cString, gpuWith, nvmlReturnName, toNumber } from "../../services/node/NvmlValues.ts"
import type { Binding } from "./nvmlBinding.ts"

// nvml.h: NVML_DEVICE_NAME_V2_BUFFER_SIZE and NVML_DEVICE_UUID_V2_BUFFER_SIZE are both 96.
const STRING_BUFFER = 96

// nvml.h constants used below.
const NVML_TEMPERATURE_GPU = 0
const NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
const NVML_VOLATILE_ECC = 0
const NVML_ERROR_NOT_SUPPORTED = 3
const NVML_ERROR_INSUFFICIENT_SIZE = 7
const NVML_ERROR_GPU_IS_LOST = 15
// nvml.h NVML_VALUE_NOT_AVAILABLE: usedGpuMemory when the driver cannot say (e.g. no permission).
const VALUE_NOT_AVAILABLE = 0xffffffffffffffffn

const lostGpu = (index: number): Gpu => gpuWith({ index, lost: true })

/** The compute processes on one GPU, by NVML's two-call protocol (ask the count, then fill). */
const processesOf = (nvml: Binding, device: unknown, note: (what: string, rc: number) => void): Array<GpuProcess> => {
  if (nvml.processes === undefined) return []
  const count = [0]
  let rc = nvml.processes(device, count, null)
  if (rc === 0) return []
  if (rc !== NVML_ERROR_INSUFFICIENT_SIZE) {
    note("nvmlDeviceGetComputeRunningProcesses_v3", rc)
    return []
  }
  // a process may start between the two calls: leave room for a few more
  const room = [(count[0] ?? 0) + 4]
  const infos: Array<unknown> = Array.from({ length: room[0]! }, () => ({}))
  rc = nvml.processes(device, room, infos)
  if (rc !== 0) {
    note("nvmlDeviceGetComputeRunningProcesses_v3", rc)
    return []
  }
  return (infos.slice(0, room[0]) as Array<{ pid: number; usedGpuMemory: number | bigint }>).map((p) => ({
    pid: p.pid,
    usedMemoryBytes: BigInt(p.usedGpuMemory) === VALUE_NOT_AVAILABLE ? 0 : toNumber(p.usedGpuMemory)
  }))
}

/**
 * One pass over the devices. Per-field failures (e.g. utilization unsupported under MIG) leave zeros; a GPU
 * that answers NVML_ERROR_GPU_IS_LOST to any query is reported as lost.
 */
export const sample = (
  nvml: Binding,
  problems: Set<string>,
  /** The device count was refused: NVML itself is not answering (its caller opens it again). */
  onNvmlGone: (why: string) => void = (why) => problems.add(why)
): ReadonlyArray<Gpu> => {
  const count = [0]
  let rc: number
  try {
    rc = nvml.count(count)
  } catch (e) {
    onNvmlGone(`nvmlDeviceGetCount_v2 threw: ${e instanceof Error ? e.message : String(e)}`)
    return []
  }
  if (rc !== 0) {
    onNvmlGone(`nvmlDeviceGetCount_v2: ${nvmlReturnName(rc)}`)
    return []
  }
  const gpus: Array<Gpu> = []
  for (let index = 0; index < (count[0] ?? 0); index++) {
    // A throw out of the FFI (a value koffi cannot convert, a driver answering outside its contract) costs this
    // GPU's record for this pass, as a failed handle query does, and is reported; it must not fail the sample:
    // every reader of the GPUs (NodeStatus, the etcd heartbeat, /metrics, the GPU gate) would fail with it.
    try {
      const gpu = sampleOne(nvml, index, problems)
      if (gpu !== undefined) gpus.push(gpu)
    } catch (e) {
      problems.add(`GPU ${index}: NVML call threw: ${e instanceof Error ? e.message : String(e)}`)
    }
  }
  return gpus
}

/** One device's record; undefined when its handle query failed (other than lost). */
const sampleOne = (nvml: Binding, index: number, problems: Set<string>): Gpu | undefined => {
  let lost = false
  const note = (what: string, code: number) => {
    if (code === NVML_ERROR_GPU_IS_LOST) lost = true
    else if (code !== NVML_ERROR_NOT_SUPPORTED) problems.add(`${what}(${index}): ${nvmlReturnName(code)}`)
  }
  const out: Array<unknown> = [null]
  const hrc = nvml.handle(index, out)
  if (hrc !== 0) {
    note("nvmlDeviceGetHandleByIndex_v2", hrc)
    return lost ? lostGpu(index) : undefined
  }
  const device = out[0]
  const text = (fn: Binding["name"], what: string) => {
    const buf = new Uint8Array(STRING_BUFFER)
    const r = fn(device, buf, STRING_BUFFER)
    if (r !== 0) note(what, r)
    return r === 0 ? cString(buf) : ""
  }
  const scalar = <T extends number | bigint>(
    what: string,
    call: ((out: Array<T>) => number) | undefined,
    zero: T
  ): number => {
    if (call === undefined) return 0
    const v: Array<T> = [zero]
    const r = call(v)
    if (r !== 0) note(what, r)
    return r === 0 ? toNumber(v[0]) : 0
  }
  const mem: Record<string, unknown> = {}
  const mrc = nvml.memory(device, mem)
  if (mrc !== 0) note("nvmlDeviceGetMemoryInfo", mrc)
  const util: Record<string, unknown> = {}
  const urc = nvml.utilization(device, util)
  if (urc !== 0) note("nvmlDeviceGetUtilizationRates", urc)
  const { temperature, power, powerLimit, throttle, ecc } = nvml
  const throttleMask: Array<number | bigint> = [0]
  const trc = throttle === undefined ? NVML_ERROR_NOT_SUPPORTED : throttle(device, throttleMask)
  if (trc !== 0) note("nvmlDeviceGetCurrentClocksEventReasons", trc)
  const gpu: Gpu = {
    index,
    name: text(nvml.name, "nvmlDeviceGetName"),
    uuid: text(nvml.uuid, "nvmlDeviceGetUUID"),
    memoryTotalBytes: mrc === 0 ? toNumber(mem.total) : 0,
    memoryUsedBytes: mrc === 0 ? toNumber(mem.used) : 0,
    memoryFreeBytes: mrc === 0 ? toNumber(mem.free) : 0,
    utilizationPercent: urc === 0 ? toNumber(util.gpu) : 0,
    temperatureCelsius: scalar(
      "nvmlDeviceGetTemperature",
      temperature && ((o: Array<number>) => temperature(device, NVML_TEMPERATURE_GPU, o)),
      0
    ),
    powerWatts: scalar("nvmlDeviceGetPowerUsage", power && ((o: Array<number>) => power(device, o)), 0) / 1000,
    powerLimitWatts:
      scalar("nvmlDeviceGetEnforcedPowerLimit", powerLimit && ((o: Array<number>) => powerLimit(device, o)), 0) / 1000,
    throttleReasons: trc === 0 ? [...throttleReasons(throttleMask[0] ?? 0)] : [],
    eccUncorrected: scalar(
      "nvmlDeviceGetTotalEccErrors",
      ecc && ((o: Array<number | bigint>) => ecc(device, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, o)),
      0
    ),
    processes: processesOf(nvml, device, note),
    lost: false
  }
  return lost ? lostGpu(index) : gpu
}
