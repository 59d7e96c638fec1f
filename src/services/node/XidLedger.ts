/**
 * XidLedger: the Xids each GPU has reported since the host booted, as the agent remembers them, where an NVML session
 * knows only its own (layers/node/nvmlEvents.ts counts from the session's start). A fault Xid needs a GPU reset or a
 * reboot (Xid.ts), and neither an agent restart (an OOM kill, a DaemonSet rollout, a crash loop) nor NVML opened again
 * resets a GPU: forgetting the Xid then would let an engine start on the GPU that reported it. The ledger carries
 * each GPU's Xids across NVML sessions (and, through its record in agent.state_dir, across agent restarts within one
 * boot: layers/node/xidMemory.ts) until the operator says the GPU was reset (`clear`). A reboot starts a new ledger
 * (the record names its boot). GPUs are kept by UUID: indices are one NVML session's enumeration.
 * Pure: no I/O, no clock; the layer calls it with every sample it publishes.
 */
import type { Gpu, GpuXid } from "../../gen/cgn/agent/v1/agent.ts"
import type { GpuRef } from "./Gpus.ts"
import { isUnknown } from "./NvmlValues.ts"
import { describeXid } from "./Xid.ts"

/** Distinct Xids kept per GPU, as the NVML worker keeps per session (nvmlEvents.ts MAX_XIDS). */
const MAX_XIDS = 16
/** GPUs kept: more than a host holds; past it the oldest are dropped (a record grown by a fault in its UUIDs). */
const MAX_GPUS = 64
const MAX_COUNT = 0xffff_ffff // GpuXid.events is a uint32

type Tally = Map<number, number>

/** One GPU's entry: what earlier sessions (and the record) carried, and the current session's tallies. */
interface Entry {
  /** Events per Xid from earlier NVML sessions of this boot, less what was cleared. */
  carried: Tally
  /** The current session's tallies as last sampled. */
  seen: Tally
  /** The session's tallies when the GPU was last cleared: events up to those are no longer counted. */
  base: Tally
}

export interface XidLedger {
  readonly entries: Map<string, Entry>
  /** Which Xids make a GPU faulty (the operator's rule): at the cap, a fault Xid takes a harmless one's place. */
  readonly isFault: (xid: number) => boolean
}

/** The record of one boot: what `agent.state_dir` keeps, events per Xid per GPU UUID. */
export interface XidRecord {
  readonly bootId: string
  readonly gpus: ReadonlyArray<{ readonly uuid: string; readonly xids: ReadonlyArray<GpuXid> }>
}

const tallyOf = (xids: ReadonlyArray<GpuXid>): Tally => new Map(xids.map((x) => [x.xid, x.events]))

/**
 * A ledger carrying `record`'s Xids (the record of this boot; none: an empty ledger), within the caps a ledger keeps
 * (a record grown past them by hand keeps its first GPUs and Xids). `isFault`: which Xids make a GPU faulty.
 */
export const ledgerOf = (record?: XidRecord, isFault: (xid: number) => boolean = () => true): XidLedger => {
  const entries = new Map<string, Entry>()
  for (const g of (record?.gpus ?? []).slice(0, MAX_GPUS)) {
    entries.set(g.uuid, { carried: tallyOf(g.xids.slice(0, MAX_XIDS)), seen: new Map(), base: new Map() })
  }
  return { entries, isFault }
}

/**
 * An entry's Xids as shown: carried first, then this session's beyond its base, at most MAX_XIDS. At the cap a new
 * fault Xid takes the place of the first one that is no fault (an operator's long ignore_xids must not hide a
 * fault); a new Xid that is no fault is left out.
 */
const shown = (entry: Entry, isFault: (xid: number) => boolean): Array<GpuXid> => {
  const total = new Map(entry.carried)
  for (const [xid, events] of entry.seen) {
    const fresh = events - (entry.base.get(xid) ?? 0)
    if (fresh <= 0) continue
    const before = total.get(xid)
    if (before !== undefined) total.set(xid, Math.min(before + fresh, MAX_COUNT))
    else if (total.size < MAX_XIDS) total.set(xid, fresh)
    else if (isFault(xid)) {
      const harmless = [...total.keys()].find((x) => !isFault(x))
      if (harmless === undefined) continue
      total.delete(harmless)
      total.set(xid, fresh)
    }
  }
  return [...total].map(([xid, events]) => ({ xid, events }))
}

