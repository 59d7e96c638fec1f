// The agent's memory cgroup from /proc/self/cgroup and /proc/self/mountinfo (services/node/MemoryCgroup.ts), on
// each layout a host has: cgroup v1 (the memory controller's own hierarchy), v2 (unified), hybrid (v1 controllers
// and a v2 mount without the memory controller), a cgroup namespace; what memory.events / memory.oom_control and
// memory.max / memory.limit_in_bytes say; the verdict for one run. The samples follow the kernel's formats
// (proc(5) mountinfo, cgroups(7), Documentation/admin-guide/cgroup-v2.rst and cgroup-v1/memory.rst); the hybrid one
// is this project's CI machine's, verbatim. Then the live reader on real files: read each time, never failing.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Effect, Result } from "effect"
import { afterAll, describe, expect, it } from "vitest"
import { fromFiles, locate } from "../../src/layers/node/MemoryCgroup.ts"
import {
  cpuCacheOverLimit,
  formatBytes,
  locateMemoryCgroup,
  type MemoryCgroupFiles,
  oomKillsDuring,
  parseMemoryLimit,
  parseMountinfo,
  parseOomKills
} from "../../src/services/node/MemoryCgroup.ts"

// This machine (a Firecracker VM's sandbox): v1 controllers, the memory one with the process in a child cgroup, and
// cgroup2 at /sys/fs/cgroup/unified with no controller of its own (hybrid).
const CI_CGROUP = `9:name=systemd:/
8:pids:/
7:blkio:/
6:freezer:/
5:devices:/
4:memory:/process_api/34474728acba9ba8ab8c87b89af51a69
3:cpuset:/
2:cpuacct:/
1:cpu:/
0::/
`
const CI_MOUNTINFO = `22 27 0:21 / /proc rw,relatime - proc proc rw
23 27 0:22 / /sys rw,relatime - sysfs sysfs rw
24 27 0:6 / /dev rw,relatime - devtmpfs devtmpfs rw,size=12334076k,nr_inodes=3083519,mode=755
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard,resv_strict,resuid=65534,resgid=65534
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`

// A systemd host on cgroup v2 (Debian 12, Ubuntu 22.04 and later): one cgroup2 mount, optional fields present.
const V2_HOST_CGROUP = "0::/user.slice/user-1000.slice/session-3.scope\n"
const V2_HOST_MOUNTINFO = `24 30 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
30 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro
35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
`

// A Kubernetes container on cgroup v2 with its own cgroup namespace (containerd's default there): its cgroup is
// "/" and /sys/fs/cgroup is a fresh cgroup2 mount of it.
const V2_POD_CGROUP = "0::/\n"
const V2_POD_MOUNTINFO = `1465 1464 0:322 / /sys ro,nosuid,nodev,noexec,relatime - sysfs sysfs ro
1466 1465 0:30 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw,nsdelegate,memory_recursiveprot
`

// The same container where the host's cgroup2 is bind-mounted in: the mount root names the container's cgroup as the
// host sees it, while /proc/self/cgroup says "/" (the namespace's root): the mount point is the container's cgroup.
const V2_NS_BIND_MOUNTINFO = `1466 1465 0:30 /kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope /sys/fs/cgroup ro,relatime - cgroup2 cgroup2 rw
`

// Docker on a cgroup v1 host without a cgroup namespace: the memory hierarchy mounted at the container's own cgroup.
const V1_DOCKER_CGROUP = `12:pids:/docker/0123abcd
11:cpu,cpuacct:/docker/0123abcd
4:memory:/docker/0123abcd
1:name=systemd:/docker/0123abcd
`
const V1_DOCKER_MOUNTINFO = `700 699 0:60 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - tmpfs tmpfs rw,mode=755
705 700 0:28 /docker/0123abcd /sys/fs/cgroup/cpu,cpuacct ro,nosuid,nodev,noexec,relatime master:16 - cgroup cgroup rw,cpu,cpuacct
708 700 0:31 /docker/0123abcd /sys/fs/cgroup/memory ro,nosuid,nodev,noexec,relatime master:19 - cgroup cgroup rw,memory
`

