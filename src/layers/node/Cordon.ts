/**
 * The live Cordon: the cordon persisted as `cordon.json` in agent.state_dir, so an operator's cordon outlives an
 * agent restart (OOM, upgrade, crash) and a node's reboot until POST /uncordon. Read once at start; written
 * atomically and durably (durableFile.ts) before the state changes, removed (durably too) before the uncordon
 * takes effect. A write or removal that did not happen is the request's error (500), never the daemon's; one that
 * happened but whose directory could not be synced after it is logged, and the state follows the disk.
 */
import * as path from "node:path"
import { Clock, Effect, Layer } from "effect"
import { Config } from "../../services/config/Config.ts"
import {
  Cordon,
  CordonPersistError,
  type CordonRecord,
  decodeRecord,
  encodeRecord,
  make
} from "../../services/node/Cordon.ts"
import { removeDurably, writeDurably } from "../stateDir/durableFile.ts"
import { readNoFollow } from "../stateDir/stateFiles.ts"

export const cordonFilePath = (stateDir: string): string => path.join(stateDir, "cordon.json")

/** A cordon record is a reason of 256 characters at most and a time: anything larger is not one. */
const MAX_RECORD_BYTES = 64 * 1024

const errorText = (e: unknown): string => (e instanceof Error ? e.message : String(e))

/**
 * The record at start. No file: not cordoned. A file that cannot be read or parsed still means an operator
 * cordoned the node (only a cordon writes it), so the node starts cordoned rather than back in traffic. A link is
 * not followed (stateFiles.ts): unreadable.
 */
const readAtStart = (file: string) =>
  Effect.gen(function* () {
    const text = yield* Effect.promise(() =>
      readNoFollow(file, MAX_RECORD_BYTES).then(
        (t): string | { readonly error: unknown } => t,
        (error: unknown) => ({ error })
      )
    )
    if (typeof text !== "string") {
      // no state_dir yet, or a path through a file: no cordon can have been recorded there
      const code = (text.error as NodeJS.ErrnoException).code
      if (code === "ENOENT" || code === "ENOTDIR") return undefined
      yield* Effect.logError(`cannot read the cordon record ${file}; starting cordoned to be safe`, {
        error: errorText(text.error)
      })
      return { since: yield* Clock.currentTimeMillis, reason: "unreadable cordon record" }
    }
    const record = decodeRecord(text)
    if (record !== undefined) return record
    yield* Effect.logError(`the cordon record ${file} is not one; starting cordoned to be safe`)
    return { since: yield* Clock.currentTimeMillis, reason: "unreadable cordon record" }
  })

export const layer: Layer.Layer<Cordon, never, Config> = Layer.effect(
  Cordon,
  Effect.gen(function* () {
    const stateDir = (yield* Config).agent.state_dir
    const file = cordonFilePath(stateDir)
    const fail = (e: unknown) => new CordonPersistError({ file, reason: errorText(e) })
    // the record is as asked on disk, the state follows it; only its durability across a crash is in doubt
    const warn = (warning: string | undefined) =>
      warning === undefined ? Effect.void : Effect.logWarning(`cordon record: ${warning}`)
    const initial: CordonRecord | undefined = yield* readAtStart(file)
    if (initial !== undefined) {
      yield* Effect.logWarning("starting cordoned: new Generate calls are refused until POST /uncordon", {
        since: new Date(initial.since).toISOString(),
        reason: initial.reason,
        file
      })
    }
    return yield* make(initial, {
      // The supervisor creates state_dir too, but a cordon may come first (an engine still reclaiming): the write
      // creates it.
      write: (record) =>
        Effect.tryPromise({ try: () => writeDurably(file, encodeRecord(record)), catch: fail }).pipe(
          Effect.flatMap(warn)
        ),
      remove: Effect.tryPromise({ try: () => removeDurably(file), catch: fail }).pipe(Effect.flatMap(warn))
    })
  })
)
