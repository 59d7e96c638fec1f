/**
 * Whose listener answers on the engine's port. The port is checked free only at the agent's start; until the
 * engine binds it (after loading, minutes for a large model) anything may take it: an engine a previous run left
 * outside its group, another service. Its 200 must not make our engine Ready. On Linux, /proc/net/tcp{,6} give the
 * inode of each listening socket and /proc/<pid>/fd links each open socket as `socket:[inode]`: the listener is
 * the engine's when a process of its group holds it. Where /proc cannot say (no /proc, no listener in this network
 * namespace, a member's fds unreadable, e.g. an engine run as another user) the answer is "unknown" and the probe
 * is trusted as before. Plain synchronous reads of /proc, as processGroup.ts does; one look per readiness answer.
 */
import * as fs from "node:fs"
import type { PortHolder } from "../../services/engine/EngineHost.ts"
import { groupMembers } from "./processGroup.ts"

/** TCP_LISTEN in the `st` column of /proc/net/tcp{,6}. */
const LISTEN = "0A"

/** The inodes of the sockets listening on `port` in a /proc/net/tcp or /proc/net/tcp6 table. */
export const listenerInodes = (table: string, port: number): ReadonlyArray<string> =>
  table
    .split("\n")
    .slice(1)
    .flatMap((line) => {
      // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode ...
      const [, local, , st, , , , , , inode] = line.trim().split(/\s+/)
      if (local === undefined || st !== LISTEN || inode === undefined || inode === "0") return []
      return Number.parseInt(local.slice(local.lastIndexOf(":") + 1), 16) === port ? [inode] : []
    })

/** The inode of an fd link `socket:[inode]`; undefined for anything else. */
export const socketInode = (link: string): string | undefined => /^socket:\[(\d+)\]$/.exec(link)?.[1]

/**
 * The verdict: "unknown" without a listener to judge or with a member whose sockets could not be read, "engine"
 * when the group holds one of the listeners, else "other".
 */
export const portHolderOf = (
  listeners: ReadonlyArray<string>,
  groupSockets: ReadonlySet<string>,
  allRead: boolean
): PortHolder => {
  if (listeners.length === 0) return "unknown"
  if (listeners.some((inode) => groupSockets.has(inode))) return "engine"
  return allRead ? "other" : "unknown"
}

const readOr = <A>(read: () => A, fallback: A): A => {
  try {
    return read()
  } catch {
    return fallback
  }
}

/** Who holds the listener on `port`: the process group `pgid`, another process, or unknown (see above). */
export const portHolder = (port: number, pgid: number): PortHolder => {
  const listeners = ["/proc/net/tcp", "/proc/net/tcp6"].flatMap((table) =>
    readOr(() => listenerInodes(fs.readFileSync(table, "utf8"), port), [])
  )
  if (listeners.length === 0) return "unknown"
  const sockets = new Set<string>()
  let allRead = true
  for (const pid of groupMembers(pgid)) {
    const fds = readOr(() => fs.readdirSync(`/proc/${pid}/fd`), undefined)
    if (fds === undefined) {
      // exited meanwhile, or not ours to read: either way its sockets are not known
      allRead = false
      continue
    }
    for (const fd of fds) {
      const inode = socketInode(readOr(() => fs.readlinkSync(`/proc/${pid}/fd/${fd}`), ""))
      if (inode !== undefined) sockets.add(inode)
    }
  }
  return portHolderOf(listeners, sockets, allRead)
}