/** Whether `next` cannot follow `prev` within one session: a session's tallies only grow (a new session). */
const restarted = (prev: Tally, next: Tally): boolean => {
  for (const [xid, events] of prev) if ((next.get(xid) ?? 0) < events) return true
  return false
}

const sameTally = (a: Tally, b: Tally): boolean => a.size === b.size && [...a].every(([k, v]) => b.get(k) === v)

/** The Xids shown, without their counts: what changes only when an Xid comes or goes. */
const xidsKey = (xids: ReadonlyArray<GpuXid>): string => xids.map((x) => x.xid).join(",")

/** How a sample moved the ledger: not at all, event counts only, or an Xid that came (or went). */
export type LedgerChange = "none" | "counts" | "xids"

/**
 * Takes a sample's GPUs into the ledger and returns them with their Xids of this boot. A GPU whose session tallies
 * went down is in a new NVML session: what the last one showed is carried (a new session first sampled with more of
 * an Xid than the last one had would read as the same session: its events undercounted, its Xid kept all the same).
 * A GPU whose Xids are unreported this sample (no event set, a lost GPU not watched) changes nothing and shows what
 * the ledger has.
 */
export const observe = (
  ledger: XidLedger,
  gpus: ReadonlyArray<Gpu>
): { readonly gpus: ReadonlyArray<Gpu>; readonly change: LedgerChange } => {
  let change: LedgerChange = "none"
  const out = gpus.map((g) => {
    if (g.uuid === "") return g // no identity to keep it under (its UUID query failed): as sampled
    let entry = ledger.entries.get(g.uuid)
    if (!isUnknown(g, "critical_xids")) {
      const next = tallyOf(g.criticalXids)
      if (entry === undefined) {
        if (next.size === 0) return g
        entry = { carried: new Map(), seen: new Map(), base: new Map() }
        ledger.entries.set(g.uuid, entry)
      }
      if (!sameTally(entry.seen, next)) {
        const before = xidsKey(shown(entry, ledger.isFault))
        if (restarted(entry.seen, next)) {
          entry.carried = tallyOf(shown(entry, ledger.isFault))
          entry.base = new Map()
        }
        entry.seen = next
        if (xidsKey(shown(entry, ledger.isFault)) !== before) change = "xids"
        else if (change === "none") change = "counts"
      }
    }
    return entry === undefined ? g : { ...g, criticalXids: shown(entry, ledger.isFault) }
  })
  trim(ledger)
  return { gpus: out, change }
}

/** Drops the oldest entries past MAX_GPUS (a Map keeps insertion order). */
const trim = (ledger: XidLedger) => {
  for (const uuid of ledger.entries.keys()) {
    if (ledger.entries.size <= MAX_GPUS) return
    ledger.entries.delete(uuid)
  }
}

/** What `clear` forgot, and how to take it back (its write failed: the disk still has it). */
export interface Cleared {
  readonly gpus: ReadonlyArray<{ readonly uuid: string; readonly xids: ReadonlyArray<GpuXid> }>
  readonly undo: () => void
}

/**
 * Forgets the Xids of the GPUs `uuids` (all the ledger has when undefined): the operator reset them. Events the
 * current session counted up to now no longer count; later ones do.
 */
export const clear = (ledger: XidLedger, uuids?: ReadonlyArray<string>): Cleared => {
  const gpus: Array<Cleared["gpus"][number]> = []
  const undos: Array<() => void> = []
  for (const uuid of uuids ?? [...ledger.entries.keys()]) {
    const entry = ledger.entries.get(uuid)
    if (entry === undefined) continue
    const xids = shown(entry, ledger.isFault)
    if (xids.length === 0) continue
    const { carried, base } = entry
    undos.push(() => {
      entry.carried = carried
      entry.base = base
    })
    entry.carried = new Map()
    entry.base = new Map(entry.seen)
    gpus.push({ uuid, xids })
  }
  return {
    gpus,
    undo: () => {
      for (const undo of undos) undo()
    }
  }
}