// A cgroup v1 host's own process (no unified mount at all), and a mount point with a space in it (proc(5): \\040).
const V1_HOST_CGROUP = "5:memory:/system.slice/cgn-agent.service\n3:cpu,cpuacct:/system.slice/cgn-agent.service\n"
const V1_HOST_MOUNTINFO = `25 24 0:23 / /sys/fs/cgroup/my\\040memory rw,nosuid,nodev,noexec,relatime shared:10 - cgroup cgroup rw,memory
26 24 0:24 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,cpu,cpuacct
`

// A v1 container in a cgroup namespace on a bind mount of the host's hierarchy.
const V1_NS_CGROUP = "4:memory:/\n"
const V1_NS_MOUNTINFO = `708 700 0:31 /kubepods/burstable/pod1/abc /sys/fs/cgroup/memory ro,relatime - cgroup cgroup rw,memory
`

// The v1 memory hierarchy mounted twice: its root first (a path of the host's, absent in a container that bind-mounts
// only its pod's subtree), then the pod's subtree elsewhere. The mount with the longest root that holds the cgroup
// is the one to read, whichever mountinfo lists first.
const V1_TWICE_CGROUP = "5:memory:/kubepods/pod1/c1\n0::/\n"
const V1_TWICE_MOUNTINFO = `30 20 0:26 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
31 20 0:26 /kubepods/pod1 /pod-memory rw,nosuid - cgroup cgroup rw,memory
`

const located = (cgroup: string, mountinfo: string): MemoryCgroupFiles | string =>
  Result.match(locateMemoryCgroup(cgroup, mountinfo), { onSuccess: (f) => f, onFailure: (e) => e.message })

describe("locateMemoryCgroup", () => {
  it.each([
    [
      "hybrid (this CI machine): the v1 memory hierarchy, not the unified mount",
      CI_CGROUP,
      CI_MOUNTINFO,
      {
        version: "v1",
        dir: "/sys/fs/cgroup/memory/process_api/34474728acba9ba8ab8c87b89af51a69",
        oomKillsFile: "/sys/fs/cgroup/memory/process_api/34474728acba9ba8ab8c87b89af51a69/memory.oom_control",
        limitFile: "/sys/fs/cgroup/memory/process_api/34474728acba9ba8ab8c87b89af51a69/memory.limit_in_bytes"
      }
    ],
    [
      "v1 hierarchy mounted twice: the mount with the longest root that holds the cgroup, though listed second",
      V1_TWICE_CGROUP,
      V1_TWICE_MOUNTINFO,
      {
        version: "v1",
        dir: "/pod-memory/c1",
        oomKillsFile: "/pod-memory/c1/memory.oom_control",
        limitFile: "/pod-memory/c1/memory.limit_in_bytes"
      }
    ],
    [
      "v2 host: the cgroup under the cgroup2 mount",
      V2_HOST_CGROUP,
      V2_HOST_MOUNTINFO,
      {
        version: "v2",
        dir: "/sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope",
        oomKillsFile: "/sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope/memory.events",
        limitFile: "/sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope/memory.max"
      }
    ],
    [
      "v2 pod in its own cgroup namespace: the mount itself",
      V2_POD_CGROUP,
      V2_POD_MOUNTINFO,
      {
        version: "v2",
        dir: "/sys/fs/cgroup",
        oomKillsFile: "/sys/fs/cgroup/memory.events",
        limitFile: "/sys/fs/cgroup/memory.max"
      }
    ],
    [
      "v2 namespace over a bind mount of the host's hierarchy: the mount root is the container's cgroup",
      V2_POD_CGROUP,
      V2_NS_BIND_MOUNTINFO,
      {
        version: "v2",
        dir: "/sys/fs/cgroup",
        oomKillsFile: "/sys/fs/cgroup/memory.events",
        limitFile: "/sys/fs/cgroup/memory.max"
      }
    ],
    [
      "v1 Docker: the mount root is the container's cgroup, taken off its path",
      V1_DOCKER_CGROUP,
      V1_DOCKER_MOUNTINFO,
      {
        version: "v1",
        dir: "/sys/fs/cgroup/memory",
        oomKillsFile: "/sys/fs/cgroup/memory/memory.oom_control",
        limitFile: "/sys/fs/cgroup/memory/memory.limit_in_bytes"
      }
    ],
    [
      "v1 host without a unified mount; an escaped space in the mount point",
      V1_HOST_CGROUP,
      V1_HOST_MOUNTINFO,
      {
        version: "v1",
        dir: "/sys/fs/cgroup/my memory/system.slice/cgn-agent.service",
        oomKillsFile: "/sys/fs/cgroup/my memory/system.slice/cgn-agent.service/memory.oom_control",
        limitFile: "/sys/fs/cgroup/my memory/system.slice/cgn-agent.service/memory.limit_in_bytes"
      }
    ],
    [
      "v1 in a cgroup namespace over a bind mount: the mount point",
      V1_NS_CGROUP,
      V1_NS_MOUNTINFO,
      {
        version: "v1",
        dir: "/sys/fs/cgroup/memory",
        oomKillsFile: "/sys/fs/cgroup/memory/memory.oom_control",
        limitFile: "/sys/fs/cgroup/memory/memory.limit_in_bytes"
      }
    ]
  ])("%s", (_, cgroup, mountinfo, expected) => {
    expect(located(cgroup, mountinfo)).toEqual(expected)
  })

  it.each([
    ["nothing read (macOS, no /proc)", "", "", "no memory cgroup: no memory controller in /proc/self/cgroup"],
    [
      "a v1 memory line, its hierarchy not mounted here",
      V1_DOCKER_CGROUP,
      V2_HOST_MOUNTINFO,
      "no memory cgroup: no mount of the v1 memory hierarchy holds /docker/0123abcd"
    ],
    [
      "a v2 line, no cgroup2 mount",
      V2_HOST_CGROUP,
      "",
      "no memory cgroup: no cgroup2 mount holds /user.slice/user-1000.slice/session-3.scope"
    ],
    [
      "a path outside the mount's root (another namespace's cgroup)",
      "0::/../other\n",
      V2_NS_BIND_MOUNTINFO,
      "no memory cgroup: no cgroup2 mount holds /../other"
    ]
  ])("%s: none, and why", (_, cgroup, mountinfo, why) => {
    expect(located(cgroup, mountinfo)).toBe(why)
  })

  it("reads mountinfo's fields around the optional ones", () => {
    expect(parseMountinfo(V1_DOCKER_MOUNTINFO)[1]).toEqual({
      root: "/docker/0123abcd",
      mountPoint: "/sys/fs/cgroup/cpu,cpuacct",
      fsType: "cgroup",
      superOptions: ["rw", "cpu", "cpuacct"]
    })
    expect(parseMountinfo("garbage\n\n1 2 3\n")).toEqual([])
  })
})

