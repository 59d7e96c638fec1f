/**
 * The engine pid file in [agent].state_dir and the start-up reclaim: an engine group left by a previous agent
 * (recorded in the file, still alive) is stopped; a live agent that still owns it, or anything else listening
 * on the engine port, refuses the start. Never two engines on the same GPUs. File I/O is node:fs/promises inside
 * Effects, and every wait is bounded on Effect's Clock.
 */
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { Effect } from "effect"
import type { LaunchPlan } from "../../services/engine/Engine.ts"
import { EngineProcessError } from "../../services/engine/EngineProcess.ts"
import { startMatches } from "../../services/stateDir/ProcessStart.ts"
import { portInUse } from "../net/connectOnce.ts"
import { readNoFollow, sweepTemps, writeAtomically } from "../stateDir/stateFiles.ts"
import { pollUntil, stopGroup } from "./groupWait.ts"
import {
  groupAlive,
  groupMembers,
  hasProc,
  KILL_WAIT_MS,
  pidAlive,
  processExe,
  processStartMs
} from "./processGroup.ts"

export interface PidRecord {
  readonly agentPid: number
  readonly guardPid: number | undefined
  /** The engine's process group (= the engine leader's pid). */
  readonly pgid: number
  readonly host: string
  readonly port: number
  readonly startedAt: number
  /**
   * The executable the engine's leader ran at the spawn (/proc/<pgid>/exe). A reclaim stops only a group that runs
   * it: a record without it (an older agent's, or one written by hand) never gets a group killed.
   */
  readonly exe?: string | undefined
}

/** A pid record is a few hundred bytes: anything larger is not one. */
const MAX_RECORD_BYTES = 64 * 1024

export const pidFilePath = (stateDir: string): string => path.join(stateDir, "engine.pid")

/**
 * The record in the file; undefined when there is none or it is not a record (never fails). Read without following
 * a link (stateFiles.ts): a link there is said in a warning and counts as no record.
 */
export const readPidFile = (file: string): Effect.Effect<PidRecord | undefined> =>
  Effect.promise(() =>
    readNoFollow(file, MAX_RECORD_BYTES).then(
      (text): string | { readonly error: NodeJS.ErrnoException } => text,
      (error: NodeJS.ErrnoException) => ({ error })
    )
  ).pipe(
    Effect.flatMap((text) =>
      typeof text !== "string"
        ? text.error.code === "ENOENT" || text.error.code === "ENOTDIR"
          ? Effect.undefined
          : Effect.as(Effect.logWarning(`ignoring the engine pid file: ${text.error.message}`), undefined)
        : Effect.sync(() => {
            try {
              const v = JSON.parse(text) as Partial<PidRecord>
              return typeof v.pgid === "number" && typeof v.agentPid === "number" ? (v as PidRecord) : undefined
            } catch {
              return undefined
            }
          })
    )
  )

/**
 * Written atomically (a new temp file under a random name, mode 0600, then a rename: stateFiles.ts writeAtomically),
 * so a crash never leaves half a record and no planted link is written through; a failure is logged. Not synced:
 * the record names a live process group, which a crash of the node ends with it.
 */
export const writePidFile = (file: string, record: PidRecord): Effect.Effect<void> =>
  Effect.tryPromise(() => writeAtomically(file, `${JSON.stringify(record)}\n`, false)).pipe(
    // the system's reason (EROFS, ENOSPC) is the cause: the error's own text says only that a promise failed
    Effect.catch((e) =>
      Effect.logError(`cannot write the engine pid file ${file}`, {
        error: e.cause instanceof Error ? e.cause.message : String(e.cause ?? e)
      })
    )
  )

export const removePidFile = (file: string): Effect.Effect<void> =>
  Effect.promise(() => fs.rm(file, { force: true }).catch(() => undefined))

/**
 * The pid file of one run as a resource: acquired before the run is spawned, so its release (the removal) runs
 * after the run's teardown has confirmed the group gone; `write` records the group once its pid is known, with the
 * executable its leader runs (read now, the spawn having exec'd it). A group that survived the teardown's SIGKILL
 * keeps its record: the next run waits for it (runOnce.ts), and an agent started after this one stops or refuses
 * it (`reclaim`) instead of starting a second engine beside it.
 */
export const pidFileOfRun = (file: string) =>
  Effect.acquireRelease(
    Effect.sync(() => {
      let pgid: number | undefined
      return {
        write: (record: PidRecord) => {
          pgid = record.pgid
          return writePidFile(file, { ...record, exe: record.exe ?? processExe(record.pgid) })
        },
        alive: () => pgid !== undefined && groupAlive(pgid)
      }
    }),
    (recorded) =>
      recorded.alive()
        ? Effect.logWarning(`${file} kept: the engine group it names is still alive after its stop`)
        : removePidFile(file)
  )

