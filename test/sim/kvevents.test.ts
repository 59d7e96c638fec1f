// KV-cache events read back by an independent ZMQ subscriber / replay DEALER: 3-frame messages, 8-byte BE
// sequence numbers, msgpack [ts, events, dp_rank] with exact uint64 block hashes, chaining, eviction,
// replay with its end marker (4 frames with the topic for vLLM >= 0.26, 3 for older vLLM and SGLang),
// legacy tagged arrays, SGLang's tagged arrays with signed hashes and salted metadata in slot 7, SGLang
// binding 0.0.0.0, one publisher per data-parallel rank, and the kv fault switches.
import { decode } from "@msgpack/msgpack"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as zmq from "zeromq"
import { freePort, freePortRange } from "../support/ports.ts"
import { postJson, type SimHandle, startSim } from "../support/sim.ts"

type Batch = [number, Array<unknown>, number]
const dec = (b: Buffer) => decode(b, { useBigInt64: true }) as Batch
const END = 0xffffffffffffffffn

/**
 * All batches from `from` via the replay ROUTER, as [seq, batch]. `topic`: the 4-frame layout of vLLM >= 0.26
 * (["", topic, seq, payload], end ["", "", END, ""]); undefined: the 3-frame one (["", seq, payload]).
 */
const replay = async (endpoint: string, from = 0n, topic?: string): Promise<Array<[bigint, Batch]>> => {
  const dealer = new zmq.Dealer({ linger: 0, receiveTimeout: 5_000 })
  dealer.connect(endpoint)
  const seq = Buffer.alloc(8)
  seq.writeBigUInt64BE(from)
  await dealer.send([Buffer.alloc(0), seq])
  const out: Array<[bigint, Batch]> = []
  try {
    for (;;) {
      const frames = await dealer.receive()
      expect(frames).toHaveLength(topic === undefined ? 3 : 4)
      expect(frames[0]?.length).toBe(0)
      const [seqF, payload] = frames.slice(-2) as [Buffer, Buffer]
      const s = seqF.readBigUInt64BE()
      if (topic !== undefined) expect(frames[1]?.toString()).toBe(s === END ? "" : topic)
      if (s === END) {
        expect(payload.length).toBe(0)
        return out
      }
      out.push([s, dec(payload)])
    }
  } finally {
    dealer.close()
  }
}

