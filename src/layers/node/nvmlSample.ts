/**
 * One pass of NVML queries over every device into the agent's Gpu records: memory, utilization,
 * temperature, power, throttle reasons, uncorrected ECC errors, compute processes (with their MIG instance), row
 * remapping, pending page retirement, MIG mode and MIG devices (nvmlMig.ts), and the Xid events of the session
 * (nvmlEvents.ts: each GPU registered at its first pass, pending events taken after the last). A field NVML does not
 * report (its query failed, NOT_SUPPORTED included, or its optional entry point is missing) reads 0 and is listed in
 * the GPU's `unreportedFields`, so that no reader takes it for a real 0 ("idle", "0 W"); MIG mode is the exception,
 * off (known) on a board or driver without MIG (nvmlMig.ts). Failures other than NOT_SUPPORTED are also collected as
 * problems. A GPU that answers
 * NVML_ERROR_GPU_IS_LOST is reported lost (by index only: the main thread names it from earlier samples, NvmlValues.ts
 * nameGpus). Runs in the NVML worker thread (programs/nvmlWorker.ts), synchronously, so it imports nothing that
 * loads `effect`.
 */
import type { Gpu } from "../../gen/cgn/agent/v1/agent.ts"
import {
  cString,
  type GpuField,
  gpuFields,
  gpuWith,
  inFieldOrder,
  nvmlReturnName,
  toNumber
} from "../../services/node/NvmlValues.ts"
import { throttleReasons } from "../../services/node/Throttle.ts"
import type { Binding } from "./nvmlBinding.ts"
import type { XidWatch } from "./nvmlEvents.ts"
import { migOf } from "./nvmlMig.ts"
import { processesOf } from "./nvmlProcesses.ts"

// nvml.h: NVML_DEVICE_NAME_V2_BUFFER_SIZE and NVML_DEVICE_UUID_V2_BUFFER_SIZE are both 96.
const STRING_BUFFER = 96

// nvml.h constants used below.
const NVML_TEMPERATURE_GPU = 0
const NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
const NVML_VOLATILE_ECC = 0
const NVML_ERROR_NOT_SUPPORTED = 3
const NVML_ERROR_GPU_IS_LOST = 15

// A lost GPU reports nothing: every field is unknown (name and uuid until the main thread fills them in).
const lostGpu = (index: number): Gpu => gpuWith({ index, lost: true, unreportedFields: [...gpuFields] })

/**
 * One pass over the devices. A field NVML does not report (e.g. utilization unsupported under MIG) reads 0 and is
 * listed in `unreportedFields`; a GPU that answers NVML_ERROR_GPU_IS_LOST to any query is reported as lost.
 */
export const sample = (
  nvml: Binding,
  problems: Set<string>,
  /** The device count was refused: NVML itself is not answering (its caller opens it again). */
  onNvmlGone: (why: string) => void = (why) => problems.add(why),
  /** The session's Xid events; without it no GPU's Xids are known (`critical_xids` unreported). */
  xids?: XidWatch
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
      const gpu = sampleOne(nvml, index, problems, xids)
      if (gpu !== undefined) gpus.push(gpu)
    } catch (e) {
      problems.add(`GPU ${index}: NVML call threw: ${e instanceof Error ? e.message : String(e)}`)
    }
  }
  if (xids === undefined) return gpus
  try {
    xids.drain(problems)
  } catch (e) {
    problems.add(`nvmlEventSetWait_v2 threw: ${e instanceof Error ? e.message : String(e)}`)
  }
  // A lost GPU keeps the Xids it reported (its Xid 79 says why it is lost): they are facts of the session.
  return gpus.map((g) =>
    xids.watched(g.index)
      ? {
          ...g,
          criticalXids: xids.xidsOf(g.index),
          unreportedFields: g.unreportedFields.filter((f) => f !== "critical_xids")
        }
      : g
  )
}

