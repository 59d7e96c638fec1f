// vLLM data parallelism in the simulator, as vLLM runs it: the API server routes each request from the
// load the DP coordinator last published (every 100 ms) plus its own increments since
// (vllm/v1/engine/core_client.py, DPLBAsyncMPClient.get_core_engine_for_request), and every DP rank is an
// engine core with its own prefix cache and its own KV-event publisher on port + rank with its own seq
// (vllm/distributed/kv_events.py, ZmqEventPublisher). Routing is checked on Engines with a hand-driven
// clock; the caches and streams on a simulator process, read back through each rank's replay ROUTER.
import { decode } from "@msgpack/msgpack"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as zmq from "zeromq"
import { Engines, type Rank } from "../../src/sim/ranks.ts"
import { freePortRange } from "../support/ports.ts"
import { getJson, pollUntil, postJson, type SimHandle, startSim } from "../support/sim.ts"

const engines = (dataParallel: number, clock: { t: number }, o: { maxSeqs?: number; sharedSeed?: boolean } = {}) =>
  new Engines({
    dataParallel,
    maxSeqs: o.maxSeqs ?? 8,
    blockSize: 4,
    kvBlocks: 64,
    seed: 42n,
    sharedSeed: o.sharedSeed ?? false,
    now: () => clock.t
  })

/** Routes one request and runs it to the end at once (it is gone before the next one is routed). */
const quick = (e: Engines): number => {
  const r = e.pick()
  r.scheduler.enter().release()
  return r.index
}

/** Routes one request that stays running. */
const hold = (e: Engines): Rank => {
  const r = e.pick()
  r.scheduler.enter()
  return r
}

describe("vLLM DP routing (DPLBAsyncMPClient.get_core_engine_for_request)", () => {
  it("requests one after another within a coordinator period alternate ranks, though each ends before the next", () => {
    const clock = { t: 1_000 }
    const e = engines(2, clock)
    // Live queues are empty at every pick; the published counts plus the client's own increments are not.
    expect([quick(e), quick(e), quick(e), quick(e)]).toEqual([0, 1, 0, 1])
    const three = engines(3, clock)
    expect(Array.from({ length: 6 }, () => quick(three))).toEqual([0, 1, 2, 0, 1, 2])
  })

  it("a rank counts as loaded as last published until the next publication, ~100 ms later", () => {
    const clock = { t: 1_000 }
    const e = engines(2, clock)
    const r0 = e.ranks[0] as Rank
    const tickets = [0, 1, 2].map(() => r0.scheduler.enter())
    clock.t += 100
    expect(quick(e)).toBe(1) // published: rank 0 runs 3
    for (const t of tickets) t.release()
    // Rank 0 is idle now, but the coordinator has not said so yet: 3 there against rank 1's own increments.
    expect([quick(e), quick(e), quick(e)]).toEqual([1, 1, 1])
    clock.t += 100
    expect(quick(e)).toBe(0)
  })

  it("a busy rank is avoided: the lower of max(in flight, waiting + running), ties to the rotating start", () => {
    const clock = { t: 1_000 }
    const e = engines(2, clock)
    const busy = hold(e) // rank 0
    hold(e) // rank 1
    hold(e) // rank 0 (tie at 1, start back at 0)
    expect([busy.scheduler.running, (e.ranks[1] as Rank).scheduler.running]).toEqual([2, 1])
    clock.t += 100
    // Published 2 vs 1, and the in-flight floor agrees: rank 1 until it has as many.
    expect(hold(e).index).toBe(1)
    expect(hold(e).index).toBe(0) // 2 vs 2: the start index (rotated to 0) breaks the tie
    expect(hold(e).index).toBe(1)
  })

  it("queued requests on a rank whose KV cache is over half full weigh more (waiting * 6 * (usage - 0.5))", () => {
    const clock = { t: 1_000 }
    const e = engines(2, clock, { maxSeqs: 1 })
    const [r0, r1] = e.ranks as [Rank, Rank]
    // Each rank: one running, one waiting; rank 0's cache 90 % used, rank 1's 10 %.
    for (const r of [r0, r1]) {
      r.scheduler.enter()
      r.scheduler.enter()
    }
    r0.decodeBlocks = Math.round(0.9 * r0.kv.capacity)
    r1.decodeBlocks = Math.round(0.1 * r1.kv.capacity)
    // Scan from rank 0: 2 + 1 * 6 * 0.4 = 4.4 against 2 at rank 1.
    expect(e.pick().index).toBe(1)
  })

  it("one engine core: no balancing at all", () => {
    const clock = { t: 0 }
    const e = engines(1, clock)
    expect([quick(e), quick(e)]).toEqual([0, 0])
  })

  it("ranks hash from one seed only under PYTHONHASHSEED (NONE_HASH is drawn per engine-core process)", () => {
    const tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    const own = engines(2, { t: 0 }).ranks.map((r) => r.kv.hashesOf(tokens))
    expect(own[0]).not.toEqual(own[1])
    const shared = engines(2, { t: 0 }, { sharedSeed: true }).ranks.map((r) => r.kv.hashesOf(tokens))
    expect(shared[0]).toEqual(shared[1])
    // Rank 0 keeps the single engine's seed.
    expect(own[0]).toEqual(engines(1, { t: 0 }).ranks[0]?.kv.hashesOf(tokens))
  })
})