describe("vLLM KV events (connect mode, map events)", () => {
  let sim: SimHandle
  let sub: zmq.Subscriber
  let replayEndpoint: string

  beforeAll(async () => {
    const [pubPort, replayPort] = [await freePort(), await freePort()]
    sub = new zmq.Subscriber({ linger: 0, receiveTimeout: 300 })
    await sub.bind(`tcp://127.0.0.1:${pubPort}`)
    sub.subscribe("kv-events")
    replayEndpoint = `tcp://127.0.0.1:${replayPort}`
    const cfg = {
      enable_kv_cache_events: true,
      publisher: "zmq",
      endpoint: `tcp://127.0.0.1:${pubPort}`,
      replay_endpoint: `tcp://*:${replayPort}`,
      topic: "kv-events"
    }
    sim = await startSim({
      args: [
        "serve",
        "m",
        "--kv-events-config",
        JSON.stringify(cfg),
        "--sim-block-size",
        "4",
        "--sim-kv-blocks",
        "6",
        "--sim-seed",
        "11"
      ]
    })
  })
  afterAll(async () => {
    sub?.close()
    await sim?.stop()
  })

  const complete = (prompt: string) => postJson(`${sim.url}/v1/completions`, { prompt, max_tokens: 1 })

  it("publishes BlockStored with chained uint64 hashes; seq increments", async () => {
    // The subscription may still be travelling to the publisher: retry (bounded) until frames arrive.
    let frames: Array<Buffer> | undefined
    for (let i = 0; i < 40 && frames === undefined; i++) {
      await complete(`w${i} a b c d e f g`)
      try {
        frames = (await sub.receive()) as Array<Buffer>
      } catch {
        frames = undefined
      }
    }
    expect(frames).toHaveLength(3)
    expect(frames?.[0]?.toString()).toBe("kv-events")
    expect(frames?.[1]?.length).toBe(8)
    const seq0 = frames?.[1]?.readBigUInt64BE() ?? 0n
    const [ts, events, rank] = dec(frames?.[2] as Buffer)
    expect(typeof ts).toBe("number")
    expect(rank).toBe(0)
    const stored = events[0] as Record<string, unknown>
    expect(stored).toMatchObject({
      type: "BlockStored",
      block_size: 4,
      medium: "GPU",
      lora_id: null,
      parent_block_hash: null
    })
    expect((stored.block_hashes as Array<unknown>).every((h) => typeof h === "bigint")).toBe(true)
    expect(stored.token_ids).toHaveLength(8)

    // A longer prompt with the same prefix stores one more block whose parent is the previous last hash.
    await complete("p1 p2 p3 p4 p5 p6 p7 p8")
    const first = (await sub.receive()) as Array<Buffer>
    await complete("p1 p2 p3 p4 p5 p6 p7 p8 p9 p10 p11 p12")
    const second = (await sub.receive()) as Array<Buffer>
    const a = dec(first[2] as Buffer)[1][0] as { block_hashes: Array<bigint> }
    const b = dec(second[2] as Buffer)[1][0] as { block_hashes: Array<bigint>; parent_block_hash: bigint }
    expect(b.block_hashes).toHaveLength(1)
    expect(b.parent_block_hash).toBe(a.block_hashes[1])
    const s1 = first[1]?.readBigUInt64BE() ?? 0n
    const s2 = second[1]?.readBigUInt64BE() ?? 0n
    expect(s1).toBeGreaterThan(seq0)
    expect(s2).toBe(s1 + 1n)
  })

  it("stores the block generated tokens fill once they are computed, chained after the prompt's, in a batch of its own", async () => {
    // drain what earlier requests published
    for (;;) {
      try {
        await sub.receive()
      } catch {
        break
      }
    }
    // 9 prompt tokens and 5 generated at block size 4: 14 tokens, 13 computed, three full blocks
    const r = await postJson(`${sim.url}/v1/completions`, {
      prompt: "g1 g2 g3 g4 g5 g6 g7 g8 g9",
      max_tokens: 5,
      ignore_eos: true
    })
    expect(r.status).toBe(200)
    const stored: Array<{ block_hashes: Array<bigint>; parent_block_hash: bigint | null; token_ids: Array<number> }> =
      []
    for (;;) {
      try {
        const frames = (await sub.receive()) as Array<Buffer>
        for (const e of dec(frames[2] as Buffer)[1] as Array<Record<string, unknown>>)
          if (e.type === "BlockStored") stored.push(e as (typeof stored)[number])
      } catch {
        break
      }
    }
    expect(stored.map((e) => e.block_hashes.length)).toEqual([2, 1])
    expect(stored[1]?.parent_block_hash).toBe(stored[0]?.block_hashes[1])
    expect(stored[1]?.token_ids).toHaveLength(4)
  })

  it("evicts past capacity with BlockRemoved, and hashes above 2^63 occur", async () => {
    for (let i = 0; i < 4; i++) await complete(`e${i}a e${i}b e${i}c e${i}d e${i}e e${i}f e${i}g e${i}h`)
    const batches = await replay(replayEndpoint, 0n, "kv-events")
    const events = batches.flatMap(([, b]) => b[1] as Array<Record<string, unknown>>)
    expect(events.some((e) => e.type === "BlockRemoved" && (e.block_hashes as Array<unknown>).length > 0)).toBe(true)
    const hashes = events.flatMap((e) => (e.type === "BlockStored" ? (e.block_hashes as Array<bigint>) : []))
    expect(hashes.some((h) => h >= 1n << 63n)).toBe(true)
    expect(hashes.every((h) => h >= 0n && h < 1n << 64n)).toBe(true)
  })

  it("replays from seq 0, the first request's blocks (nothing at start), and the end marker, topic in every reply (vLLM >= 0.26)", async () => {
    const batches = await replay(replayEndpoint, 0n, "kv-events")
    expect(batches[0]?.[0]).toBe(0n)
    expect(batches[0]?.[1][1]).toEqual([expect.objectContaining({ type: "BlockStored" })])
    expect(batches.map(([s]) => s)).toEqual(batches.map((_, i) => BigInt(i)))
    const tail = await replay(replayEndpoint, 2n, "kv-events")
    expect(tail[0]?.[0]).toBe(2n)
    expect(tail).toHaveLength(batches.length - 2)
  })
})

describe("legacy arrays, bind mode and the kv fault switches", () => {
  let sim: SimHandle
  let replayEndpoint: string
  beforeAll(async () => {
    const [pubPort, replayPort] = [await freePort(), await freePort()]
    replayEndpoint = `tcp://127.0.0.1:${replayPort}`
    const cfg = {
      enable_kv_cache_events: true,
      endpoint: `tcp://*:${pubPort}`,
      replay_endpoint: `tcp://*:${replayPort}`
    }
    sim = await startSim({
      args: [
        "serve",
        "m",
        "--kv-events-config",
        JSON.stringify(cfg),
        "--sim-block-size",
        "2",
        "--sim-kv-legacy-arrays",
        "--sim-kv-replay-3-frames"
      ].concat(["--sim-kv-skip-seq", "1", "--sim-kv-stop-after", "3"])
    })
  })
  afterAll(() => sim?.stop())

  it("sends tagged arrays, replays in 3 frames (vLLM < 0.26), skips seq 1 and stops after 3 batches", async () => {
    for (let i = 0; i < 5; i++) await postJson(`${sim.url}/v1/completions`, { prompt: `x${i} y${i}`, max_tokens: 1 })
    const batches = await replay(replayEndpoint)
    expect(batches.map(([s]) => s)).toEqual([0n, 2n, 3n])
    const ev = batches[1]?.[1][1][0] as Array<unknown>
    expect(ev[0]).toBe("BlockStored")
    expect(ev[4]).toBe(2)
    expect(ev[6]).toBe("GPU")
  })
})

