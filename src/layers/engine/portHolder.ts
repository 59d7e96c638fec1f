/**
 * Whose listener answers on the engine's port. The port is checked free only at the agent's start; until the
 * engine binds it (after loading, minutes for a large model) anything may take it: an engine a previous run left
 * outside its group, another service. Its 200 must not make our engine Ready. On Linux, /proc/net/tcp{,6} give the
 * inode of each listening socket and /proc/<pid>/fd links each open socket as `socket:[inode]`: the listener is
 * the engine's when a process of its group holds it. Where /proc cannot say (no /proc, no listener in this network
 * namespace, a live member's fds unreadable, e.g. an engine run as another user) the answer is "unknown" and the
 * probe is trusted as before. Plain synchronous reads of /proc, as processGroup.ts does; one look per readiness
 * answer.
 */
import * as fs from "node:fs"
import type { PortHolder } from "../../services/engine/EngineHost.ts"
import { groupMembers, parseProcStat } from "./processGroup.ts"

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
 * The verdict: "unknown" without a listener to judge or with a member whose sockets are not known, "engine"
 * when the group holds one of the listeners, else "other".
 */
export const portHolderOf = (
  listeners: ReadonlyArray<string>,
  groupSockets: ReadonlySet<string>,
  allKnown: boolean
): PortHolder => {
  if (listeners.length === 0) return "unknown"
  if (listeners.some((inode) => groupSockets.has(inode))) return "engine"
  return allKnown ? "other" : "unknown"
}

/** PF_EXITING (torvalds/linux include/linux/sched.h): set by exit_signals() as do_exit() begins, never cleared. */
const PF_EXITING = 0x4

/** A read that failed: the errno code (ENOENT, EACCES, ...), or undefined for a failure without one. */
export interface Failed {
  readonly failed: string | undefined
}

/**
 * Whether a member of group `pgid` whose /proc/<pid>/fd could not be read (`fdError`) holds no socket, from its
 * /proc/<pid>/stat read after that failure. An engine that cannot bind exits, and a look at its group can catch it
 * exiting; counted as "sockets not known", that made the verdict "unknown" and a foreign listener's answer Ready
 * (chaos soak: a run Ready for ~11 ms while llama-server printed "couldn't bind HTTP server socket"). What Linux
 * does (torvalds/linux fs/proc/fd.c, fs/proc/base.c, kernel/exit.c):
 * - reaped: the fd directory is ENOENT (proc_readfd_common finds no task), and so is the stat;
 * - exiting or a zombie: do_exit() sets PF_EXITING (stat field 9, fs/proc/array.c do_task_stat), then exit_mm()
 *   drops the mm, and task_dump_owner() makes a task without an mm owned by root, so proc_fd_permission() answers
 *   EACCES to anyone but root (root reads an empty directory once exit_files() ran, and no error); a zombie's
 *   state is Z;
 * - alive but not ours to read (another user, a non-dumpable engine): EACCES too, with none of the above. Only
 *   that one keeps its sockets unknown.
 * These states only move forward (exiting, zombie, reaped), so a stat read after the failed fd read is not stale.
 * A member that changed group (setsid, or its pid reused) is no longer the group's either.
 */
export const holdsNothing = (fdError: string | undefined, stat: string | Failed, pgid: number): boolean => {
  if (fdError === "ENOENT" || fdError === "ESRCH") return true
  if (typeof stat !== "string") return stat.failed === "ENOENT" || stat.failed === "ESRCH"
  const st = parseProcStat(stat)
  // flags: field 9, the 7th word after the command name (state, ppid, pgrp, session, tty_nr, tpgid, flags)
  const flags = Number(
    stat
      .slice(stat.lastIndexOf(")") + 2)
      .trim()
      .split(" ")[6]
  )
  if (st === undefined || !Number.isInteger(flags)) return false
  return st.pgrp !== pgid || st.state === "Z" || st.state === "X" || (flags & PF_EXITING) !== 0
}

/** The /proc reads portHolder makes, each throwing as node:fs does (tests give their own). */
export interface ProcReads {
  readonly text: (path: string) => string
  readonly dir: (path: string) => ReadonlyArray<string>
  readonly link: (path: string) => string
}

const nodeReads: ProcReads = {
  text: (p) => fs.readFileSync(p, "utf8"),
  dir: (p) => fs.readdirSync(p),
  link: (p) => fs.readlinkSync(p)
}

const attempt = <A>(read: () => A): A | Failed => {
  try {
    return read()
  } catch (err) {
    return { failed: (err as NodeJS.ErrnoException).code }
  }
}

const isFailed = (r: unknown): r is Failed => typeof r === "object" && r !== null && "failed" in r

/** portHolder over given reads and group members: the verdict for `port` and the process group `pgid`. */
export const portHolderFrom = (
  reads: ProcReads,
  port: number,
  pgid: number,
  members: ReadonlyArray<number>
): PortHolder => {
  const listeners = ["/proc/net/tcp", "/proc/net/tcp6"].flatMap((table) => {
    const text = attempt(() => reads.text(table))
    return isFailed(text) ? [] : listenerInodes(text, port)
  })
  if (listeners.length === 0) return "unknown"
  const sockets = new Set<string>()
  let allKnown = true
  for (const pid of members) {
    const fds = attempt(() => reads.dir(`/proc/${pid}/fd`))
    if (isFailed(fds)) {
      // Read after the failure, so a member caught exiting is seen as such (see holdsNothing).
      const stat = attempt(() => reads.text(`/proc/${pid}/stat`))
      if (!holdsNothing(fds.failed, stat, pgid)) allKnown = false
      continue
    }
    for (const fd of fds) {
      // An fd closed since the listing (or by an exit meanwhile) is ENOENT: it holds nothing any more.
      const link = attempt(() => reads.link(`/proc/${pid}/fd/${fd}`))
      const inode = isFailed(link) ? undefined : socketInode(link)
      if (inode !== undefined) sockets.add(inode)
    }
  }
  return portHolderOf(listeners, sockets, allKnown)
}

/** Who holds the listener on `port`: the process group `pgid`, another process, or unknown (see above). */
export const portHolder = (port: number, pgid: number): PortHolder =>
  portHolderFrom(nodeReads, port, pgid, groupMembers(pgid))