/** One device's record; undefined when its handle query failed (other than lost). */
const sampleOne = (
  nvml: Binding,
  index: number,
  problems: Set<string>,
  xids: XidWatch | undefined
): Gpu | undefined => {
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
  // The fields NVML did not report: each query that did not succeed, each optional entry point this driver lacks.
  const unknown: Array<GpuField> = []
  /** Runs one query (absent: the driver lacks its entry point); false, with `fields` unknown, unless it succeeded. */
  const query = (what: string, call: (() => number) | undefined, ...fields: Array<GpuField>): boolean => {
    const r = call === undefined ? NVML_ERROR_NOT_SUPPORTED : call()
    if (r === 0) return true
    note(what, r)
    unknown.push(...fields)
    return false
  }
  const text = (fn: Binding["name"], what: string, field: GpuField): string => {
    const buf = new Uint8Array(STRING_BUFFER)
    return query(what, () => fn(device, buf, STRING_BUFFER), field) ? cString(buf) : ""
  }
  const scalar = <T extends number | bigint>(
    what: string,
    field: GpuField,
    call: ((out: Array<T>) => number) | undefined,
    zero: T
  ): number => {
    const v: Array<T> = [zero]
    return query(what, call && (() => call(v)), field) ? toNumber(v[0]) : 0
  }
  const mem: Record<string, unknown> = {}
  const memoryKnown = query(
    "nvmlDeviceGetMemoryInfo",
    () => nvml.memory(device, mem),
    "memory_total_bytes",
    "memory_used_bytes",
    "memory_free_bytes"
  )
  const util: Record<string, unknown> = {}
  const utilKnown = query("nvmlDeviceGetUtilizationRates", () => nvml.utilization(device, util), "utilization_percent")
  const { temperature, power, powerLimit, throttle, ecc } = nvml
  const throttleMask: Array<number | bigint> = [0]
  const throttleKnown = query(
    "nvmlDeviceGetCurrentClocksEventReasons",
    throttle && (() => throttle(device, throttleMask)),
    "throttle_reasons"
  )
  const name = text(nvml.name, "nvmlDeviceGetName", "name")
  const uuid = text(nvml.uuid, "nvmlDeviceGetUUID", "uuid")
  const temperatureCelsius = scalar(
    "nvmlDeviceGetTemperature",
    "temperature_celsius",
    temperature && ((o: Array<number>) => temperature(device, NVML_TEMPERATURE_GPU, o)),
    0
  )
  const powerWatts =
    scalar("nvmlDeviceGetPowerUsage", "power_watts", power && ((o: Array<number>) => power(device, o)), 0) / 1000
  const powerLimitWatts =
    scalar(
      "nvmlDeviceGetEnforcedPowerLimit",
      "power_limit_watts",
      powerLimit && ((o: Array<number>) => powerLimit(device, o)),
      0
    ) / 1000
  const eccUncorrected = scalar(
    "nvmlDeviceGetTotalEccErrors",
    "ecc_uncorrected",
    ecc && ((o: Array<number | bigint>) => ecc(device, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, o)),
    0
  )
  const processes = processesOf(nvml, device, note)
  if (processes === undefined) unknown.push("processes")
  const { remappedRows } = nvml
  // isPending and failureOccurred; the counts of rows remapped (corrected, uncorrected) are not reported
  const pending = [0]
  const failure = [0]
  const remapKnown = query(
    "nvmlDeviceGetRemappedRows",
    remappedRows && (() => remappedRows(device, [0], [0], pending, failure)),
    "row_remap_pending",
    "row_remap_failure"
  )
  // dynamic page retirement (boards before Ampere); NOT_SUPPORTED where rows are remapped instead: unreported, silently
  const { retiredPagesPending } = nvml
  const pagesPending = [0]
  const pagesKnown = query(
    "nvmlDeviceGetRetiredPagesPendingStatus",
    retiredPagesPending && (() => retiredPagesPending(device, pagesPending)),
    "retired_pages_pending"
  )
  const mig = migOf(nvml, device, note)
  unknown.push(...mig.unknown)
  // the Xids themselves are filled in once the pass has taken the pending events (`sample`); a GPU lost by now
  // answers nothing, registration included (one registered before keeps its Xids)
  if (lost || xids?.watch(index, device, note) !== true) unknown.push("critical_xids")
  if (lost) return lostGpu(index)
  return {
    index,
    name,
    uuid,
    memoryTotalBytes: memoryKnown ? toNumber(mem.total) : 0,
    memoryUsedBytes: memoryKnown ? toNumber(mem.used) : 0,
    memoryFreeBytes: memoryKnown ? toNumber(mem.free) : 0,
    utilizationPercent: utilKnown ? toNumber(util.gpu) : 0,
    temperatureCelsius,
    powerWatts,
    powerLimitWatts,
    throttleReasons: throttleKnown ? [...throttleReasons(throttleMask[0] ?? 0)] : [],
    eccUncorrected,
    processes: processes ?? [],
    lost: false,
    unreportedFields: inFieldOrder(unknown),
    criticalXids: [],
    rowRemapPending: remapKnown && pending[0] !== 0,
    rowRemapFailure: remapKnown && failure[0] !== 0,
    retiredPagesPending: pagesKnown && pagesPending[0] !== 0,
    migEnabled: mig.enabled,
    migDevices: [...mig.devices]
  }
}
