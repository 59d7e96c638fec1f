// The agent against the simulator's SGLang `--dp-size 2`, started from the command line the agent renders: the
// engine metric reader (PromText.loadSignals) counts every replica's dp_rank series (counts summed, usage
// averaged), and the KV bridge subscribes to each replica's publisher (port + dp_rank), fills each join from
// that replica's replay ROUTER (3-frame replies) and forwards its batches under its own dp_rank and seq, the
// same prompt's blocks once per replica that cached them.
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { Context, Effect, Exit, Layer, Result, Scope } from "effect"
import { afterEach, describe, expect, it } from "vitest"
import * as ConfigLive from "../../src/layers/config/Config.ts"
import { decodeConfigObject } from "../../src/layers/config/Config.ts"
import { engineFor } from "../../src/layers/engine/backends/index.ts"
import { planLayer } from "../../src/layers/engine/EnginePlan.ts"
import * as KvBridgeLive from "../../src/layers/kv/KvBridge.ts"
import * as ReceiverLive from "../../src/layers/kv/kvcachedReceiver.ts"
import { EnginePlan } from "../../src/services/engine/Engine.ts"
import { loadSignals } from "../../src/services/engine/PromText.ts"
import { KvBridge } from "../../src/services/kv/KvBridge.ts"
import * as EngineProcessLayer from "../../src/testing/EngineProcess.ts"
import * as MetricsTest from "../../src/testing/Metrics.ts"
import { freePort, freePortRange } from "../support/ports.ts"
import { getJson, pollUntil, postJson, type SimHandle, startSim } from "../support/sim.ts"

type Line = Record<string, unknown>
const cleanups: Array<() => Promise<unknown>> = []
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => undefined)
})

/** The simulator run with the plan's own argv (it strips the launcher words), once loaded. */
const simFromPlan = async (argv: ReadonlyArray<string>): Promise<SimHandle> => {
  const sim = await startSim({ args: [...argv] })
  cleanups.push(() => sim.stop())
  await sim.waitForLine((l) => l.includes('"model loaded"'))
  return sim
}

describe("the agent's engine metrics with SGLang --dp-size", () => {
  it("running and waiting are summed over the replicas' dp_rank series, KV usage averaged", async () => {
    const port = await freePort()
    const args = ["--max-running-requests", "1", "--sim-stall-after-tokens", "1"]
    const decoded = decodeConfigObject(
      { engine: { kind: "sglang", url: `http://127.0.0.1:${port}` }, models: { m: { hf_repo: "org/m", dp: 2, args } } },
      undefined
    )
    if (Result.isFailure(decoded)) throw new Error(decoded.failure.message)
    const plan = engineFor("sglang").render(decoded.success)
    const sim = await simFromPlan(plan.argv)
    const held: Array<AbortController> = []
    cleanups.push(async () => {
      for (const a of held) a.abort()
    })
    const hold = async (prompt: string) => {
      const ac = new AbortController()
      held.push(ac)
      const body = JSON.stringify({ prompt, max_tokens: 5, stream: true })
      const init = { method: "POST", headers: { "content-type": "application/json" }, body, signal: ac.signal }
      expect((await fetch(`${sim.url}/v1/completions`, init)).status).toBe(200)
    }
    await hold("a b") // replica 0
    await hold("c d") // replica 1 (round robin), its own slot
    void postJson(`${sim.url}/v1/completions`, { prompt: "e f", max_tokens: 1 }).catch(() => undefined) // queues on 0
    await pollUntil(async () => {
      const s = (await getJson(`${sim.url}/sim/state`)).json as { ranks: Array<{ running: number; waiting: number }> }
      return JSON.stringify(s.ranks.map((r) => [r.running, r.waiting])) === "[[1,1],[1,0]]" || undefined
    })
    const text = await (await fetch(plan.metrics?.url ?? "")).text()
    expect(text).toMatch(/^sglang:num_running_reqs\{dp_rank="1",/m)
    const signals = loadSignals(text, plan.metrics?.names ?? { running: [], waiting: [], kvUsage: [] })
    expect(signals).toMatchObject({ running: 2, waiting: 1 })
    const usage = [...text.matchAll(/^sglang:token_usage\{[^}]*\} (\S+)$/gm)].map((m) => Number(m[1]))
    expect(usage).toHaveLength(2)
    expect(signals.kvUsage).toBeCloseTo((usage[0]! + usage[1]!) / 2)
  })
})

