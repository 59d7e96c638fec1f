// SGLang data parallelism in the simulator, as SGLang runs `--dp-size N` without --enable-dp-attention: a
// DataParallelController dispatching by `--load-balance-method` (default auto: round robin, whatever the
// replicas' load; follow_bootstrap_room on a PD prefill server), each replica a scheduler with its own
// `--max-running-requests`, KV pool and radix cache, its own KV-event publisher on port + dp_rank, and its own
// /metrics series labelled dp_rank (sgl-project/sglang python/sglang/srt/managers/data_parallel_controller.py,
// python/sglang/srt/disaggregation/kv_events.py, python/sglang/srt/observability/scheduler_metrics_mixin.py).
import { decode } from "@msgpack/msgpack"
import { afterEach, describe, expect, it } from "vitest"
import * as zmq from "zeromq"
import { parseArgs } from "../../src/sim/args.ts"
import { resolveLoadBalanceMethod, SglangDpController } from "../../src/sim/dpController.ts"
import { Engines } from "../../src/sim/ranks.ts"
import { freePortRange } from "../support/ports.ts"
import { getJson, pollUntil, postJson, type SimHandle, startSim } from "../support/sim.ts"

const CHOICES = "'auto', 'round_robin', 'follow_bootstrap_room', 'total_requests', 'total_tokens'"

describe("--load-balance-method (python/sglang/srt/server_args.py)", () => {
  it("defaults to auto: round robin, and follow_bootstrap_room on a prefill server (a legacy round_robin too)", () => {
    expect(resolveLoadBalanceMethod(undefined, undefined)).toBe("round_robin")
    expect(resolveLoadBalanceMethod(undefined, "decode")).toBe("round_robin")
    expect(resolveLoadBalanceMethod(undefined, "prefill")).toBe("follow_bootstrap_room")
    expect(resolveLoadBalanceMethod("round_robin", "prefill")).toBe("follow_bootstrap_room")
    expect(resolveLoadBalanceMethod("total_tokens", undefined)).toBe("total_tokens")
    const cfg = parseArgs(["--model-path", "m", "--dp-size", "2", "--load-balance-method", "round_robin"])
    expect(cfg).toMatchObject({ dataParallel: 2, loadBalanceMethod: "round_robin", unmodelled: [] })
  })

  it("refuses a value outside argparse's choices, with argparse's message, exit 2", async () => {
    // shortest_queue and minimum_tokens were choices of older releases.
    expect(() => parseArgs(["--model-path", "m", "--load-balance-method", "shortest_queue"])).toThrow(
      `argument --load-balance-method: invalid choice: 'shortest_queue' (choose from ${CHOICES})`
    )
    await expect(
      startSim({ args: ["--model-path", "m", "--dp-size", "2", "--load-balance-method", "minimum_tokens"] })
    ).rejects.toThrow(/exited \(2\) before listening[\s\S]*invalid choice: 'minimum_tokens'/)
  })

  it("round robin ignores load; follow_bootstrap_room is the room modulo the replicas", () => {
    const engines = (method: "round_robin" | "follow_bootstrap_room") =>
      new Engines({
        dataParallel: 3,
        maxSeqs: 1,
        blockSize: 2,
        kvBlocks: 8,
        seed: 1n,
        sharedSeed: true,
        balancer: new SglangDpController(method)
      })
    const rr = engines("round_robin")
    // Replica 1 is full with two queued; each routed request runs and ends at once. A load-aware choice would
    // keep away from replica 1; the controller's counter does not look.
    for (let i = 0; i < 3; i++) rr.ranks[1]?.scheduler.enter()
    const picks = Array.from({ length: 5 }, () => {
      const r = rr.pick()
      r.scheduler.enter().release()
      return r.index
    })
    expect(picks).toEqual([0, 1, 2, 0, 1])
    expect(rr.ranks.map((r) => [r.scheduler.running, r.scheduler.waiting])).toEqual([
      [0, 0],
      [1, 2],
      [0, 0]
    ])
    const room = engines("follow_bootstrap_room")
    const rooms = ["9223372036854775807", "4", "4", "0"]
    expect(rooms.map((bootstrapRoom) => room.pick({ bootstrapRoom }).index)).toEqual([1, 1, 1, 0])
  })
})

