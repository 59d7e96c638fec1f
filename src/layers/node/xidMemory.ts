/**
 * The GPUs' Xids of this boot, across NVML sessions and agent restarts (services/node/XidLedger.ts): every sample the
 * Nvml layer publishes passes through the ledger, and the ledger is kept as `gpu-xids.json` in agent.state_dir
 * (xidRecordWriter.ts writes it), read at start when it names this boot (/proc/sys/kernel/random/boot_id, the host's
 * even in a container: a reboot resets the GPUs). POST /gpus/clear-xids (`clearXids`) forgets a GPU's Xids once the
 * operator has reset it (nvidia-smi -r); the clear is answered once it is on disk, and undone when it cannot be.
 * A record that cannot be read or written costs the memory across restarts only, never the daemon: it is logged.
 */
import * as path from "node:path"
import { Duration, Effect, type Scope } from "effect"
import type { Gpu } from "../../gen/cgn/agent/v1/agent.ts"
import { type GpuRef, refMatches } from "../../services/node/Gpus.ts"
import {
  type ClearedXids,
  GpuNotIdentified,
  type NvmlSampler,
  type NvmlService,
  UnknownGpu
} from "../../services/node/Nvml.ts"
import { defaultXidRule, describeXid, type XidRule, xidIsFault } from "../../services/node/Xid.ts"
import {
  clear,
  decodeRecord,
  encodeRecord,
  ledgerOf,
  observe,
  recordOf,
  type XidRecord
} from "../../services/node/XidLedger.ts"
import { readNoFollow, sweepTemps } from "../stateDir/stateFiles.ts"
import { recordWriter } from "./xidRecordWriter.ts"

/** Where Linux says which boot this is (proc(5): a random UUID made at each boot). */
export const BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
/** A record larger than this is no record the agent wrote (64 GPUs x 16 Xids is ~60 KB). */
const MAX_RECORD_BYTES = 1024 * 1024
/** How long the start waits for state_dir to answer (a hung network mount must not hold the agent's start). */
const READ_TIMEOUT = Duration.seconds(5)

export const xidRecordPath = (stateDir: string): string => path.join(stateDir, "gpu-xids.json")

export interface XidMemoryOptions {
  /** agent.state_dir; none: the ledger lives in memory only (the CLI's probe). */
  readonly stateDir?: string | undefined
  /** Default BOOT_ID_FILE. */
  readonly bootIdFile?: string | undefined
  /** Read the record, never write it (`check`, `render`: the daemon on this host owns the file). */
  readonly readOnly?: boolean | undefined
  /** Which Xids are faults ([engine].ignore_xids, fault_xids): at the ledger's cap, faults are kept first. */
  readonly xidRule?: XidRule | undefined
}

const errorText = (e: unknown): string => (e instanceof Error ? e.message : String(e))

/**
 * The file's text; an error (a link, which is not followed: stateFiles.ts; a file past MAX_RECORD_BYTES; no answer
 * in READ_TIMEOUT) as `{ error }`.
 */
const readText = (file: string) =>
  Effect.tryPromise(() => readNoFollow(file, MAX_RECORD_BYTES)).pipe(
    Effect.timeoutOrElse({
      duration: READ_TIMEOUT,
      orElse: () => Effect.fail(new Error(`no answer within ${Duration.format(READ_TIMEOUT)}`))
    }),
    Effect.catch((e) =>
      Effect.succeed({ error: e instanceof Error && "cause" in e && e.cause !== undefined ? e.cause : e })
    )
  )

/**
 * The line for Xids of one GPU the agent had not seen (kept from before its start, or new in a sample): a warning
 * with the remedy when one is a fault by the operator's rule; else info (application errors, the engine's own faults:
 * nothing to reset).
 */
const logXids = (
  what: string,
  fields: Record<string, string>,
  xids: ReadonlyArray<number>,
  isFault: (x: number) => boolean
) => {
  const faults = xids.filter(isFault)
  const named = xids.map(describeXid).join(", ")
  return faults.length > 0
    ? Effect.logWarning(what, {
        ...fields,
        xids: named,
        remedy: "once the GPU is reset (nvidia-smi -r), POST /gpus/clear-xids"
      })
    : Effect.logInfo(`${what} (no fault: the node stays healthy)`, { ...fields, xids: named })
}

/**
 * The record at start, when it is this boot's; anything else is logged and starts an empty ledger. `readOnly` (`check`,
 * `render`): a record that cannot be read is said at debug. Their output is a problem list, a summary and `warning:`
 * lines; the warning came amid them as a JSON log line, where check lists the cause already when it is state_dir's
 * (a root-owned 0700 state_dir read by another user), and the daemon, which owns the record, warns of it at its start.
 */
const readAtStart = (file: string, bootId: string, isFault: (xid: number) => boolean, readOnly: boolean) =>
  Effect.gen(function* () {
    const text = yield* readText(file)
    if (typeof text !== "string") {
      const code = (text.error as NodeJS.ErrnoException).code
      if (code !== "ENOENT" && code !== "ENOTDIR") {
        const line = `cannot read the GPU Xid record ${file}; Xids from before this start are unknown`
        yield* (readOnly ? Effect.logDebug : Effect.logWarning)(line, { error: errorText(text.error) })
      }
      return undefined
    }
    const record = decodeRecord(text)
    if (typeof record === "string") {
      yield* Effect.logWarning(
        `the GPU Xid record ${file} is not one (${record}); Xids from before this start are unknown`
      )
      return undefined
    }
    if (record.bootId !== bootId) {
      if (record.gpus.length > 0) yield* Effect.logInfo("GPU Xids of an earlier boot forgotten: a reboot resets GPUs")
      return undefined
    }
    for (const g of record.gpus) {
      yield* logXids(
        "a GPU reported Xids earlier in this boot (before this agent started)",
        { uuid: g.uuid },
        g.xids.map((x) => x.xid),
        isFault
      )
    }
    return record satisfies XidRecord
  })

