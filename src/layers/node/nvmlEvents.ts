/**
 * The Xid events of one NVML session, in the NVML worker thread: one event set, each GPU registered on it for
 * nvmlEventTypeXidCriticalError where it supports that, and every pending event taken at each sample with a wait of
 * timeout 0, never a blocking one: the worker answers one request at a time, and a wait would hold every reader of
 * the GPUs behind it. What each GPU reported is kept for the session (services/node/Xid.ts says which make a fault).
 * The pattern is NVIDIA k8s-device-plugin's (internal/rm/health.go: nvmlEventSetCreate, GetSupportedEventTypes,
 * RegisterEvents, nvmlEventSetWait), polled here instead of waited on in a thread of its own. An event's GPU is the
 * one NVML names for its device (nvmlDeviceGetIndex; the plugin asks GetUUID), else the registered handle with the
 * event's device address; an event neither names counts against every watched GPU, as the plugin marks every device
 * unhealthy when it cannot name the event's: failing open would let an engine start on the GPU that reported it.
 * Free of `effect`, as everything the worker loads.
 */
import type { GpuXid } from "../../gen/cgn/agent/v1/agent.ts"
import { nvmlReturnName } from "../../services/node/NvmlValues.ts"
import type { Binding } from "./nvmlBinding.ts"

// nvml.h constants used below.
const NVML_ERROR_NOT_SUPPORTED = 3
const NVML_ERROR_TIMEOUT = 10
const XID_CRITICAL_ERROR = 0x8n // nvmlEventTypeXidCriticalError

/** Distinct Xids kept per GPU. Only 6 Xids are application errors: past 16, the GPU has long been faulty. */
export const MAX_XIDS = 16
/** Events taken in one sample at most, should a driver keep answering SUCCESS: the rest wait for the next one. */
const MAX_EVENTS_PER_SAMPLE = 1_000
const MAX_COUNT = 0xffff_ffff // GpuXid.events is a uint32

export interface XidWatch {
  /**
   * Registers GPU `index` (handle `device`) for Xid events unless it is already, or cannot be this session: whether
   * its Xids are watched. Failures go to `note` (NOT_SUPPORTED is the board's nature; others are tried again at the
   * next sample).
   */
  readonly watch: (index: number, device: unknown, note: (what: string, rc: number) => void) => boolean
  /** Whether GPU `index` is registered: its Xids are known. */
  readonly watched: (index: number) => boolean
  /** Takes every pending event (timeout 0) into the session's tallies; failures go to `problems`. */
  readonly drain: (problems: Set<string>) => void
  /** The distinct Xids GPU `index` reported this session, first seen first, with their event counts. */
  readonly xidsOf: (index: number) => Array<GpuXid>
  /** Frees the event set (before nvmlShutdown). */
  readonly free: () => void
}

/** The Xid watch of one NVML session over `nvml`. */
export const xidWatch = (nvml: Binding): XidWatch => {
  const events = nvml.events
  let set: unknown
  /** The event set cannot be had this session (NOT_SUPPORTED): no GPU is watched. */
  let noSet = events === undefined
  /** GPU index by device address, for the registered GPUs. */
  const registered = new Map<bigint, number>()
  const indices = new Set<number>()
  /** GPUs that cannot deliver Xid events this session. */
  const unsupported = new Set<number>()
  const tallies = new Map<number, Map<number, number>>()

  const eventSet = (note: (what: string, rc: number) => void): unknown => {
    if (set !== undefined || noSet || events === undefined) return set
    const out: Array<unknown> = [null]
    const rc = events.create(out)
    if (rc === 0) set = out[0]
    else if (rc === NVML_ERROR_NOT_SUPPORTED) noSet = true
    else note("nvmlEventSetCreate", rc)
    return set
  }

  const watch: XidWatch["watch"] = (index, device, note) => {
    if (indices.has(index)) return true
    if (unsupported.has(index) || events === undefined) return false
    const s = eventSet(note)
    if (s === undefined) return false
    const types: Array<number | bigint> = [0]
    let what = "nvmlDeviceGetSupportedEventTypes"
    let rc = events.supported(device, types)
    // a board without the event type is as one without the entry point: unreported, no problem
    if (rc === 0 && (BigInt(types[0] ?? 0) & XID_CRITICAL_ERROR) === 0n) rc = NVML_ERROR_NOT_SUPPORTED
    if (rc === 0) {
      what = "nvmlDeviceRegisterEvents"
      rc = events.register(device, XID_CRITICAL_ERROR, s)
    }
    if (rc === 0) {
      registered.set(events.address(device), index)
      indices.add(index)
      return true
    }
    if (rc === NVML_ERROR_NOT_SUPPORTED) unsupported.add(index)
    note(what, rc)
    return false
  }

  /** The watched GPU nvmlDeviceGetIndex names for an event's device (its address), or why it names none. */
  const namedByNvml = (address: bigint): number | string => {
    if (events?.index === undefined) return "nvmlDeviceGetIndex missing from the driver"
    const out = [0]
    try {
      const rc = events.index(address, out)
      if (rc !== 0) return `nvmlDeviceGetIndex: ${nvmlReturnName(rc)}`
    } catch (e) {
      return `nvmlDeviceGetIndex threw: ${e instanceof Error ? e.message : String(e)}`
    }
    const index = out[0] ?? -1
    return indices.has(index) ? index : `nvmlDeviceGetIndex names GPU ${index}, which is not watched`
  }

  /** The watched GPU an event's device is: the one NVML names, else the handle at its address; or why none is. */
  const attribute = (address: bigint): number | string => {
    const named = namedByNvml(address)
    if (typeof named === "number") return named
    return registered.get(address) ?? `${named}; its device is no watched GPU's handle`
  }

  const record = (index: number, xid: number, problems: Set<string>) => {
    const seen = tallies.get(index) ?? new Map<number, number>()
    tallies.set(index, seen)
    const count = seen.get(xid)
    if (count !== undefined) seen.set(xid, Math.min(count + 1, MAX_COUNT))
    else if (seen.size < MAX_XIDS) seen.set(xid, 1)
    else problems.add(`GPU ${index}: Xid ${xid} not listed: more than ${MAX_XIDS} distinct Xids this session`)
  }

  const drain: XidWatch["drain"] = (problems) => {
    if (set === undefined || events === undefined) return
    for (let n = 0; n < MAX_EVENTS_PER_SAMPLE; n++) {
      const data: Record<string, unknown> = {}
      const rc = events.wait(set, data, 0)
      if (rc === NVML_ERROR_TIMEOUT) return // nothing pending
      if (rc !== 0) {
        problems.add(`nvmlEventSetWait_v2: ${nvmlReturnName(rc)}`)
        return
      }
      if ((BigInt((data.eventType as number | bigint | undefined) ?? 0) & XID_CRITICAL_ERROR) === 0n) continue
      const xid = Number(data.eventData ?? 0)
      const gpu = attribute(BigInt((data.device as number | bigint | undefined) ?? 0))
      if (typeof gpu === "number") {
        record(gpu, xid, problems)
        continue
      }
      // fail closed: the GPU that reported it is one of these, and which one cannot be told (logged once per cause)
      problems.add(`an Xid event's GPU cannot be told (${gpu}): it counts against every watched GPU`)
      for (const index of indices) record(index, xid, problems)
    }
  }

  return {
    watch,
    watched: (index) => indices.has(index),
    drain,
    xidsOf: (index) => [...(tallies.get(index) ?? [])].map(([xid, events]) => ({ xid, events })),
    free: () => {
      if (set !== undefined) events?.free(set)
      set = undefined
    }
  }
}
