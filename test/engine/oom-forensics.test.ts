// The supervisor's engine-run forensics for the OOM killer (layers/engine/runOnce.ts): the agent's memory cgroup's
// kill count is read at each run's spawn and at its end, and the run's ExitRecord carries the difference and the
// cgroup's limit; cgn_agent_engine_oom_kills_total adds each run's kills. The production EngineProcess with a fake
// EngineHost (nothing spawned) and a MemoryCgroup whose count the test moves, on a TestClock. The real kernel's OOM
// kill, through the built agent: test/engine/oom-kill.test.ts.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Context, Deferred, Effect, Layer, Logger, Ref, Result } from "effect"
import { TestClock } from "effect/testing"
import { decodeConfigObject } from "../../src/layers/config/Config.ts"
import { kvbmTier } from "../../src/layers/engine/backends/cpuCacheTiers.ts"
import { engineFor } from "../../src/layers/engine/backends/index.ts"
import { layerFromPlan } from "../../src/layers/engine/EngineProcess.ts"
import type { SupervisorSettings } from "../../src/layers/engine/supervisorSettings.ts"
import type { LaunchPlan } from "../../src/services/engine/Engine.ts"
import { EngineHost, type RunExit } from "../../src/services/engine/EngineHost.ts"
import { EngineProcess, type ExitRecord } from "../../src/services/engine/EngineProcess.ts"
import { MemoryCgroup, type MemoryLimit } from "../../src/services/node/MemoryCgroup.ts"
import { Metrics } from "../../src/services/observability/Metrics.ts"
import { testPlan } from "../../src/testing/EngineProcess.ts"
import * as MetricsTest from "../../src/testing/Metrics.ts"
import { makeFakeHost } from "../support/fakeEngineHost.ts"
import { settle } from "../support/poll.ts"

const settings = (stateDir: string): SupervisorSettings => ({
  startupTimeoutMs: 600_000,
  stopGraceMs: 500,
  livenessIntervalMs: 1_000,
  livenessFailures: 3,
  backoff: { initialMs: 1_000, maxMs: 1_000, stableAfterMs: 600_000, crashLoopAfter: 10 },
  stateDir,
  verifyListener: false,
  probeIntervalMs: 500,
  progressEveryMs: 60_000,
  linesKept: 10
})

/**
 * The supervisor over the fake host, with a MemoryCgroup reading `count` and `limit` (none: no MemoryCgroup at
 * all) and the test Metrics; `end(exit, kills)` adds `kills` to the count and ends the current run with `exit`.
 */
const supervise = (cgroup: { readonly count: Ref.Ref<number | undefined>; readonly limit: MemoryLimit } | "none") =>
  Effect.gen(function* () {
    const stateDir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-oom-"))
    yield* Effect.addFinalizer(() => Effect.sync(() => fs.rmSync(stateDir, { recursive: true, force: true })))
    // runs the test ends one by one; never Ready (the fake's `up` stays false)
    const fake = yield* makeFakeHost()
    const memory =
      cgroup === "none"
        ? Layer.empty
        : Layer.succeed(
            MemoryCgroup,
            MemoryCgroup.of({ version: "v2", oomKills: Ref.get(cgroup.count), limit: Effect.succeed(cgroup.limit) })
          )
    const context = yield* Layer.build(
      layerFromPlan(testPlan({ port: 1 }), settings(stateDir)).pipe(
        Layer.provideMerge(Layer.mergeAll(Layer.succeed(EngineHost, fake.host), memory, MetricsTest.layerTest)),
        Layer.provide(Logger.layer([]))
      )
    )
    const engine = Context.get(context, EngineProcess)
    const metrics = Context.get(context, Metrics)
    const end = (n: number, exit: Omit<RunExit, "problem">, kills = 0) =>
      Effect.gen(function* () {
        yield* settle(
          `run ${n} spawned`,
          Effect.map(Ref.get(fake.runs), (xs) => xs.length > n)
        )
        if (cgroup !== "none" && kills > 0) yield* Ref.update(cgroup.count, (c) => (c ?? 0) + kills)
        yield* Deferred.succeed((yield* Ref.get(fake.runs))[n]!.exited, { ...exit, problem: undefined })
        yield* settle(
          `run ${n} recorded`,
          Effect.map(engine.exits, (xs) => xs.length > n)
        )
        yield* TestClock.adjust(1_000)
        return (yield* engine.exits)[0]!
      })
    const oomCounter = Effect.promise(() => metrics.engineOomKills.get()).pipe(
      Effect.map((m) => m.values.map((v) => v.value))
    )
    return { engine, end, oomCounter }
  })