/** Prometheus sample `name{labels}` of a page, or undefined. */
const sample = (text: string, name: string, labels: Record<string, string>): number | undefined => {
  const l = Object.keys(labels)
    .sort()
    .map((k) => `${k}="${labels[k]}"`)
    .join(",")
  const line = text.split("\n").find((x) => x.startsWith(`${name}{${l}} `))
  return line === undefined ? undefined : Number(line.slice(line.lastIndexOf(" ") + 1))
}
/** Replica `r`'s scheduler series labels (tp_rank 0 of its TP group reports). */
const scheduler = (r: number, extra: Record<string, string> = {}) => ({
  dp_rank: String(r),
  engine_type: "unified",
  model_name: "m",
  moe_ep_rank: "0",
  pp_rank: "0",
  tp_rank: "0",
  ...extra
})

type Ranks = Array<{ running: number; waiting: number; kvCachedBlocks: number; kvEventsSeq: number | null }>
const state = async (sim: SimHandle) =>
  (await getJson(`${sim.url}/sim/state`)).json as { served: number; running: number; ranks: Ranks }

const sims: Array<SimHandle> = []
afterEach(async () => {
  for (const s of sims.splice(0)) await s.stop()
})
const start = async (args: Array<string>) => {
  const sim = await startSim({ args: ["--model-path", "m", "--enable-metrics", ...args] })
  sims.push(sim)
  await pollUntil(async () => ((await state(sim)) as unknown as { ready: boolean }).ready || undefined)
  return sim
}