type Batch = [number, Array<Record<string, unknown>>, number]
const END = 0xffffffffffffffffn

/** Every batch a rank's replay ROUTER holds, as [seq, batch] (vLLM >= 0.26: 4 frames with the topic). */
const replay = async (endpoint: string): Promise<Array<[number, Batch]>> => {
  const dealer = new zmq.Dealer({ linger: 0, receiveTimeout: 5_000 })
  dealer.connect(endpoint)
  await dealer.send([Buffer.alloc(0), Buffer.alloc(8)])
  const out: Array<[number, Batch]> = []
  try {
    for (;;) {
      const [, , seqF, payload] = (await dealer.receive()) as [Buffer, Buffer, Buffer, Buffer]
      const seq = seqF.readBigUInt64BE()
      if (seq === END) return out
      out.push([Number(seq), decode(payload, { useBigInt64: true }) as Batch])
    }
  } finally {
    dealer.close()
  }
}

describe("vLLM DP ranks: each its own prefix cache and KV-event stream", () => {
  let sim: SimHandle
  let port: number
  const P = "p1 p2 p3 p4 p5 p6 p7 p8"
  const Q = "q1 q2 q3 q4 q5 q6 q7 q8"

  beforeAll(async () => {
    port = await freePortRange(4) // events on port, port + 1; replay on port + 2, port + 3
    const cfg = {
      enable_kv_cache_events: true,
      publisher: "zmq",
      endpoint: `tcp://*:${port}`,
      replay_endpoint: `tcp://*:${port + 2}`,
      topic: "kv"
    }
    sim = await startSim({
      args: ["serve", "m", "--data-parallel-size", "2", "--kv-events-config", JSON.stringify(cfg)].concat([
        "--sim-block-size",
        "4"
      ]),
      // One NONE_HASH for both ranks, so equal prompts hash alike on each: what they share is hashes, not blocks.
      env: { PYTHONHASHSEED: "0" }
    })
  })
  afterAll(async () => {
    await sim?.stop()
  })

  it("a request's blocks are stored and published by the rank that served it; a prefix hits only where it is", async () => {
    // One after another, so the ranks alternate: P -> 0, Q -> 1, Q -> 0 (a miss there), P -> 1 (a miss), P -> 0 (a hit).
    for (const prompt of [P, Q, Q, P, P]) {
      const r = await postJson(`${sim.url}/v1/completions`, { prompt, max_tokens: 1 })
      expect(r.status).toBe(200)
    }
    type Ranks = Array<{ kvCachedBlocks: number; kvEventsSeq: number }>
    const state = await pollUntil(async () => {
      const s = (await getJson(`${sim.url}/sim/state`)).json as { served: number; kvCachedBlocks: number; ranks: Ranks }
      return s.served === 5 && s.ranks.every((r) => r.kvEventsSeq === 1) ? s : undefined
    })
    expect(state.ranks.map((r) => r.kvCachedBlocks)).toEqual([4, 4])
    expect(state.kvCachedBlocks).toBe(8)

    const metrics = await (await fetch(`${sim.url}/metrics`)).text()
    const sample = (name: string, engine: number) =>
      Number(new RegExp(`^${name}\\{engine="${engine}",model_name="m"\\} (\\S+)$`, "m").exec(metrics)?.[1])
    expect([0, 1].map((e) => sample("vllm:prompt_tokens_total", e))).toEqual([24, 16])
    expect([0, 1].map((e) => sample("vllm:prefix_cache_hits_total", e))).toEqual([8, 0])

    const streams = await Promise.all([0, 1].map((r) => replay(`tcp://127.0.0.1:${port + 2 + r}`)))
    const stored = (b: Batch) => b[1].filter((ev) => ev.type === "BlockStored").map((ev) => ev.block_hashes)
    for (const [rank, stream] of streams.entries()) {
      // Its own seq from 0 (its first request's blocks: vLLM publishes nothing at start), gapless; every batch
      // stamped with the rank.
      expect(stream.map(([seq]) => seq)).toEqual([0, 1])
      expect(stream.every(([, b]) => b[2] === rank)).toBe(true)
    }
    const [s0, s1] = streams.map((s) => s.map(([, b]) => stored(b)[0])) as [Array<unknown>, Array<unknown>]
    // Rank 0 stored P then Q; rank 1 Q then P: the same hashes, each stored on each rank by itself.
    expect(s0).toHaveLength(2)
    expect(s1).toEqual([s0[1], s0[0]])
    expect(s0[0]).not.toEqual(s0[1])
  })
})