/**
 * Why the live group `record` names is not an engine this agent started, or undefined when it is: one of its
 * members runs the executable recorded at the spawn. The start time alone proves nothing (/proc/<pid>/stat is
 * world-readable), so a record naming anyone's group with its real start would get it killed.
 */
const notTheEngine = (record: PidRecord): string | undefined => {
  if (!hasProc) return undefined
  if (record.exe === undefined) return "the record does not say which executable the engine ran"
  if (groupMembers(record.pgid).some((pid) => processExe(pid) === record.exe)) return undefined
  return `no process in it runs ${record.exe}, the engine's executable at its spawn`
}

/** Stops the stale engine group `stale` names (its guard given the time to finish first); fails if it survives. */
const stopStale = (stale: PidRecord, file: string, graceMs: number) =>
  Effect.gen(function* () {
    // The dead agent's guard may still be stopping that group (its TERM, grace, KILL): let it finish rather than
    // send the engine a second SIGTERM, which engines take as "exit now" (see stopGroup).
    const guardPid = stale.guardPid
    if (guardPid !== undefined && pidAlive(guardPid)) {
      yield* Effect.logWarning(`waiting for guard pid ${guardPid} to stop engine group ${stale.pgid} (${file})`)
      yield* pollUntil(() => !groupAlive(stale.pgid), graceMs + KILL_WAIT_MS + 1_000)
    }
    yield* Effect.logWarning(`stopping engine group ${stale.pgid} left by agent pid ${stale.agentPid} (${file})`)
    // Not cut short by a SIGTERM to this agent meanwhile (bounded: the grace, then SIGKILL and its wait): the
    // interrupted stop left the group, its guard dead too, holding its GPUs until another agent started (a review
    // sent SIGINT 0.3 s into it).
    const outcome = yield* Effect.uninterruptible(stopGroup(stale.pgid, graceMs))
    if (outcome === "survived") {
      return yield* new EngineProcessError({
        reason: "StaleEngine",
        detail: `engine group ${stale.pgid} left by a previous agent survived SIGKILL`
      })
    }
    yield* Effect.logWarning(`stale engine group ${stale.pgid}: ${outcome}`)
  })

/**
 * Prepares a start in a state dir this agent holds (stateLock.ts): a stale engine is stopped, the engine port is
 * free.
 */
export const reclaim = Effect.fn("EngineProcess.reclaim")(function* (
  plan: LaunchPlan,
  stateDir: string,
  graceMs: number
) {
  const file = pidFilePath(stateDir)
  const recorded = yield* readPidFile(file)
  // The record's group must still be the engine it names: pids are reused, and state_dir outlives reboots, so a
  // live group with another start time is someone else's (it was stopped, or the start refused, for good).
  const startMs = recorded === undefined ? undefined : processStartMs(recorded.pgid)
  const reused = recorded !== undefined && startMs !== undefined && !startMatches(startMs, recorded.startedAt)
  if (reused) {
    yield* Effect.logWarning(
      `${file} names process group ${recorded.pgid}, which started at ${new Date(startMs).toISOString()}, not with the engine it recorded (${new Date(recorded.startedAt).toISOString()}): a reused pid; ignoring the record`
    )
  }
  const stale = reused ? undefined : recorded
  if (stale !== undefined && groupAlive(stale.pgid)) {
    if (stale.agentPid !== process.pid && pidAlive(stale.agentPid)) {
      return yield* new EngineProcessError({
        reason: "AnotherAgent",
        detail: `agent pid ${stale.agentPid} still runs engine group ${stale.pgid} (${file}); stop it first`
      })
    }
    const foreign = notTheEngine(stale)
    if (foreign !== undefined) {
      yield* Effect.logWarning(
        `${file} names process group ${stale.pgid}, but ${foreign}: not an engine this agent started; ignoring the record, the group is left alone`
      )
    } else {
      yield* stopStale(stale, file, graceMs)
    }
  }
  if (recorded !== undefined) yield* removePidFile(file)
  // an agent killed mid-write leaves its temp file under a random name, which no later write replaces
  yield* sweepTemps(file)
  if (yield* portInUse(plan.host, plan.port)) {
    return yield* new EngineProcessError({
      reason: "PortBusy",
      detail: `something already listens on ${plan.host}:${plan.port} and it is not an engine this agent started; refusing to start a second engine`
    })
  }
})