describe("the files' values", () => {
  it.each([
    ["v2 memory.events", "low 0\nhigh 0\nmax 41\noom 3\noom_kill 2\noom_group_kill 0\n", 2],
    ["v1 memory.oom_control (Linux 4.13+)", "oom_kill_disable 0\nunder_oom 0\noom_kill 7\n", 7],
    ["v1 memory.oom_control before Linux 4.13: no count", "oom_kill_disable 0\nunder_oom 0\n", undefined],
    ["oom_group_kill alone is not the count", "oom 1\noom_group_kill 1\n", undefined],
    ["empty", "", undefined]
  ])("oom_kill in %s", (_, text, kills) => {
    expect(parseOomKills(text)).toBe(kills)
  })

  it.each([
    ["v2 no limit", "max\n", "none"],
    ["v2 8 GiB", "8589934592\n", 8589934592],
    ["v1 256 GiB", "274877906944\n", 274877906944],
    ["v1 no limit, 4 KiB pages", "9223372036854771712\n", "none"],
    ["v1 no limit, 64 KiB pages", "9223372036854710272\n", "none"],
    ["not a limit", "-1\n", undefined],
    ["empty", "", undefined]
  ])("the limit: %s", (_, text, limit) => {
    expect(parseMemoryLimit(text)).toBe(limit)
  })

  it.each([
    [0, 0, 0],
    [0, 1, 1],
    [3, 5, 2],
    [undefined, 1, undefined],
    [1, undefined, undefined],
    [5, 3, undefined]
  ])("kills during a run: %s at the spawn, %s at the end -> %s", (atSpawn, atEnd, kills) => {
    expect(oomKillsDuring(atSpawn, atEnd)).toBe(kills)
  })

  it("formats a limit in GiB, or MiB below one", () => {
    expect([formatBytes(256 * 2 ** 30), formatBytes(8 * 2 ** 30), formatBytes(512 * 2 ** 20)]).toEqual([
      "256.0 GiB",
      "8.0 GiB",
      "512.0 MiB"
    ])
  })
})

