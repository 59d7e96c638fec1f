/**
 * MemoryCgroup: the agent's memory cgroup, where the engine it spawns lives too (one container, one cgroup). The
 * kernel's OOM killer SIGKILLs a process that takes the cgroup over its limit; the engine's exit then says only
 * "signal SIGKILL" (or an exit code, when a worker was killed and the leader exited after it). The cgroup's own
 * count of OOM kills, read at a run's spawn and at its end, says what happened.
 *
 * Pure: from the text of /proc/self/cgroup and /proc/self/mountinfo, where the cgroup's files are, as runc and
 * cAdvisor find them (the hierarchy's mount, its mount root taken off the cgroup's path), and what the files say.
 * The reads are layers/node/MemoryCgroup.ts's. The formats:
 * - /proc/self/cgroup, cgroups(7): `hierarchy-ID:controller-list:cgroup-path`; cgroup v2 is the line `0::/path`.
 * - /proc/self/mountinfo, proc(5): `id parent major:minor root mount-point options [optional...] - fstype source
 *   super-options`, with space, tab, newline and backslash written as octal escapes (`\040`).
 * - cgroup v2, Documentation/admin-guide/cgroup-v2.rst: `memory.events` (`oom_kill N`: "the number of processes
 *   belonging to this cgroup killed by any kind of OOM killer", its descendants included), `memory.max` ("max" or
 *   bytes).
 * - cgroup v1, Documentation/admin-guide/cgroup-v1/memory.rst: `memory.oom_control` (`oom_kill_disable`,
 *   `under_oom`, and `oom_kill N` since Linux 4.13), `memory.limit_in_bytes` (bytes; no limit is the largest page
 *   count in bytes: 9223372036854771712 with 4 KiB pages).
 */
import { Context, Data, type Effect, Result } from "effect"

export type CgroupVersion = "v1" | "v2"

/** Where the agent's memory cgroup's files are. */
export interface MemoryCgroupFiles {
  readonly version: CgroupVersion
  readonly dir: string
  /** memory.events (v2) or memory.oom_control (v1): both have an `oom_kill N` line. */
  readonly oomKillsFile: string
  /** memory.max (v2) or memory.limit_in_bytes (v1). */
  readonly limitFile: string
}

/** A memory limit in bytes, or "none" when the cgroup has none. */
export type MemoryLimit = number | "none"

/** Why the agent's memory cgroup was not found (not Linux, /proc unreadable, no memory controller mounted). */
export class NoMemoryCgroup extends Data.TaggedError("NoMemoryCgroup")<{ readonly reason: string }> {
  override get message(): string {
    return `no memory cgroup: ${this.reason}`
  }
}

interface CgroupLine {
  readonly hierarchy: string
  readonly controllers: ReadonlyArray<string>
  readonly path: string
}

/** The lines of /proc/self/cgroup; a malformed line is skipped. */
export const parseProcCgroup = (text: string): ReadonlyArray<CgroupLine> =>
  text.split("\n").flatMap((line) => {
    const m = /^(\d+):([^:]*):(\/.*)$/.exec(line.trim())
    if (m === null) return []
    return [{ hierarchy: m[1]!, controllers: m[2] === "" ? [] : m[2]!.split(","), path: m[3]! }]
  })

export interface Mount {
  readonly root: string
  readonly mountPoint: string
  readonly fsType: string
  readonly superOptions: ReadonlyArray<string>
}

/** proc(5)'s octal escapes (`\040` for a space) turned back into characters. */
const unescapeOctal = (field: string): string =>
  field.replace(/\\([0-7]{3})/g, (_, octal: string) => String.fromCharCode(Number.parseInt(octal, 8)))

/** The mounts of /proc/self/mountinfo; a malformed line is skipped. */
export const parseMountinfo = (text: string): ReadonlyArray<Mount> =>
  text.split("\n").flatMap((line) => {
    const fields = line.trim().split(" ")
    const dash = fields.indexOf("-", 6)
    if (fields.length < 10 || dash < 0 || fields[dash + 1] === undefined) return []
    return [
      {
        root: unescapeOctal(fields[3]!),
        mountPoint: unescapeOctal(fields[4]!),
        fsType: fields[dash + 1]!,
        superOptions: (fields[dash + 3] ?? "").split(",")
      }
    ]
  })

const isUnder = (path: string, root: string): boolean => root === "/" || path === root || path.startsWith(`${root}/`)

/**
 * The directory of cgroup `path` under `mount`: the mount point plus the path less the mount root (runc's
 * GetCgroupMounts/getCgroupPathHelper do so). In a cgroup namespace the path is "/" and the mount root may name
 * the container's cgroup as the host sees it: the mount point is then the cgroup itself.
 */
const dirUnder = (mount: Mount, path: string): string | undefined => {
  const base = mount.mountPoint.replace(/\/+$/, "")
  if (isUnder(path, mount.root)) {
    const rest = mount.root === "/" ? path : path.slice(mount.root.length)
    return `${base}${rest === "/" ? "" : rest}` || "/"
  }
  return path === "/" ? mount.mountPoint : undefined
}

/** The first directory a mount of the hierarchy gives for `path`, the mount with the longest root first. */
const dirOf = (mounts: ReadonlyArray<Mount>, path: string): string | undefined =>
  [...mounts]
    .sort((a, b) => b.root.length - a.root.length)
    .map((m) => dirUnder(m, path))
    .find((d) => d !== undefined)

