/**
 * Which Xid errors make a GPU faulty, as one table of data. NVML delivers Xids as critical-error events
 * (nvmlEventTypeXidCriticalError; layers/node/nvmlEvents.ts reads them), application errors among them: a kernel's
 * illegal memory access (Xid 31) or an engine exception (Xid 13) kills that process, and the GPU is fine. The rule is
 * NVIDIA k8s-device-plugin's (internal/rm/health.go, getDisabledHealthCheckXids): every Xid is a fault but its
 * hard-coded application errors 13, 31, 43, 45, 68 and 109, which it ignores ("the GPU should still be healthy").
 * A fault Xid stays a fault until the GPU is reset (nvidia-smi -r) or the host reboots, which no event announces: the
 * agent keeps the boot's Xids across NVML sessions and its own restarts (XidLedger.ts) until the operator clears them.
 * The device plugin keeps the device unhealthy until the plugin restarts.
 * The operator can move Xids either way (`[engine].ignore_xids`, `[engine].fault_xids`: XidRule below), as the device
 * plugin's DP_DISABLE_HEALTHCHECKS (more Xids to ignore) and DP_ENABLE_HEALTHCHECKS (Xids that are faults even when
 * skipped; they win over the skip list) allow.
 * Free of `effect` and of node:*, as everything the NVML worker may load.
 */

/** A row of the table: a short name for the Xid and whether it is an application error (no fault). */
interface XidEntry {
  readonly name: string
  readonly application: boolean
}

/**
 * The Xids with a name here: the device plugin's application errors, and the hardware faults an operator meets most.
 * Names shortened from the descriptions in NVIDIA's Xid catalog
 * (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html). An Xid not listed is a fault without a
 * name: the catalog says what it is.
 */
const XIDS: Readonly<Record<number, XidEntry>> = {
  13: { name: "graphics engine exception", application: true },
  31: { name: "GPU memory page fault", application: true },
  43: { name: "GPU stopped processing", application: true },
  45: { name: "preemptive cleanup, due to previous errors", application: true },
  68: { name: "video processor exception", application: true },
  109: { name: "context switch timeout", application: true },
  48: { name: "double-bit ECC error", application: false },
  63: { name: "row remapping or page retirement recorded", application: false },
  64: { name: "row remapping or page retirement failed", application: false },
  74: { name: "NVLink error", application: false },
  79: { name: "fallen off the bus", application: false },
  92: { name: "high single-bit ECC error rate", application: false },
  // NVIDIA ("Response to Uncorrectable Contained ECC Errors", docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt): new
  // work may start without a reset; but the GPU then counts an uncorrected ECC error and has a row remapping pending,
  // each a fault until a reset (Gpus.ts gpuFault), so a fault here as in the device plugin, with the same remedy.
  94: { name: "contained ECC error", application: false },
  95: { name: "uncontained ECC error", application: false },
  119: { name: "GSP RPC timeout", application: false },
  120: { name: "GSP error", application: false },
  // nvml.h nvmlEventData_t: "eventData is set as 999 for unknown xid error"
  999: { name: "an Xid the driver could not name", application: false }
}

/** The application Xids (no fault), ascending: the device plugin's skip list. */
export const applicationXids: ReadonlyArray<number> = Object.keys(XIDS)
  .map(Number)
  .filter((xid) => XIDS[xid]?.application === true)
  .sort((a, b) => a - b)

/**
 * The operator's changes to the table (`[engine].ignore_xids`, `[engine].fault_xids`; the config refuses an Xid in
 * both). `fault` wins, as DP_ENABLE_HEALTHCHECKS does over DP_DISABLE_HEALTHCHECKS in the device plugin.
 */
export interface XidRule {
  /** Xids that are no fault, on top of the application errors. */
  readonly ignore: ReadonlyArray<number>
  /** Xids that are faults, application errors among them. */
  readonly fault: ReadonlyArray<number>
}

/** The rule an engine config sets (`[engine].ignore_xids`, `[engine].fault_xids`). */
export const xidRuleOf = (engine: {
  readonly ignore_xids: ReadonlyArray<number>
  readonly fault_xids: ReadonlyArray<number>
}): XidRule => ({ ignore: engine.ignore_xids, fault: engine.fault_xids })

/** The table as it is: no Xid moved. */
export const defaultXidRule: XidRule = { ignore: [], fault: [] }

/** Whether an Xid makes its GPU faulty: every one but the application errors, as `rule` changes that. */
export const xidIsFault = (xid: number, rule: XidRule = defaultXidRule): boolean => {
  if (rule.fault.includes(xid)) return true
  if (rule.ignore.includes(xid)) return false
  return XIDS[xid]?.application !== true
}

/** `Xid 79 (fallen off the bus)`; `Xid 150` for one without a name here. */
export const describeXid = (xid: number): string => {
  const name = XIDS[xid]?.name
  return name === undefined ? `Xid ${xid}` : `Xid ${xid} (${name})`
}