describe("the live reader", () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-memcg-"))
  afterAll(() => fs.rmSync(dir, { recursive: true, force: true }))
  const files: MemoryCgroupFiles = {
    version: "v2",
    dir,
    oomKillsFile: path.join(dir, "memory.events"),
    limitFile: path.join(dir, "memory.max")
  }

  it("reads the count and the limit each time it is asked, and says unknown (once told why) when it cannot", async () => {
    const told: Array<string> = []
    const reader = fromFiles(files, (why) => Effect.sync(() => void told.push(why)))
    expect(await Effect.runPromise(reader.oomKills)).toBeUndefined()
    expect(told[0]).toContain("memory.events: ENOENT")
    fs.writeFileSync(files.oomKillsFile, "oom 0\noom_kill 0\n")
    fs.writeFileSync(files.limitFile, "max\n")
    expect(await Effect.runPromise(Effect.all([reader.oomKills, reader.limit]))).toEqual([0, "none"])
    fs.writeFileSync(files.oomKillsFile, "oom 1\noom_kill 1\n")
    fs.writeFileSync(files.limitFile, "536870912\n")
    expect(await Effect.runPromise(Effect.all([reader.oomKills, reader.limit]))).toEqual([1, 536870912])
    fs.writeFileSync(files.oomKillsFile, "oom_kill_disable 0\n")
    expect(await Effect.runPromise(reader.oomKills)).toBeUndefined()
    expect(told[1]).toContain("not understood")
  })

  it("without a cgroup every read is unknown", async () => {
    const none = fromFiles(undefined)
    expect(none.version).toBeUndefined()
    expect(await Effect.runPromise(Effect.all([none.oomKills, none.limit]))).toEqual([undefined, undefined])
  })

  it("on this host: found where /proc/self/cgroup names a memory hierarchy, with its files there", async () => {
    const found = await Effect.runPromise(Effect.result(locate))
    if (Result.isFailure(found)) {
      // not Linux, or no memory controller: the failure says why, and nothing else happens
      expect(found.failure.message).toMatch(/^no memory cgroup: /)
      return
    }
    expect(fs.existsSync(found.success.oomKillsFile)).toBe(true)
    expect(fs.existsSync(found.success.limitFile)).toBe(true)
    const reader = fromFiles(found.success)
    expect(typeof (await Effect.runPromise(reader.limit))).toMatch(/number|string/)
  })
})

describe("cpuCacheOverLimit: the engine's CPU KV-cache tier against the cgroup's limit", () => {
  const tier = (gb: number) => ({
    setting: `DYN_KVBM_CPU_CACHE_GB=${gb}`,
    bytes: gb * 1e9,
    lower: "engine.kvbm_cpu_cache_gb, or the variable in [engine].env"
  })
  const limit = 256 * 2 ** 30
  it("says so at or above the limit, with the setting, both sizes and what to do", () => {
    expect(cpuCacheOverLimit(tier(300), limit)).toBe(
      "the engine's CPU KV-cache tier (DYN_KVBM_CPU_CACHE_GB=300: 279.4 GiB) is at or above the memory limit of the " +
        "agent's cgroup (256.0 GiB), which the engine shares: the kernel's OOM killer would end the engine as the tier " +
        "fills. Raise the container's memory limit or lower the tier (engine.kvbm_cpu_cache_gb, or the variable in " +
        "[engine].env)"
    )
    // 274.877906944 GB is 256 GiB exactly: at the limit
    expect(cpuCacheOverLimit(tier(274.877906944), limit)).toBeDefined()
  })
  it("nothing below the limit, without a limit, or without a tier", () => {
    expect(cpuCacheOverLimit(tier(274.8), limit)).toBeUndefined()
    expect(cpuCacheOverLimit(tier(300), "none")).toBeUndefined()
    expect(cpuCacheOverLimit(tier(300), undefined)).toBeUndefined()
    expect(cpuCacheOverLimit(undefined, limit)).toBeUndefined()
  })
})
