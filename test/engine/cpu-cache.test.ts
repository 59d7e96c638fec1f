// The engine's CPU KV-cache tier, sized as the engine will size it: each backend names where its connector takes
// the size from (LaunchPlan.cpuCache, layers/engine/backends/cpuCacheTiers.ts) and the pure rules
// (services/engine/CpuCache.ts) work it out from the engine's whole environment (the agent's own, e.g. a container's
// env:, then the plan's, then [engine].env: engineEnvironment), its argv and a config file's text; cpuCacheReport
// (layers/engine/cpuCache.ts) reads that file, bounded, for `check` and the supervisor at start.
import { execFileSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Effect, Result } from "effect"
import { afterAll, describe, expect, it } from "vitest"
import { decodeConfigObject } from "../../src/layers/config/Config.ts"
import { engineFor } from "../../src/layers/engine/backends/index.ts"
import { cpuCacheReport } from "../../src/layers/engine/cpuCache.ts"
import { type ConfigFileRead, cpuCacheFiles, cpuCacheSize } from "../../src/services/engine/CpuCache.ts"
import type { LaunchPlan } from "../../src/services/engine/Engine.ts"
import { engineEnvironment } from "../../src/services/engine/EngineEnvironment.ts"

const plan = (engine: Record<string, unknown>, model: Record<string, unknown> = {}): LaunchPlan => {
  const raw = { engine, models: { m: { hf_repo: "org/m", tp: 2, ...model } } }
  const r = decodeConfigObject(raw, undefined, { NODE_NAME: "node-1" })
  if (Result.isFailure(r)) throw new Error(r.failure.message)
  return engineFor(r.success.engine.kind).render(r.success)
}

/** The tier's size for the plan, with the agent's own environment and the config files' texts as given. */
const sizeOf = (p: LaunchPlan, agentEnv: Record<string, string> = {}, files: Record<string, ConfigFileRead> = {}) =>
  cpuCacheSize(p.cpuCache, { env: engineEnvironment(agentEnv, p.env), argv: p.argv, files })

const GIB = 2 ** 30

describe("KVBM (vLLM): DYN_KVBM_CPU_CACHE_GB in KVBM's GB (10^9 bytes), for the whole engine", () => {
  const kvbm = (engine: Record<string, unknown> = {}) => plan({ kv_offload: "kvbm", kvbm_cpu_cache_gb: 300, ...engine })
  it("engine.kvbm_cpu_cache_gb, [engine].env winning, a block count or a non-number making it unknown", () => {
    expect(sizeOf(kvbm())).toEqual({ kind: "known", setting: "DYN_KVBM_CPU_CACHE_GB=300", bytes: 300e9 })
    expect(sizeOf(kvbm({ env: { DYN_KVBM_CPU_CACHE_GB: "2.5" } }))).toEqual({
      kind: "known",
      setting: "DYN_KVBM_CPU_CACHE_GB=2.5",
      bytes: 2.5e9
    })
    expect(sizeOf(kvbm({ env: { DYN_KVBM_CPU_CACHE_OVERRIDE_NUM_BLOCKS: "1000" } }))).toEqual({
      kind: "unknown",
      why: "DYN_KVBM_CPU_CACHE_OVERRIDE_NUM_BLOCKS=1000 sizes it instead"
    })
    expect(sizeOf(kvbm({ env: { DYN_KVBM_CPU_CACHE_GB: "lots" } }))?.kind).toBe("unknown")
    // KVBM parses the value as it is (no quotes stripped, unlike LMCache): a quoted one is no size of 300 GB
    expect(sizeOf(kvbm({ env: { DYN_KVBM_CPU_CACHE_GB: '"300"' } }))).toEqual({
      kind: "unknown",
      why: 'DYN_KVBM_CPU_CACHE_GB="300" is not a size'
    })
  })
  it("the agent's own environment (a container's env:) counts; only a disk tier: none", () => {
    expect(sizeOf(kvbm(), { DYN_KVBM_CPU_CACHE_OVERRIDE_NUM_BLOCKS: "1000" })?.kind).toBe("unknown")
    const diskOnly = plan({ kv_offload: "kvbm", kvbm_disk_cache_gb: 10 })
    expect(sizeOf(diskOnly)).toBeUndefined()
    expect(sizeOf(diskOnly, { DYN_KVBM_CPU_CACHE_GB: "64" })).toEqual({
      kind: "known",
      setting: "DYN_KVBM_CPU_CACHE_GB=64",
      bytes: 64e9
    })
  })
})