/**
 * `sampler`'s GPUs with this boot's Xids, and `clearXids` to forget them; the last change is written at the scope's
 * end. Without a state_dir (or a boot id) the ledger still carries Xids across NVML sessions, in memory.
 */
export const remembering = (
  sampler: NvmlSampler,
  options: XidMemoryOptions
): Effect.Effect<NvmlService, never, Scope.Scope> =>
  Effect.gen(function* () {
    const bootText = options.stateDir === undefined ? undefined : yield* readText(options.bootIdFile ?? BOOT_ID_FILE)
    const bootId = typeof bootText === "string" ? bootText.trim() : undefined
    if (options.stateDir !== undefined && (bootId === undefined || bootId === "")) {
      yield* Effect.logInfo("GPU Xids are not kept across agent restarts: the boot id cannot be read", {
        file: options.bootIdFile ?? BOOT_ID_FILE
      })
    }
    const file = options.stateDir !== undefined && bootId ? xidRecordPath(options.stateDir) : undefined
    const rule = options.xidRule ?? defaultXidRule
    const isFault = (xid: number) => xidIsFault(xid, rule)
    const record =
      file !== undefined && bootId ? yield* readAtStart(file, bootId, isFault, options.readOnly === true) : undefined
    const ledger = ledgerOf(record, isFault)
    const writer =
      file === undefined || bootId === undefined || options.readOnly === true
        ? undefined
        : recordWriter(file, () => encodeRecord(recordOf(ledger, bootId)))
    if (writer !== undefined && file !== undefined) {
      yield* sweepTemps(file)
      yield* Effect.addFinalizer(() => writer.flush)
    }

    /** Each GPU's Xids as the ledger shows them, to tell which a sample added. */
    const shownNow = () => new Map(recordOf(ledger, "").gpus.map((g) => [g.uuid, g.xids.map((x) => x.xid)]))
    const take = (gpus: ReadonlyArray<Gpu>) =>
      Effect.gen(function* () {
        const before = ledger.entries.size === 0 ? new Map<string, Array<number>>() : shownNow()
        const taken = observe(ledger, gpus)
        if (writer !== undefined) yield* writer.note(taken.change)
        // A new Xid is logged once per GPU and boot, whichever GPU it is on: the gate speaks only for the engine's.
        if (taken.change === "xids") {
          for (const [uuid, xids] of shownNow()) {
            const fresh = xids.filter((x) => !(before.get(uuid) ?? []).includes(x))
            if (fresh.length === 0) continue
            const index = taken.gpus.find((g) => g.uuid === uuid)?.index
            yield* logXids(
              `GPU ${index ?? uuid} reported an Xid`,
              { uuid, ...(index === undefined ? {} : { gpu: String(index) }) },
              fresh,
              isFault
            )
          }
        }
        return taken.gpus
      })

    /** The UUID `ref` names: a listed GPU's, else one the ledger keeps; or why none can be told. */
    const uuidOf = (ref: GpuRef, gpus: ReadonlyArray<Gpu>) => {
      const listed = gpus.find((g) => refMatches(ref, g))
      if (listed !== undefined && listed.uuid !== "") return Effect.succeed(listed.uuid)
      if (listed !== undefined) {
        return Effect.fail(new GpuNotIdentified({ ref, reason: "NVML cannot read its UUID now; try again" }))
      }
      if (typeof ref === "string" && ledger.entries.has(ref)) return Effect.succeed(ref)
      // An index names nothing without NVML's list; a UUID neither listed nor remembered is simply not here.
      if (gpus.length === 0 && typeof ref === "number") {
        return Effect.fail(new GpuNotIdentified({ ref, reason: "NVML lists no GPUs now; give the GPU's UUID" }))
      }
      return Effect.fail(new UnknownGpu({ ref }))
    }

    const clearXids = (ref?: GpuRef) =>
      Effect.gen(function* () {
        const gpus = yield* Effect.flatMap(sampler.gpus, take)
        const uuids = ref === undefined ? undefined : [yield* uuidOf(ref, gpus)]
        const cleared = clear(ledger, uuids)
        if (cleared.gpus.length > 0 && writer !== undefined) {
          // answered once on disk: a clear a restart would undo must not be reported done
          yield* writer.writeNow.pipe(Effect.tapError(() => Effect.sync(cleared.undo)))
        }
        const result: ClearedXids = cleared.gpus.map((c) => ({
          ...c,
          index: gpus.find((g) => g.uuid === c.uuid)?.index
        }))
        for (const c of result) {
          yield* Effect.logWarning("GPU Xids cleared by the operator (the GPU was reset)", {
            uuid: c.uuid,
            xids: c.xids.map((x) => describeXid(x.xid)).join(", ")
          })
        }
        return result
      })

    return {
      gpus: Effect.flatMap(sampler.gpus, take),
      sampleNow: Effect.flatMap(sampler.sampleNow, take),
      unavailable: sampler.unavailable,
      clearXids,
      remembered: Effect.sync(() => recordOf(ledger, bootId ?? "").gpus)
    } satisfies NvmlService
  })
