/**
 * Process-group mechanics shared by the supervisor and the orphan guard (plain Node, no Effect, so the guard
 * stays a tiny program): is a group or a pid still alive, and signal a group. The timed stop sequences live with
 * their runtime: the guard's in programs/guard.ts, the agent's on Effect's Clock in groupWait.ts.
 * Zombies count as dead: `kill(-pgid, 0)` succeeds for a group whose members are all zombies (PID 1 in a
 * container often does not reap), so liveness reads each member's state from /proc where it exists.
 */
import * as fs from "node:fs"

export interface ProcStat {
  readonly pid: number
  /** R, S, D, Z, T, ... */
  readonly state: string
  readonly ppid: number
  readonly pgrp: number
}

/** Parses /proc/<pid>/stat; the command name may contain spaces and parentheses, so split after the last `)`. */
export const parseProcStat = (text: string): ProcStat | undefined => {
  const close = text.lastIndexOf(")")
  if (close < 0) return undefined
  const pid = Number.parseInt(text.slice(0, text.indexOf(" ")), 10)
  const rest = text
    .slice(close + 2)
    .trim()
    .split(" ")
  const [state, ppid, pgrp] = rest
  if (state === undefined || ppid === undefined || pgrp === undefined || Number.isNaN(pid)) return undefined
  return { pid, state, ppid: Number(ppid), pgrp: Number(pgrp) }
}

/** Field 22 of /proc/<pid>/stat: when the process started, in clock ticks after boot. */
export const startTicksOf = (statText: string): number | undefined => {
  const close = statText.lastIndexOf(")")
  if (close < 0) return undefined
  // After the command name: state is field 3, so starttime (22) is the 20th word.
  const ticks = Number(
    statText
      .slice(close + 2)
      .trim()
      .split(" ")[19]
  )
  return Number.isInteger(ticks) && ticks >= 0 ? ticks : undefined
}

/** `btime` of /proc/stat: the boot time, epoch seconds. */
export const bootTimeOf = (procStatText: string): number | undefined => {
  const m = /^btime (\d+)$/m.exec(procStatText)
  return m === null ? undefined : Number(m[1])
}

/**
 * When process `pid` started, epoch milliseconds, or undefined where /proc cannot say. Clock ticks are USER_HZ,
 * 100 on every mainstream Linux build (Node has no sysconf): the result is good to 10 ms.
 */
export const processStartMs = (pid: number): number | undefined => {
  try {
    const ticks = startTicksOf(fs.readFileSync(`/proc/${pid}/stat`, "utf8"))
    const boot = bootTimeOf(fs.readFileSync("/proc/stat", "utf8"))
    return ticks === undefined || boot === undefined ? undefined : boot * 1000 + ticks * 10
  } catch {
    return undefined
  }
}

/** Whether this host has procfs (Linux): without it, a process's start and executable cannot be told. */
export const hasProc = fs.existsSync("/proc/self/stat")

/**
 * The executable process `pid` runs (the link /proc/<pid>/exe, without the " (deleted)" of a replaced binary), or
 * undefined where it cannot be read: gone, no /proc, or another user's process for an agent that is not root
 * (proc(5): the link needs ptrace access). A title a process sets for itself (setproctitle) does not change it.
 */
export const processExe = (pid: number): string | undefined => {
  try {
    return fs.readlinkSync(`/proc/${pid}/exe`).replace(/ \(deleted\)$/, "")
  } catch {
    return undefined
  }
}

/** /proc/<pid>/stat parsed, or undefined when that process is not visible here. */
export const readStat = (pid: number): ProcStat | undefined => {
  try {
    return parseProcStat(fs.readFileSync(`/proc/${pid}/stat`, "utf8"))
  } catch {
    return undefined
  }
}

/** kill(target, 0): true when something exists there (EPERM also means it exists). */
const exists = (target: number): boolean => {
  try {
    process.kill(target, 0)
    return true
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM"
  }
}

/** The live (non-zombie) members of a process group; [] once it is gone. */
export const groupMembers = (pgid: number): ReadonlyArray<number> => {
  if (!Number.isInteger(pgid) || pgid <= 1 || !exists(-pgid)) return []
  if (!hasProc) return [pgid]
  const members: Array<number> = []
  for (const name of fs.readdirSync("/proc")) {
    const pid = Number(name)
    if (!Number.isInteger(pid)) continue
    const st = readStat(pid)
    if (st !== undefined && st.pgrp === pgid && st.state !== "Z" && st.state !== "X") members.push(pid)
  }
  return members
}

export const groupAlive = (pgid: number): boolean => groupMembers(pgid).length > 0

/** Whether one process is alive (not a zombie). */
export const pidAlive = (pid: number): boolean => {
  // pid 1 is a real process (the agent itself in a container without an init); 0 and below name groups.
  if (!Number.isInteger(pid) || pid < 1 || !exists(pid)) return false
  if (!hasProc) return true
  const st = readStat(pid)
  return st !== undefined && st.state !== "Z" && st.state !== "X"
}

/** Signals the whole group; false when there is no such group. Never throws. */
export const signalGroup = (pgid: number, signal: NodeJS.Signals): boolean => {
  if (!Number.isInteger(pgid) || pgid <= 1) return false
  try {
    process.kill(-pgid, signal)
    return true
  } catch {
    return false
  }
}

/** How long a stop waits for a SIGKILLed group to be gone (it is the kernel's job, so not long). */
export const KILL_WAIT_MS = 2_000