describe("LMCache (vLLM): max_local_cpu_size in GiB, per GPU worker; the environment over the file over 5", () => {
  const lmcache = (engine: Record<string, unknown> = {}, model: Record<string, unknown> = {}) =>
    plan({ kv_offload: "lmcache", ...engine }, model)
  const FILE = "/etc/lmcache.yaml"
  const withFile = { env: { LMCACHE_CONFIG_FILE: FILE } }
  const read = (text: string) => ({ [FILE]: { text } })

  it("LMCACHE_MAX_LOCAL_CPU_SIZE, once per GPU worker (tp x dp)", () => {
    // 0 is a size (no CPU tier), not "not a size": only below 0 is none
    expect(sizeOf(lmcache({ env: { LMCACHE_MAX_LOCAL_CPU_SIZE: "0" } }))).toMatchObject({ kind: "known", bytes: 0 })
    expect(sizeOf(lmcache({ env: { LMCACHE_MAX_LOCAL_CPU_SIZE: "20" } }))).toEqual({
      kind: "known",
      setting: "LMCACHE_MAX_LOCAL_CPU_SIZE=20 per GPU worker x 2 (tp 2)",
      bytes: 40 * GIB
    })
    expect(sizeOf(lmcache({}, { tp: 2, dp: 2 }), { LMCACHE_MAX_LOCAL_CPU_SIZE: "20" })).toEqual({
      kind: "known",
      setting: "LMCACHE_MAX_LOCAL_CPU_SIZE=20 per GPU worker x 4 (tp 2 x dp 2)",
      bytes: 80 * GIB
    })
    // one worker: no multiplication said
    expect(sizeOf(lmcache({}, { tp: 1 }), { LMCACHE_MAX_LOCAL_CPU_SIZE: "1.5" })).toEqual({
      kind: "known",
      setting: "LMCACHE_MAX_LOCAL_CPU_SIZE=1.5",
      bytes: 1.5 * GIB
    })
  })

  it("LMCACHE_MAX_LOCAL_CPU_SIZE in quotes reads as the number inside, as LMCache strips them from its environment", () => {
    for (const value of ['"5"', "'5'", ' "5" ']) {
      expect(sizeOf(lmcache({}, { tp: 1 }), { LMCACHE_MAX_LOCAL_CPU_SIZE: value })).toEqual({
        kind: "known",
        setting: `LMCACHE_MAX_LOCAL_CPU_SIZE=${value}`,
        bytes: 5 * GIB
      })
    }
    // Quotes that do not match are kept (LMCache too): not a size. Empty quotes: not set, the default decides.
    expect(sizeOf(lmcache({}, { tp: 1 }), { LMCACHE_MAX_LOCAL_CPU_SIZE: `"5'` })?.kind).toBe("unknown")
    expect(sizeOf(lmcache({}, { tp: 1 }), { LMCACHE_MAX_LOCAL_CPU_SIZE: '""' })).toMatchObject({ bytes: 5 * GIB })
  })

  it("nothing set: LMCache's default of 5 GiB per worker; local_cpu false does not shrink the buffer", () => {
    const byDefault = {
      kind: "known",
      setting: "LMCache's default max_local_cpu_size of 5 (GiB) per GPU worker x 2 (tp 2)",
      bytes: 10 * GIB
    }
    expect(sizeOf(lmcache())).toEqual(byDefault)
    expect(sizeOf(lmcache({ env: { LMCACHE_LOCAL_CPU: "False" } }))).toEqual(byDefault)
    // a file that does not set the key: the default too
    expect(sizeOf(lmcache(withFile), {}, read("chunk_size: 256\n"))).toEqual(byDefault)
  })

  it("the file LMCACHE_CONFIG_FILE names: its top-level key (the last, unquoted, comment cut); the variable wins", () => {
    expect(sizeOf(lmcache(withFile), {}, read("chunk_size: 256\nmax_local_cpu_size: 40.0  # GiB\n"))).toEqual({
      kind: "known",
      setting: `max_local_cpu_size: 40.0 in ${FILE} (LMCACHE_CONFIG_FILE) per GPU worker x 2 (tp 2)`,
      bytes: 80 * GIB
    })
    const twice = read("max_local_cpu_size: 1\r\n'max_local_cpu_size': \"8\"\r\n")
    expect(sizeOf(lmcache(withFile), {}, twice)).toMatchObject({
      setting: `max_local_cpu_size: 8 in ${FILE} (LMCACHE_CONFIG_FILE) per GPU worker x 2 (tp 2)`
    })
    expect(sizeOf(lmcache(withFile), { LMCACHE_MAX_LOCAL_CPU_SIZE: "2" }, read("max_local_cpu_size: 40\n"))).toEqual({
      kind: "known",
      setting: "LMCACHE_MAX_LOCAL_CPU_SIZE=2 per GPU worker x 2 (tp 2)",
      bytes: 4 * GIB
    })
  })

  it("a file not read, unreadable, or setting the key in a form not read here: unknown, saying why", () => {
    expect(sizeOf(lmcache(withFile))).toEqual({
      kind: "unknown",
      why: `set in ${FILE} (LMCACHE_CONFIG_FILE), which was not read`
    })
    expect(sizeOf(lmcache(withFile), {}, { [FILE]: { error: "ENOENT" } })).toEqual({
      kind: "unknown",
      why: `set in ${FILE} (LMCACHE_CONFIG_FILE), which could not be read: ENOENT`
    })
    for (const text of ['{"max_local_cpu_size": 40}', "ec:\n  max_local_cpu_size: 40\n"]) {
      expect(sizeOf(lmcache(withFile), {}, read(text))).toEqual({
        kind: "unknown",
        why: `max_local_cpu_size is in ${FILE} (LMCACHE_CONFIG_FILE), but not as a top-level "key: value" line`
      })
    }
    expect(sizeOf(lmcache(withFile), {}, read("max_local_cpu_size: lots\n"))?.kind).toBe("unknown")
  })

  it("names the file to read, from the engine's environment (the agent's own too)", () => {
    const p = lmcache()
    expect(cpuCacheFiles(p.cpuCache, engineEnvironment({}, p.env))).toEqual([])
    expect(cpuCacheFiles(p.cpuCache, engineEnvironment({ LMCACHE_CONFIG_FILE: FILE }, p.env))).toEqual([FILE])
  })
})