describe("SGLang KV events", () => {
  it("needs publisher zmq; sends tagged arrays, signed int64 hashes, salt metadata in slot 7; 3-frame replay", async () => {
    const replayPort = await freePort()
    const cfg = { publisher: "zmq", endpoint: `tcp://*:${await freePort()}`, replay_endpoint: `tcp://*:${replayPort}` }
    const sim = await startSim({
      args: ["--model-path", "m", "--page-size", "2", "--kv-events-config", JSON.stringify(cfg), "--sim-seed", "3"]
    })
    try {
      await sim.waitForLine((l) => l.includes('"model loaded"'))
      for (let i = 0; i < 6; i++)
        await postJson(`${sim.url}/v1/completions`, { prompt: `q${i} r${i} s${i} t${i}`, max_tokens: 1 })
      await postJson(`${sim.url}/v1/completions`, { prompt: "q0 r0 s0 t0", max_tokens: 1, cache_salt: "tenant-a" })
      const batches = await replay(`tcp://127.0.0.1:${replayPort}`)
      expect(batches[0]?.[1]).toEqual([expect.any(Number), [["AllBlocksCleared"]], 0])
      const events = batches.flatMap(([, b]) => b[1] as Array<Array<unknown>>)
      expect(events.every((e) => Array.isArray(e) && typeof e[0] === "string")).toBe(true)
      const stored = events.filter((e) => e[0] === "BlockStored")
      // [tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium(, metadata)]
      const plain = stored.filter((e) => e.length === 7)
      expect(plain.length).toBeGreaterThan(0)
      expect(plain[0]?.slice(4)).toEqual([2, null, "GPU"])
      const hashes = stored.flatMap((e) => e[1] as Array<bigint | number>)
      expect(hashes.some((h) => BigInt(h) < 0n)).toBe(true)
      expect(hashes.every((h) => BigInt(h) >= -(1n << 63n) && BigInt(h) < 1n << 63n)).toBe(true)
      const salted = stored.filter((e) => e.length === 8)
      expect(salted).toHaveLength(1)
      expect(salted[0]?.[7]).toEqual({ cache_salt: "tenant-a" })
      // The salt makes the same prompt's blocks new ones, with other hashes.
      const firstPlain = (plain[0]?.[1] as Array<bigint> | undefined)?.[0]
      expect(firstPlain).toBeDefined()
      expect(salted[0]?.[1]).not.toContain(firstPlain)
    } finally {
      await sim.stop()
    }
    const off = await startSim({
      args: ["--model-path", "m", "--kv-events-config", JSON.stringify({ endpoint: "tcp://*:1" })]
    })
    try {
      await off.waitForLine((l) => l.includes('"model loaded"'))
      expect(off.stderrLines.some((l) => l.includes("kv events publisher"))).toBe(false)
    } finally {
      await off.stop()
    }
  })

  it("binds tcp://0.0.0.0:P (newest SGLang), one publisher and replay ROUTER per --dp-size rank on port + rank", async () => {
    const port = await freePortRange(4)
    const replayPort = port + 2 // events on port, port + 1; replay on port + 2, port + 3
    const cfg = { publisher: "zmq", endpoint: `tcp://0.0.0.0:${port}`, replay_endpoint: `tcp://*:${replayPort}` }
    const sim = await startSim({
      args: ["--model-path", "m", "--page-size", "2", "--dp-size", "2", "--kv-events-config", JSON.stringify(cfg)]
    })
    try {
      await sim.waitForLine((l) => l.includes('"model loaded"'))
      const binds = sim.stderrLines.filter((l) => l.includes("kv events publisher"))
      expect(binds.map((l) => JSON.parse(l) as Record<string, unknown>)).toMatchObject([
        { endpoint: `tcp://0.0.0.0:${port}`, mode: "bind", dpRank: 0 },
        { endpoint: `tcp://0.0.0.0:${port + 1}`, mode: "bind", dpRank: 1 }
      ])
      for (let i = 0; i < 4; i++)
        await postJson(`${sim.url}/v1/completions`, { prompt: `d${i} e${i} f${i} g${i}`, max_tokens: 1 })
      for (const rank of [0, 1]) {
        const batches = await replay(`tcp://127.0.0.1:${replayPort + rank}`)
        expect(batches.map(([s]) => s)).toEqual(batches.map((_, i) => BigInt(i)))
        expect(batches.length).toBeGreaterThanOrEqual(3)
        expect(batches.every(([, b]) => b[2] === rank)).toBe(true)
      }
    } finally {
      await sim.stop()
    }
  })
})
