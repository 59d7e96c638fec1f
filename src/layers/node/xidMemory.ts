/**
 * The GPUs' Xids of this boot, across NVML sessions and agent restarts (services/node/XidLedger.ts): every sample the
 * Nvml layer publishes passes through the ledger, and the ledger is kept as `gpu-xids.json` in agent.state_dir,
 * written durably (durableFile.ts) whenever it moves, and read at start when it names this boot
 * (/proc/sys/kernel/random/boot_id, the host's even in a container: a reboot resets the GPUs). POST /gpus/clear-xids
 * (`clearXids`) forgets a GPU's Xids once the operator has reset it (nvidia-smi -r).
 * A record that cannot be read or written costs the memory across restarts only, never the daemon: it is logged,
 * and the write is tried again at the next change (or the next sample, at most every RETRY_MS).
 */
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { Clock, Effect, type Scope } from "effect"
import type { Gpu } from "../../gen/cgn/agent/v1/agent.ts"
import { type GpuRef, refMatches } from "../../services/node/Gpus.ts"
import { type ClearedXids, type NvmlSampler, type NvmlService, UnknownGpu } from "../../services/node/Nvml.ts"
import { describeXid } from "../../services/node/Xid.ts"
import {
  clear,
  decodeRecord,
  encodeRecord,
  ledgerOf,
  observe,
  recordOf,
  type XidLedger,
  type XidRecord
} from "../../services/node/XidLedger.ts"
import { writeDurably } from "./durableFile.ts"

/** Where Linux says which boot this is (proc(5): a random UUID made at each boot). */
export const BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
/** A failed write is tried again no sooner than this after it. */
const RETRY_MS = 10_000

export const xidRecordPath = (stateDir: string): string => path.join(stateDir, "gpu-xids.json")

export interface XidMemoryOptions {
  /** agent.state_dir; none: the ledger lives in memory only (the CLI's probe). */
  readonly stateDir?: string | undefined
  /** Default BOOT_ID_FILE. */
  readonly bootIdFile?: string | undefined
  /** Read the record, never write it (`check`, `render`: the daemon on this host owns the file). */
  readonly readOnly?: boolean | undefined
}

const errorText = (e: unknown): string => (e instanceof Error ? e.message : String(e))

const readText = (file: string) =>
  Effect.promise(() =>
    fs.readFile(file, "utf8").then(
      (text): string | { readonly error: unknown } => text,
      (error: unknown) => ({ error })
    )
  )

/** The record at start, when it is this boot's; anything else is logged and starts an empty ledger. */
const readAtStart = (file: string, bootId: string) =>
  Effect.gen(function* () {
    const text = yield* readText(file)
    if (typeof text !== "string") {
      const code = (text.error as NodeJS.ErrnoException).code
      if (code !== "ENOENT" && code !== "ENOTDIR") {
        yield* Effect.logWarning(`cannot read the GPU Xid record ${file}; Xids from before this start are unknown`, {
          error: errorText(text.error)
        })
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
      yield* Effect.logWarning("a GPU reported Xids earlier in this boot (before this agent started)", {
        uuid: g.uuid,
        xids: g.xids.map((x) => describeXid(x.xid)).join(", "),
        remedy: "once the GPU is reset (nvidia-smi -r), POST /gpus/clear-xids"
      })
    }
    return record satisfies XidRecord
  })

/**
 * `sampler`'s GPUs with this boot's Xids, and `clearXids` to forget them; the record's writes run in the scope.
 * Without a state_dir (or a boot id) the ledger still carries Xids across NVML sessions, in memory.
 */
export const remembering = (
  sampler: NvmlSampler,
  options: XidMemoryOptions
): Effect.Effect<NvmlService, never, Scope.Scope> =>
  Effect.gen(function* () {
    const scope = yield* Effect.scope
    const bootText = options.stateDir === undefined ? undefined : yield* readText(options.bootIdFile ?? BOOT_ID_FILE)
    const bootId = typeof bootText === "string" ? bootText.trim() : undefined
    if (options.stateDir !== undefined && (bootId === undefined || bootId === "")) {
      yield* Effect.logInfo("GPU Xids are not kept across agent restarts: the boot id cannot be read", {
        file: options.bootIdFile ?? BOOT_ID_FILE
      })
    }
    const file = options.stateDir !== undefined && bootId ? xidRecordPath(options.stateDir) : undefined
    const ledger: XidLedger = ledgerOf(file !== undefined && bootId ? yield* readAtStart(file, bootId) : undefined)

    // single flight: one write at a time; a change during it is written after it
    let writing = false
    let dirty = false
    let retryAt = Number.POSITIVE_INFINITY
    let lastFailure: string | undefined
    const writeLoop = Effect.gen(function* () {
      while (dirty && file !== undefined && bootId !== undefined) {
        dirty = false
        const text = encodeRecord(recordOf(ledger, bootId))
        const result = yield* Effect.tryPromise(() => writeDurably(file, text)).pipe(Effect.result)
        if (result._tag === "Success") {
          retryAt = Number.POSITIVE_INFINITY
          if (lastFailure !== undefined) yield* Effect.logInfo("GPU Xid record written again", { file })
          lastFailure = undefined
          if (result.success !== undefined) yield* Effect.logWarning(`GPU Xid record: ${result.success}`)
          continue
        }
        dirty = true
        retryAt = (yield* Clock.currentTimeMillis) + RETRY_MS
        const why = errorText(result.failure.cause)
        if (why !== lastFailure) {
          yield* Effect.logWarning(`cannot write the GPU Xid record ${file}: an agent restart would forget its Xids`, {
            error: why
          })
        }
        lastFailure = why
        return
      }
    }).pipe(
      Effect.ensuring(
        Effect.sync(() => {
          writing = false
        })
      )
    )
    const persist = Effect.suspend(() => {
      if (file === undefined || options.readOnly === true || writing) return Effect.void
      writing = true
      return Effect.asVoid(Effect.forkIn(writeLoop, scope))
    })

    const take = (gpus: ReadonlyArray<Gpu>) =>
      Effect.gen(function* () {
        const taken = observe(ledger, gpus)
        if (taken.changed) dirty = true
        if (dirty && (taken.changed || (yield* Clock.currentTimeMillis) >= retryAt)) yield* persist
        return taken.gpus
      })

    const clearXids = (ref?: GpuRef) =>
      Effect.gen(function* () {
        const gpus = yield* Effect.flatMap(sampler.gpus, take)
        let uuids: ReadonlyArray<string> | undefined
        if (ref !== undefined) {
          const uuid =
            gpus.find((g) => refMatches(ref, g))?.uuid ?? (ledger.entries.has(String(ref)) ? String(ref) : "")
          if (uuid === "") return yield* new UnknownGpu({ ref })
          uuids = [uuid]
        }
        const cleared = clear(ledger, uuids)
        const result: ClearedXids = cleared.map((c) => ({
          ...c,
          index: gpus.find((g) => g.uuid === c.uuid)?.index
        }))
        for (const c of result) {
          yield* Effect.logWarning("GPU Xids cleared by the operator (the GPU was reset)", {
            uuid: c.uuid,
            xids: c.xids.map((x) => describeXid(x.xid)).join(", ")
          })
        }
        if (cleared.length > 0) {
          dirty = true
          yield* persist
        }
        return result
      })

    return {
      gpus: Effect.flatMap(sampler.gpus, take),
      sampleNow: Effect.flatMap(sampler.sampleNow, take),
      unavailable: sampler.unavailable,
      clearXids
    } satisfies NvmlService
  })