/** A streaming completion that stalls after its first token (--sim-stall-after-tokens 1) until `abort`. */
const hold = async (sim: SimHandle, prompt: string) => {
  const ac = new AbortController()
  const res = await fetch(`${sim.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt, max_tokens: 5, stream: true }),
    signal: ac.signal
  })
  expect(res.status).toBe(200)
  return () => ac.abort()
}

describe("SGLang --dp-size replicas", () => {
  it("round robin by default, each replica its own --max-running-requests and its own dp_rank series", async () => {
    const sim = await start(["--dp-size", "2", "--max-running-requests", "1", "--sim-stall-after-tokens", "1"])
    const ranksAre = async (want: Array<[number, number]>) =>
      pollUntil(async () => {
        const s = await state(sim)
        const got = s.ranks.map((r) => [r.running, r.waiting])
        return JSON.stringify(got) === JSON.stringify(want) ? s : undefined
      })
    const abortA = await hold(sim, "a1 a2") // rank 0, runs and stays
    await ranksAre([
      [1, 0],
      [0, 0]
    ])
    // One token: done before any stall. Rank 1: its own slot, though rank 0's only one is taken.
    expect((await postJson(`${sim.url}/v1/completions`, { prompt: "b1 b2 b3", max_tokens: 1 })).status).toBe(200)
    // Round robin: back to rank 0, full, while rank 1 is idle. It queues there.
    const c = postJson(`${sim.url}/v1/completions`, { prompt: "c1 c2 c3 c4 c5", max_tokens: 1 })
    await ranksAre([
      [1, 1],
      [0, 0]
    ])
    const abortD = await hold(sim, "d1 d2 d3 d4 d5 d6 d7") // rank 1
    await ranksAre([
      [1, 1],
      [1, 0]
    ])

    const text = await (await fetch(`${sim.url}/metrics`)).text()
    expect([0, 1].map((r) => sample(text, "sglang:num_running_reqs", scheduler(r)))).toEqual([1, 1])
    expect([0, 1].map((r) => sample(text, "sglang:num_queue_reqs", scheduler(r)))).toEqual([1, 0])
    const computed = (t: string, r: number) =>
      sample(t, "sglang:realtime_tokens_total", scheduler(r, { mode: "prefill_compute" }))
    expect([computed(text, 0), computed(text, 1)]).toEqual([2, 3 + 7])
    // The tokenizer manager's counters are the server's, without a rank, and count a request as it finishes
    // (TokenizerMetricsCollector.observe_one_finished_request): B alone so far.
    expect(sample(text, "sglang:prompt_tokens_total", { engine_type: "unified", model_name: "m" })).toBe(3)

    abortA() // rank 0's slot frees: C runs there
    expect((await c).status).toBe(200)
    const after = await (await fetch(`${sim.url}/metrics`)).text()
    expect([computed(after, 0), computed(after, 1)]).toEqual([2 + 5, 3 + 7])
    expect(sample(after, "sglang:num_requests_total", { engine_type: "unified", model_name: "m" })).toBe(2)
    abortD()
  })
})

type Batch = [number, Array<Array<unknown>>, number]
const END = 0xffffffffffffffffn

/** Every batch a replica's replay ROUTER holds, as [seq, batch] (SGLang replies with 3 frames). */
const replay = async (endpoint: string): Promise<Array<[number, Batch]>> => {
  const dealer = new zmq.Dealer({ linger: 0, receiveTimeout: 5_000 })
  dealer.connect(endpoint)
  await dealer.send([Buffer.alloc(0), Buffer.alloc(8)])
  const out: Array<[number, Batch]> = []
  try {
    for (;;) {
      const [, seqF, payload] = (await dealer.receive()) as [Buffer, Buffer, Buffer]
      const seq = seqF.readBigUInt64BE()
      if (seq === END) return out
      out.push([Number(seq), decode(payload, { useBigInt64: true }) as Batch])
    }
  } finally {
    dealer.close()
  }
}

describe("SGLang --dp-size KV events", () => {
  it("each replica caches and publishes its own blocks, on port + dp_rank, stamped with its dp_rank", async () => {
    const port = await freePortRange(4) // events on port, port + 1; replay on port + 2, port + 3
    const cfg = { publisher: "zmq", endpoint: `tcp://*:${port}`, replay_endpoint: `tcp://*:${port + 2}` }
    const sim = await start(["--dp-size", "2", "--page-size", "2", "--kv-events-config", JSON.stringify(cfg)])
    const binds = sim.stderrLines.filter((l) => l.includes('"kv events publisher"'))
    expect(binds.map((l) => JSON.parse(l) as Record<string, unknown>)).toMatchObject([
      { endpoint: `tcp://*:${port}`, dpRank: 0 },
      { endpoint: `tcp://*:${port + 1}`, dpRank: 1 }
    ])
    // Round robin: rank 0, rank 1 (a miss there: its own radix cache), rank 0 (a hit).
    const P = "p1 p2 p3 p4"
    for (let i = 0; i < 3; i++)
      expect((await postJson(`${sim.url}/v1/completions`, { prompt: P, max_tokens: 1 })).status).toBe(200)
    const s = await pollUntil(async () => {
      const st = await state(sim)
      return st.served === 3 && st.ranks.every((r) => r.kvEventsSeq === 1) ? st : undefined
    })
    expect(s.ranks.map((r) => r.kvCachedBlocks)).toEqual([2, 2])

    const streams = await Promise.all([0, 1].map((r) => replay(`tcp://127.0.0.1:${port + 2 + r}`)))
    for (const [rank, stream] of streams.entries()) {
      expect(stream.map(([seq]) => seq)).toEqual([0, 1])
      expect(stream.every(([, b]) => b[2] === rank)).toBe(true)
      expect(stream[0]?.[1][1]).toEqual([["AllBlocksCleared"]])
      expect(stream[1]?.[1][1].every((e) => e[0] === "BlockStored")).toBe(true)
    }
    // SGLang's page hashes are content hashes: both replicas store the same two, each in its own cache.
    const hashes = streams.map((st) => st[1]?.[1][1].flatMap((e) => e[1] as Array<bigint>))
    expect(hashes[0]).toHaveLength(2)
    expect(hashes[1]).toEqual(hashes[0])

    const text = await (await fetch(`${sim.url}/metrics`)).text()
    const cached = (r: number) => sample(text, "sglang:realtime_tokens_total", scheduler(r, { mode: "prefill_cache" }))
    expect([cached(0), cached(1)]).toEqual([4, undefined])
    expect(sample(text, "sglang:cached_tokens_total", { engine_type: "unified", model_name: "m" })).toBe(4)
  })
})