/** The ledger as the record of boot `bootId`: GPUs with at least one Xid. */
export const recordOf = (ledger: XidLedger, bootId: string): XidRecord => ({
  bootId,
  gpus: [...ledger.entries]
    .map(([uuid, entry]) => ({ uuid, xids: shown(entry, ledger.isFault) }))
    .filter((g) => g.xids.length > 0)
})

/**
 * The fault a start must wait on when NVML has not answered since the agent started, from the Xids this boot's record
 * keeps (`remembered`: recordOf's GPUs), or undefined. Without NVML the engine's GPUs cannot be told by index: only a
 * configuration that names every GPU by UUID narrows the GPUs to those; otherwise a fault Xid on any GPU of this host
 * holds the start (a GPU off the bus hangs NVML, and the engine must not go onto it after an agent restart).
 * `absent`: NVML will never answer (switched off, not loadable: NvmlAbsence.ts), said so, for only the operator's
 * POST /gpus/clear-xids releases the start then (waiting for NVML would be waiting forever).
 */
export const rememberedFault = (
  remembered: XidRecord["gpus"],
  configured: ReadonlyArray<GpuRef>,
  isFault: (xid: number) => boolean,
  absent?: string
): string | undefined => {
  const byUuid = configured.length > 0 && configured.every((r) => typeof r === "string")
  const gpu = remembered.find((g) => (!byUuid || configured.includes(g.uuid)) && g.xids.some((x) => isFault(x.xid)))
  if (gpu === undefined) return undefined
  const xids = gpu.xids.filter((x) => isFault(x.xid)).map((x) => describeXid(x.xid))
  const whose = byUuid ? "" : " (the configuration names no UUIDs: without NVML any GPU may be the engine's)"
  const clear = `POST /gpus/clear-xids?gpu=${gpu.uuid}`
  return absent === undefined
    ? `GPU ${gpu.uuid} reported ${xids.join(", ")} earlier in this boot and NVML has not answered since the agent started${whose}: it needs a GPU reset or a reboot, then ${clear}`
    : `GPU ${gpu.uuid} reported ${xids.join(", ")} earlier in this boot and ${absent}, so it will never say the GPU was reset${whose}: after a GPU reset or a reboot, ${clear} releases the start`
}

export const encodeRecord = (record: XidRecord): string => `${JSON.stringify(record)}\n`

const isCount = (v: unknown): v is number => Number.isInteger(v) && (v as number) >= 0 && (v as number) <= MAX_COUNT

/** The record in `text`, or why it is not one. */
export const decodeRecord = (text: string): XidRecord | string => {
  let value: unknown
  try {
    value = JSON.parse(text)
  } catch (e) {
    return `not JSON (${e instanceof Error ? e.message : String(e)})`
  }
  const r = value as { bootId?: unknown; gpus?: unknown }
  if (typeof r !== "object" || r === null || typeof r.bootId !== "string" || !Array.isArray(r.gpus)) {
    return "not a record of GPU Xids (bootId, gpus)"
  }
  const gpus: Array<XidRecord["gpus"][number]> = []
  for (const g of r.gpus as Array<{ uuid?: unknown; xids?: unknown }>) {
    if (typeof g?.uuid !== "string" || g.uuid === "" || !Array.isArray(g.xids)) return "a GPU without uuid or xids"
    const xids = g.xids as Array<{ xid?: unknown; events?: unknown }>
    if (!xids.every((x) => isCount(x?.xid) && isCount(x?.events))) return `GPU ${g.uuid}: an Xid that is not one`
    gpus.push({ uuid: g.uuid, xids: xids.map((x) => ({ xid: x.xid as number, events: x.events as number })) })
  }
  return { bootId: r.bootId, gpus }
}