const forensics = (x: ExitRecord) => ({
  signal: x.signal,
  code: x.code,
  oomKills: x.oomKills,
  limit: x.memoryLimitBytes
})

describe("engine runs and the OOM killer", () => {
  it.effect("each run's exit carries the kills made during it and the limit; the counter adds them up", () =>
    Effect.gen(function* () {
      const count = yield* Ref.make<number | undefined>(5)
      const s = yield* supervise({ count, limit: 8 * 2 ** 30 })
      // 0 from the start: increase() sees the first kill
      assert.deepStrictEqual(yield* s.oomCounter, [0])

      const killed = yield* s.end(0, { code: null, signal: "SIGKILL" }, 1)
      assert.deepStrictEqual(forensics(killed), { signal: "SIGKILL", code: null, oomKills: 1, limit: 8 * 2 ** 30 })
      assert.deepStrictEqual(yield* s.oomCounter, [1])

      // a worker killed twice, the leader exiting with a code: the kills are the run's all the same
      const worker = yield* s.end(1, { code: 1, signal: null }, 2)
      assert.deepStrictEqual(forensics(worker), { signal: null, code: 1, oomKills: 2, limit: 8 * 2 ** 30 })
      assert.deepStrictEqual(yield* s.oomCounter, [3])

      // a SIGKILL from elsewhere: the count did not move
      const other = yield* s.end(2, { code: null, signal: "SIGKILL" })
      assert.deepStrictEqual(forensics(other), { signal: "SIGKILL", code: null, oomKills: 0, limit: 8 * 2 ** 30 })

      // the count unreadable at the end: unknown, not 0, and nothing counted
      yield* Ref.set(count, undefined)
      const unknown = yield* s.end(3, { code: null, signal: "SIGKILL" }, 1)
      assert.strictEqual(unknown.oomKills, undefined)
      assert.deepStrictEqual(yield* s.oomCounter, [3])
      yield* s.engine.stop
    })
  )

  it.effect("no limit on the cgroup: the kills without one", () =>
    Effect.gen(function* () {
      const s = yield* supervise({ count: yield* Ref.make<number | undefined>(0), limit: "none" })
      const killed = yield* s.end(0, { code: null, signal: "SIGKILL" }, 1)
      assert.deepStrictEqual(forensics(killed), { signal: "SIGKILL", code: null, oomKills: 1, limit: undefined })
      yield* s.engine.stop
    })
  )

  it.effect("no memory cgroup (macOS, a laptop): unknown, and the counter stays 0", () =>
    Effect.gen(function* () {
      const s = yield* supervise("none")
      const killed = yield* s.end(0, { code: null, signal: "SIGKILL" })
      assert.deepStrictEqual(forensics(killed), {
        signal: "SIGKILL",
        code: null,
        oomKills: undefined,
        limit: undefined
      })
      assert.deepStrictEqual(yield* s.oomCounter, [0])
      yield* s.engine.stop
    })
  )
})

