/**
 * The edges of services/node/MemoryCgroup.ts's readings that its table tests do not reach: a mount root is a whole
 * path segment (a sibling cgroup sharing its prefix is not under it), v1's "no limit" threshold itself, and the
 * unit formatBytes switches at.
 * Formats: proc(5) mountinfo (`root` is "the pathname of the directory in the filesystem which forms the root of this
 * mount"), cgroups(7) /proc/self/cgroup, Documentation/admin-guide/cgroup-v1/memory.rst (memory.limit_in_bytes).
 */
import { Result } from "effect"
import { describe, expect, it } from "vitest"
import { formatBytes, locateMemoryCgroup, parseMemoryLimit } from "../../src/services/node/MemoryCgroup.ts"

describe("memory cgroup boundaries", () => {
  it("takes a mount root as a whole path segment: /kubepods/pod1 does not hold /kubepods/pod12", () => {
    // Two cgroup2 mounts: the whole hierarchy at /sys/fs/cgroup, and a bind of pod1's cgroup elsewhere. The agent is in
    // pod12, a sibling whose name starts with pod1's: only the whole hierarchy's mount holds it (a path is under a mount
    // root when the root is one of its ancestors, compared by segment, not by characters).
    const cgroup = "0::/kubepods/pod12/ctr\n"
    const mountinfo = [
      "30 25 0:27 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw",
      "31 25 0:27 /kubepods/pod1 /mnt/pod1 rw,relatime - cgroup2 cgroup2 rw"
    ].join("\n")
    const found = locateMemoryCgroup(cgroup, mountinfo)
    expect(Result.isSuccess(found) && found.success.dir).toBe("/sys/fs/cgroup/kubepods/pod12/ctr")
    // pod1's own mount alone does not hold pod12: none found, rather than a directory inside pod1's
    expect(Result.isFailure(locateMemoryCgroup(cgroup, mountinfo.split("\n")[1]!))).toBe(true)
  })

  it("reads 2^62 bytes itself as no limit (v1's largest page count in bytes is above it for any page size)", () => {
    expect(parseMemoryLimit(String(2 ** 62))).toBe("none")
    expect(parseMemoryLimit(String(2 ** 62 - 2 ** 12))).toBe(2 ** 62 - 2 ** 12)
  })

  it("formats exactly 1 GiB as GiB, below it as MiB", () => {
    expect(formatBytes(2 ** 30)).toBe("1.0 GiB")
    expect(formatBytes(2 ** 30 - 2 ** 20)).toBe("1023.0 MiB")
  })
})
