/**
 * A memory cgroup of the test's own, with a limit, for the tests that need the kernel's OOM killer for real: a child
 * of this process's memory cgroup (found as the agent finds its own: services/node/MemoryCgroup.ts), its limit on
 * that child only. cgroup v1: `memory.limit_in_bytes`, then `memory.memsw.limit_in_bytes` (memory plus swap: swap
 * cannot absorb what the limit refuses). cgroup v2: `memory.max` and `memory.swap.max = 0`, where the memory
 * controller is (or can be) enabled for the children (a cgroup with processes of its own cannot enable it: the
 * "no internal processes" rule). Needs root, or a delegated cgroup; `canCreateMemoryCgroup` says whether it works
 * here. A process enters it through `enter`: a shell that writes its own pid to cgroup.procs and execs the command.
 */
import * as fs from "node:fs"
import * as path from "node:path"
import { Result } from "effect"
import { locateMemoryCgroup, type MemoryCgroupFiles } from "../../src/services/node/MemoryCgroup.ts"
import { pollUntil } from "./poll.ts"

export interface TestCgroup {
  readonly dir: string
  readonly version: MemoryCgroupFiles["version"]
  readonly limitBytes: number
  /** The argv prefix that runs the command after it inside the cgroup (`[...enter, node, file, ...]`). */
  readonly enter: ReadonlyArray<string>
  /** The pids in it now. */
  readonly pids: () => ReadonlyArray<number>
  /** The OOM killer's kills in it so far (the kernel's own count). */
  readonly oomKills: () => number | undefined
  /**
   * Waits (bounded) until no process is left in it, SIGKILLs what a failed test left there (the test's own
   * processes: nothing else is in this cgroup), and removes it.
   */
  readonly remove: () => Promise<void>
}

/** This process's memory cgroup (undefined when none is found: not Linux, no memory controller). */
export const ownMemoryCgroup = (): MemoryCgroupFiles | undefined => {
  try {
    const found = locateMemoryCgroup(
      fs.readFileSync("/proc/self/cgroup", "utf8"),
      fs.readFileSync("/proc/self/mountinfo", "utf8")
    )
    return Result.isSuccess(found) ? found.success : undefined
  } catch {
    return undefined
  }
}

const pidsIn = (dir: string): Array<number> => {
  try {
    return fs
      .readFileSync(path.join(dir, "cgroup.procs"), "utf8")
      .split("\n")
      .filter((l) => l !== "")
      .map(Number)
  } catch {
    return []
  }
}

/** Creates `name` under this process's memory cgroup with `limitBytes`; throws where that cannot be done. */
export const createMemoryCgroup = (name: string, limitBytes: number): TestCgroup => {
  const own = ownMemoryCgroup()
  if (own === undefined) throw new Error("no memory cgroup found for this process")
  const dir = path.join(own.dir, name)
  fs.mkdirSync(dir)
  try {
    if (own.version === "v1") {
      fs.writeFileSync(path.join(dir, "memory.limit_in_bytes"), String(limitBytes))
      const memsw = path.join(dir, "memory.memsw.limit_in_bytes")
      if (fs.existsSync(memsw)) fs.writeFileSync(memsw, String(limitBytes))
    } else {
      if (!fs.existsSync(path.join(dir, "memory.max")))
        fs.writeFileSync(path.join(own.dir, "cgroup.subtree_control"), "+memory")
      fs.writeFileSync(path.join(dir, "memory.max"), String(limitBytes))
      const swap = path.join(dir, "memory.swap.max")
      if (fs.existsSync(swap)) fs.writeFileSync(swap, "0")
    }
  } catch (e) {
    fs.rmdirSync(dir)
    throw e
  }
  const oomKillsFile = path.join(dir, own.version === "v1" ? "memory.oom_control" : "memory.events")
  return {
    dir,
    version: own.version,
    limitBytes,
    enter: ["sh", "-c", 'echo $$ > "$0" && exec "$@"', path.join(dir, "cgroup.procs")],
    pids: () => pidsIn(dir),
    oomKills: () => {
      const m = /^oom_kill (\d+)$/m.exec(fs.readFileSync(oomKillsFile, "utf8"))
      return m === null ? undefined : Number(m[1])
    },
    remove: async () => {
      if (!fs.existsSync(dir)) return
      try {
        await pollUntil("the test cgroup empty", () => pidsIn(dir).length === 0, 10_000, 50)
      } catch {
        for (const pid of pidsIn(dir)) {
          try {
            process.kill(pid, "SIGKILL")
          } catch {
            // gone meanwhile
          }
        }
      }
      // rmdir answers EBUSY for a moment after the last process left
      await pollUntil(
        `rmdir ${dir}`,
        () => {
          fs.rmdirSync(dir)
          return true
        },
        10_000,
        50
      )
    }
  }
}

/** Whether a limited memory cgroup can be created here (root, or a delegated cgroup with the memory controller). */
export const canCreateMemoryCgroup: boolean = (() => {
  try {
    const probe = createMemoryCgroup(`cgn-probe-${process.pid}`, 64 * 2 ** 20)
    fs.rmdirSync(probe.dir)
    return true
  } catch {
    return false
  }
})()