describe("the engine's CPU KV-cache tier against the memory limit, at start", () => {
  /** What the supervisor logs at `level` while it is built with the plan's CPU tier and a cgroup limited to 8 GiB. */
  const startLogs = (plan: Partial<LaunchPlan>, level: "Warn" | "Info" = "Warn") =>
    Effect.gen(function* () {
      const stateDir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-oom-"))
      yield* Effect.addFinalizer(() => Effect.sync(() => fs.rmSync(stateDir, { recursive: true, force: true })))
      const warnings: Array<string> = []
      const collect = Logger.make<unknown, void>(({ logLevel, message }) => {
        if (logLevel === level) warnings.push(String(Array.isArray(message) ? message[0] : message))
      })
      const fake = yield* makeFakeHost()
      const cgroup = MemoryCgroup.of({ version: "v2", oomKills: Effect.succeed(0), limit: Effect.succeed(8 * 2 ** 30) })
      const context = yield* Layer.build(
        layerFromPlan({ ...testPlan({ port: 1 }), ...plan }, settings(stateDir)).pipe(
          Layer.provideMerge(
            Layer.mergeAll(
              Layer.succeed(EngineHost, fake.host),
              Layer.succeed(MemoryCgroup, cgroup),
              MetricsTest.layerTest
            )
          ),
          Layer.provide(Logger.layer([collect]))
        )
      )
      yield* Context.get(context, EngineProcess).stop
      return warnings.filter((w) => w.includes("CPU KV-cache tier"))
    })
  /** KVBM's CPU tier at `gb`. */
  const startWarnings = (gb: string | undefined) =>
    startLogs({ env: gb === undefined ? {} : { DYN_KVBM_CPU_CACHE_GB: gb }, cpuCache: kvbmTier })

  it.effect("a tier at or above the limit is logged once as a warning; one below it, or none, is not", () =>
    Effect.gen(function* () {
      const over = yield* startWarnings("10")
      assert.deepStrictEqual(over, [
        "the engine's CPU KV-cache tier (DYN_KVBM_CPU_CACHE_GB=10: 9.3 GiB) is at or above the memory limit of the " +
          "agent's cgroup (8.0 GiB), which the engine shares: the kernel's OOM killer would end the engine as the " +
          "tier fills. Raise the container's memory limit or lower the tier (engine.kvbm_cpu_cache_gb, or the " +
          "variable in [engine].env)"
      ])
      const under = yield* startWarnings("4")
      assert.deepStrictEqual(under, [])
      // the agent's own environment reaches the engine (a container's env:): a block count set there sizes the
      // tier instead, so the GB value says nothing and no warning is given
      process.env.DYN_KVBM_CPU_CACHE_OVERRIDE_NUM_BLOCKS = "1000"
      const overridden = yield* startWarnings("10").pipe(
        Effect.ensuring(Effect.sync(() => delete process.env.DYN_KVBM_CPU_CACHE_OVERRIDE_NUM_BLOCKS))
      )
      assert.deepStrictEqual(overridden, [])
      const none = yield* startWarnings(undefined)
      assert.deepStrictEqual(none, [])
    })
  )

  /** The argv and CPU tier the vLLM (or SGLang) backend renders for `engine` and `tp`. */
  const tierOf = (engine: Record<string, unknown>, tp: number) => {
    const r = decodeConfigObject({ engine, models: { m: { hf_repo: "org/m", tp } } }, undefined, { NODE_NAME: "n" })
    if (Result.isFailure(r)) throw new Error(r.failure.message)
    const { argv, cpuCache } = engineFor(r.success.engine.kind).render(r.success)
    if (cpuCache === undefined) throw new Error("no CPU tier rendered")
    return { argv, cpuCache }
  }

  it.effect("LMCache: the size in the file LMCACHE_CONFIG_FILE names, once per GPU worker, against the limit", () =>
    Effect.gen(function* () {
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-lmcache-"))
      yield* Effect.addFinalizer(() => Effect.sync(() => fs.rmSync(dir, { recursive: true, force: true })))
      const file = path.join(dir, "lmcache.yaml")
      fs.writeFileSync(file, "chunk_size: 256\nlocal_cpu: true\nmax_local_cpu_size: 3.0  # GiB\n")
      const plan = (tp: number) => ({
        env: { LMCACHE_CONFIG_FILE: file },
        cpuCache: tierOf({ kv_offload: "lmcache" }, tp).cpuCache
      })
      // 3 GiB per worker: 6 GiB with tp 2 is below the 8 GiB limit, 12 GiB with tp 4 is not
      assert.deepStrictEqual(yield* startLogs(plan(2)), [])
      assert.deepStrictEqual(yield* startLogs(plan(4)), [
        `the engine's CPU KV-cache tier (max_local_cpu_size: 3.0 in ${file} (LMCACHE_CONFIG_FILE) per GPU worker x 4 ` +
          "(tp 4): 12.0 GiB) is at or above the memory limit of the agent's cgroup (8.0 GiB), which the engine shares: " +
          "the kernel's OOM killer would end the engine as the tier fills. Raise the container's memory limit or lower " +
          "the tier (LMCACHE_MAX_LOCAL_CPU_SIZE (GiB per GPU worker) in [engine].env, which wins over the " +
          "max_local_cpu_size of a LMCACHE_CONFIG_FILE)"
      ])
    })
  )

  it.effect(
    "SGLang HiCache: --hicache-size counted per GPU worker; only a ratio: said to be unchecked, no warning",
    () =>
      Effect.gen(function* () {
        const sized = tierOf({ kind: "sglang", kv_offload: "hicache", args: ["--hicache-size", "5"] }, 2)
        const [warning] = yield* startLogs({ argv: sized.argv, cpuCache: sized.cpuCache })
        assert.include(warning, "(--hicache-size 5 per GPU worker x 2 (tp 2): 9.3 GiB) is at or above")
        const ratio = tierOf({ kind: "sglang", kv_offload: "hicache" }, 2)
        assert.deepStrictEqual(yield* startLogs({ argv: ratio.argv, cpuCache: ratio.cpuCache }), [])
        assert.deepStrictEqual(yield* startLogs({ argv: ratio.argv, cpuCache: ratio.cpuCache }, "Info"), [
          "the engine's CPU KV-cache tier is not checked against the memory limit: SGLang sizes its host pool as " +
            "--hicache-ratio times its GPU KV pool, known only once it has started (--hicache-size N in engine.args " +
            "sizes it in GB per GPU worker instead)"
        ])
      })
  )
})