const filesOf = (version: CgroupVersion, dir: string): MemoryCgroupFiles =>
  version === "v2"
    ? { version, dir, oomKillsFile: `${dir}/memory.events`, limitFile: `${dir}/memory.max` }
    : { version, dir, oomKillsFile: `${dir}/memory.oom_control`, limitFile: `${dir}/memory.limit_in_bytes` }

/**
 * The agent's memory cgroup from /proc/self/cgroup and /proc/self/mountinfo. The memory controller on a v1
 * hierarchy wins: on a hybrid host (v1 controllers, a v2 mount at /sys/fs/cgroup/unified) the v2 hierarchy has
 * no memory controller. Without a v1 memory line, the unified (v2) hierarchy; its files may still be missing
 * (the memory controller not enabled there, or the root cgroup), which the reads find out.
 */
export const locateMemoryCgroup = (
  procCgroup: string,
  mountinfo: string
): Result.Result<MemoryCgroupFiles, NoMemoryCgroup> => {
  const lines = parseProcCgroup(procCgroup)
  const mounts = parseMountinfo(mountinfo)
  const v1 = lines.find((l) => l.hierarchy !== "0" && l.controllers.includes("memory"))
  if (v1 !== undefined) {
    const dir = dirOf(
      mounts.filter((m) => m.fsType === "cgroup" && m.superOptions.includes("memory")),
      v1.path
    )
    return dir === undefined
      ? Result.fail(new NoMemoryCgroup({ reason: `no mount of the v1 memory hierarchy holds ${v1.path}` }))
      : Result.succeed(filesOf("v1", dir))
  }
  const v2 = lines.find((l) => l.hierarchy === "0" && l.controllers.length === 0)
  if (v2 === undefined) return Result.fail(new NoMemoryCgroup({ reason: "no memory controller in /proc/self/cgroup" }))
  const dir = dirOf(
    mounts.filter((m) => m.fsType === "cgroup2"),
    v2.path
  )
  return dir === undefined
    ? Result.fail(new NoMemoryCgroup({ reason: `no cgroup2 mount holds ${v2.path}` }))
    : Result.succeed(filesOf("v2", dir))
}

/** The `oom_kill N` line of memory.events or memory.oom_control; undefined without one (v1 before Linux 4.13). */
export const parseOomKills = (text: string): number | undefined => {
  const m = /^oom_kill (\d+)$/m.exec(text)
  return m === null ? undefined : Number(m[1])
}

/**
 * v1's "no limit": PAGE_COUNTER_MAX pages in bytes, LONG_MAX rounded down to the page size (9223372036854771712
 * with 4 KiB pages, 9223372036854710272 with 64 KiB). No memory is that large: anything from 2^62 on is none.
 */
const V1_NO_LIMIT_FROM = 2 ** 62

/** memory.max ("max" or bytes) or memory.limit_in_bytes; undefined when the text is neither. */
export const parseMemoryLimit = (text: string): MemoryLimit | undefined => {
  const t = text.trim()
  if (t === "max") return "none"
  if (!/^\d+$/.test(t)) return undefined
  const bytes = Number(t)
  return bytes >= V1_NO_LIMIT_FROM ? "none" : bytes
}

/**
 * The kills the OOM killer made in the cgroup during one run, from its count at the run's spawn and at its end;
 * undefined when either is unknown, or when the count went down (not the same cgroup's counter).
 */
export const oomKillsDuring = (atSpawn: number | undefined, atEnd: number | undefined): number | undefined =>
  atSpawn === undefined || atEnd === undefined || atEnd < atSpawn ? undefined : atEnd - atSpawn

/** "8.0 GiB", "512.0 MiB". */
export const formatBytes = (bytes: number): string =>
  bytes >= 2 ** 30 ? `${(bytes / 2 ** 30).toFixed(1)} GiB` : `${(bytes / 2 ** 20).toFixed(1)} MiB`

/**
 * What to tell an operator when the engine's CPU KV-cache tier, once full, reaches the memory limit of the agent's
 * cgroup, which the engine shares: the kernel's OOM killer would end the engine as the tier fills, every run.
 * Undefined when it does not, or either side is unknown (no tier, no limit).
 */
export const cpuCacheOverLimit = (
  cpuCache: { readonly setting: string; readonly bytes: number; readonly lower: string } | undefined,
  limit: MemoryLimit | undefined
): string | undefined =>
  cpuCache === undefined || typeof limit !== "number" || cpuCache.bytes < limit
    ? undefined
    : `the engine's CPU KV-cache tier (${cpuCache.setting}: ${formatBytes(cpuCache.bytes)}) is at or above the ` +
      `memory limit of the agent's cgroup (${formatBytes(limit)}), which the engine shares: the kernel's OOM killer ` +
      `would end the engine as the tier fills. Raise the container's memory limit or lower the tier (${cpuCache.lower})`

/** The reads, each made when asked (nothing is cached: the count moves, the limit can be changed). */
export interface MemoryCgroupService {
  /** Which hierarchy the agent's memory cgroup is on; undefined when none was found. */
  readonly version: CgroupVersion | undefined
  /** The OOM killer's kills in the agent's memory cgroup so far; undefined when unknown. */
  readonly oomKills: Effect.Effect<number | undefined>
  /** The cgroup's memory limit now; undefined when unknown. */
  readonly limit: Effect.Effect<MemoryLimit | undefined>
}

export class MemoryCgroup extends Context.Service<MemoryCgroup, MemoryCgroupService>()("cgn-agent/MemoryCgroup") {}