describe("SGLang HiCache: --hicache-size in GB per GPU worker; only --hicache-ratio: unknown", () => {
  const hicache = (args: ReadonlyArray<string> = [], model: Record<string, unknown> = {}) =>
    plan({ kind: "sglang", kv_offload: "hicache", args }, model)

  it("the agent's --hicache-ratio 2 alone (or a --hicache-size at or below 0, SGLang's unset): unknown before start", () => {
    const unset = [["--hicache-size", "0"], ["--hicache-size", "-1"], ["--hicache-size=-5"], ["--hicache-size", " 0 "]]
    for (const p of [hicache(), ...unset.map((args) => hicache(args))]) {
      const size = sizeOf(p)
      expect(size?.kind).toBe("unknown")
      expect(size?.kind === "unknown" && size.why).toContain("--hicache-ratio times its GPU KV pool")
    }
  })

  it("--hicache-size N or =N, the last one given, times the GPU workers (tp x dp), 10^9 bytes a GB", () => {
    expect(sizeOf(hicache(["--hicache-size", "100"]))).toEqual({
      kind: "known",
      setting: "--hicache-size 100 per GPU worker x 2 (tp 2)",
      bytes: 200e9
    })
    expect(sizeOf(hicache(["--hicache-size=1", "--hicache-size", "30"], { tp: 2, dp: 2 }))).toEqual({
      kind: "known",
      setting: "--hicache-size 30 per GPU worker x 4 (tp 2 x dp 2)",
      bytes: 120e9
    })
    expect(sizeOf(hicache(["--hicache-size=50"]))).toMatchObject({
      setting: "--hicache-size 50 per GPU worker x 2 (tp 2)"
    })
    expect(sizeOf(hicache(["--hicache-size", "lots"]))).toEqual({
      kind: "unknown",
      why: "--hicache-size lots is not a size"
    })
  })

  it("the hierarchical cache turned on through args counts too; other offloads and engines have no tier", () => {
    const viaArgs = plan({ kind: "sglang", args: ["--enable-hierarchical-cache", "--hicache-size", "8"] })
    expect(sizeOf(viaArgs)).toEqual({
      kind: "known",
      setting: "--hicache-size 8 per GPU worker x 2 (tp 2)",
      bytes: 16e9
    })
    expect(plan({ kind: "sglang" }).cpuCache).toBeUndefined()
    // SGLang's LMCache (MP mode: a separate `lmcache server` holds the store) is not sized: said as unknown, not none
    const sglangLmcache = sizeOf(plan({ kind: "sglang", kv_offload: "lmcache" }))
    expect(sglangLmcache?.kind === "unknown" && sglangLmcache.why).toMatch(/^SGLang's LMCache is not sized here: /)
    expect(plan({ kv_offload: "nixl" }, {}).cpuCache).toBeUndefined()
    expect(plan({ env: { DYN_KVBM_CPU_CACHE_GB: "300" } }).cpuCache).toBeUndefined()
  })
})

describe("cpuCacheReport: the config file read on this host, bounded, and the warning against the limit", () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-cpu-cache-"))
  afterAll(() => fs.rmSync(dir, { recursive: true, force: true }))
  const report = (file: string, limit = 8 * GIB) =>
    Effect.runPromise(cpuCacheReport(plan({ kv_offload: "lmcache" }), limit, { LMCACHE_CONFIG_FILE: file }))

  it("reads the file and warns when the total reaches the limit", async () => {
    const file = path.join(dir, "lmcache.yaml")
    fs.writeFileSync(file, "max_local_cpu_size: 4\n")
    const r = await report(file)
    expect(r.size).toEqual({
      kind: "known",
      setting: `max_local_cpu_size: 4 in ${file} (LMCACHE_CONFIG_FILE) per GPU worker x 2 (tp 2)`,
      bytes: 8 * GIB
    })
    expect(r.warning).toContain("is at or above the memory limit of the agent's cgroup (8.0 GiB)")
    expect((await report(file, 9 * GIB)).warning).toBeUndefined()
  })

  it("a missing file, a FIFO (not opened: it would block), a file over 64 KiB: unknown, no warning", async () => {
    const fifo = path.join(dir, "fifo.yaml")
    execFileSync("mkfifo", [fifo])
    const big = path.join(dir, "big.yaml")
    fs.writeFileSync(big, `max_local_cpu_size: 400\n${"#".repeat(70_000)}\n`)
    const whys = await Promise.all(
      [path.join(dir, "missing.yaml"), fifo, big].map(async (f) => {
        const r = await report(f)
        expect(r.warning).toBeUndefined()
        return r.size?.kind === "unknown" ? r.size.why : r.size
      })
    )
    expect(whys[0]).toContain("which could not be read: ENOENT")
    expect(whys[1]).toContain("which could not be read: not a regular file")
    expect(whys[2]).toContain("which could not be read: larger than 65536 bytes, not read")
  })

  it("a file of exactly 64 KiB is read", async () => {
    const full = path.join(dir, "full.yaml")
    const head = "max_local_cpu_size: 4\n"
    fs.writeFileSync(full, `${head}#${"#".repeat(64 * 1024 - head.length - 2)}\n`)
    expect(fs.statSync(full).size).toBe(64 * 1024)
    expect((await report(full)).size).toMatchObject({ kind: "known", bytes: 8 * GIB })
  })
})
