/**
 * The state_dir lock's record and the verdict on an existing one (layers/stateDir/stateLock.ts takes and holds the
 * lock): who wrote it, and whether that agent still holds it, from what a contender sees of it. Pure: the
 * observations come in.
 */
import { Data } from "effect"
import { startMatches } from "./ProcessStart.ts"

export interface LockRecord {
  readonly pid: number
  /** When that process started (epoch ms, /proc), or undefined where /proc cannot say. */
  readonly startedAt: number | undefined
  /** Its pid namespace (the link /proc/self/ns/pid, `pid:[inode]`): a pid names a process only within one. */
  readonly pidNs: string | undefined
  readonly host: string
  /** Unique to one holding, so the release never removes a lock that is no longer this one. */
  readonly token: string
}

/** How often the holder refreshes the lock's mtime. */
export const HEARTBEAT_MS = 3_000
/** How long a lock from another pid namespace stays held without a refresh: far above any event-loop stall. */
export const HEARTBEAT_STALE_MS = 15_000

/** The record in a lock file's text; undefined when it is not one. */
export const decodeLock = (text: string): LockRecord | undefined => {
  try {
    const v = JSON.parse(text) as Record<string, unknown>
    if (typeof v.pid !== "number" || typeof v.host !== "string" || typeof v.token !== "string") return undefined
    return {
      pid: v.pid,
      startedAt: typeof v.startedAt === "number" ? v.startedAt : undefined,
      pidNs: typeof v.pidNs === "string" ? v.pidNs : undefined,
      host: v.host,
      token: v.token
    }
  } catch {
    return undefined
  }
}

/** What a contender sees of an existing lock's holder. */
export interface LockSight {
  /** The contender: its pid, pid namespace and host. */
  readonly self: Pick<LockRecord, "pid" | "pidNs" | "host">
  /** Whether the lock's pid is alive here, and when it started (/proc); meaningful in the same pid namespace only. */
  readonly alive: boolean
  readonly startMs: number | undefined
  /** How long ago the lock's mtime was last refreshed. */
  readonly ageMs: number
}

export type LockVerdict = Data.TaggedEnum<{
  /**
   * A live agent holds it: `by` names it. `heartbeat`: judged by the lock's refreshes alone (another pid
   * namespace or host), so only a refresh seen from here proves the holder is still there.
   */
  Held: { readonly by: string; readonly heartbeat: boolean }
  /** Nobody holds it any more: `why` says so, for the takeover's log line. */
  Stale: { readonly why: string }
}>
const Verdict = Data.taggedEnum<LockVerdict>()

/** Whether the agent that wrote `record` still holds the lock (pure: the contender's observations come in `seen`). */
export const lockVerdict = (record: LockRecord | undefined, seen: LockSight): LockVerdict => {
  if (record === undefined) return Verdict.Stale({ why: "it holds no lock record" })
  const who = `agent pid ${record.pid}`
  if (record.host !== seen.self.host || record.pidNs !== seen.self.pidNs) {
    const where = `${who} on ${record.host}, another pid namespace (${record.pidNs ?? "unknown"})`
    const secs = Math.round(seen.ageMs / 1000)
    return seen.ageMs < HEARTBEAT_STALE_MS
      ? Verdict.Held({ by: `${where}, alive ${secs} s ago`, heartbeat: true })
      : Verdict.Stale({ why: `${where}, silent for ${secs} s` })
  }
  // Pids are unique in a namespace and this process takes the lock once: a lock naming its pid is a dead
  // predecessor's whose pid was reused for this process (its start time may even match, within the bound).
  if (record.pid === seen.self.pid) return Verdict.Stale({ why: `${who} (this process's pid) is an earlier agent` })
  if (!seen.alive) return Verdict.Stale({ why: `${who} is gone` })
  if (!startMatches(seen.startMs, record.startedAt))
    return Verdict.Stale({ why: `pid ${record.pid} is now another process (started at another time): a reused pid` })
  return Verdict.Held({ by: who, heartbeat: false })
}