const kvcached = async (sockPath: string) => {
  const lines: Array<Line> = []
  const scope = await Effect.runPromise(Scope.make())
  const sink = {
    onHello: (h: object) => void lines.push({ type: "Hello", ...h }),
    onRecord: (_node: string, _epoch: string, r: object) => void lines.push({ ...r })
  }
  await Effect.runPromise(Layer.buildWithScope(ReceiverLive.layer({ path: sockPath, sink }), scope))
  cleanups.push(() => Effect.runPromise(Scope.close(scope, Exit.void)))
  return { lines, batches: () => lines.filter((l) => l.type === "Batch") }
}

/** The bridge as the daemon builds it from a config object, and the engine plan it shares. */
const bridgeFromConfig = async (raw: Record<string, unknown>) => {
  const scope = await Effect.runPromise(Scope.make())
  cleanups.push(() => Effect.runPromise(Scope.close(scope, Exit.void)))
  const layer = KvBridgeLive.layer.pipe(
    Layer.provideMerge(planLayer),
    Layer.provideMerge(ConfigLive.layerFromObject(raw)),
    Layer.provideMerge(MetricsTest.layerTest),
    Layer.provideMerge(EngineProcessLayer.layerTest())
  )
  const ctx = await Effect.runPromise(Layer.buildWithScope(layer, scope))
  return { plan: Context.get(ctx, EnginePlan), status: () => Effect.runPromise(Context.get(ctx, KvBridge).status) }
}

describe("the agent's KV bridge with SGLang --dp-size", () => {
  it("reads each replica's publisher on port + dp_rank: its own seq from 0, its own dp_rank, no gap", async () => {
    const [port, enginePort] = [await freePortRange(4), await freePort()]
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), "sgldp-"))
    cleanups.push(() => fs.rm(dir, { recursive: true, force: true }))
    const sock = path.join(dir, "kvcached.sock")
    const kc = await kvcached(sock)
    const { plan, status } = await bridgeFromConfig({
      engine: { kind: "sglang", url: `http://127.0.0.1:${enginePort}` },
      models: { m: { hf_repo: "org/m", dp: 2 } },
      kv: {
        events: true,
        uds: sock,
        events_endpoint: `tcp://*:${port}`,
        replay_endpoint: `tcp://*:${port + 2}`,
        block_size: 2
      }
    })
    expect(plan.kvEvents).toMatchObject({ dpSize: 2, engineBinds: true })
    const sim = await simFromPlan(plan.argv)
    let n = 0
    // Round robin: requests one after another alternate replicas, each storing its prompt in its own cache.
    await pollUntil(async () => {
      if ([0, 1].every((r) => kc.batches().some((b) => b.dp_rank === r && (b.seq as number) >= 2))) return true
      await postJson(`${sim.url}/v1/completions`, { prompt: `w${++n} x${n} y${n} z${n}`, max_tokens: 1 })
      return undefined
    })
    expect(kc.lines[0]).toMatchObject({ type: "Hello", dp_size: 2 })
    for (const r of [0, 1]) {
      const mine = kc.batches().filter((b) => b.dp_rank === r)
      expect(mine.slice(0, 3).map((b) => b.seq)).toEqual([0, 1, 2])
      expect(mine[0]?.events).toEqual([{ type: "AllBlocksCleared" }])
      expect(((mine[1]?.events ?? []) as Array<Line>).map((e) => e.type)).toContain("BlockStored")
    }
    // One prompt twice: one replica after the other, each a miss in its own cache, so each forwards the blocks.
    for (let i = 0; i < 2; i++) await postJson(`${sim.url}/v1/completions`, { prompt: "q1 q2 q3 q4", max_tokens: 1 })
    const storedBy = (r: number) =>
      kc
        .batches()
        .filter((b) => b.dp_rank === r)
        .flatMap((b) => b.events as Array<Line>)
        .filter((e) => e.type === "BlockStored")
        .flatMap((e) => e.block_hashes as Array<string>)
    const both = await pollUntil(async () => {
      const one = new Set(storedBy(1))
      const shared = storedBy(0).filter((h) => one.has(h))
      return shared.length >= 2 ? shared : undefined
    })
    expect(both).toHaveLength(2)
    expect(kc.lines.some((l) => l.type === "Resync")).toBe(false)
    expect(await status()).toMatchObject({ subscribed: true, gaps: 0, resyncs: 0 })
  })
})
