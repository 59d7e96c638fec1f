// KV-cache events read back by an independent ZMQ subscriber / replay DEALER: 3-frame messages, 8-byte BE
// sequence numbers, msgpack [ts, events, dp_rank] with exact uint64 block hashes, chaining, eviction,
// replay with its end marker, legacy tagged arrays, SGLang's signed hashes, and the kv fault switches.
import { decode } from "@msgpack/msgpack"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as zmq from "zeromq"
import { freePort } from "../support/ports.ts"
import { postJson, type SimHandle, startSim } from "../support/sim.ts"

type Batch = [number, Array<unknown>, number]
const dec = (b: Buffer) => decode(b, { useBigInt64: true }) as Batch
const END = 0xffffffffffffffffn

/** All batches from `from` via the replay ROUTER, as [seq, batch]. */
const replay = async (endpoint: string, from = 0n): Promise<Array<[bigint, Batch]>> => {
  const dealer = new zmq.Dealer({ linger: 0, receiveTimeout: 5_000 })
  dealer.connect(endpoint)
  const seq = Buffer.alloc(8)
  seq.writeBigUInt64BE(from)
  await dealer.send([Buffer.alloc(0), seq])
  const out: Array<[bigint, Batch]> = []
  try {
    for (;;) {
      const frames = await dealer.receive()
      expect(frames).toHaveLength(3)
      const s = (frames[1] as Buffer).readBigUInt64BE()
      if (s === END) {
        expect(frames[2]?.length).toBe(0)
        return out
      }
      out.push([s, dec(frames[2] as Buffer)])
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

  it("evicts past capacity with BlockRemoved, and hashes above 2^63 occur", async () => {
    for (let i = 0; i < 4; i++) await complete(`e${i}a e${i}b e${i}c e${i}d e${i}e e${i}f e${i}g e${i}h`)
    const batches = await replay(replayEndpoint)
    const events = batches.flatMap(([, b]) => b[1] as Array<Record<string, unknown>>)
    expect(events.some((e) => e.type === "BlockRemoved" && (e.block_hashes as Array<unknown>).length > 0)).toBe(true)
    const hashes = events.flatMap((e) => (e.type === "BlockStored" ? (e.block_hashes as Array<bigint>) : []))
    expect(hashes.some((h) => h >= 1n << 63n)).toBe(true)
    expect(hashes.every((h) => h >= 0n && h < 1n << 64n)).toBe(true)
  })

  it("replays from seq 0 with AllBlocksCleared first and the end marker", async () => {
    const batches = await replay(replayEndpoint)
    expect(batches[0]?.[0]).toBe(0n)
    expect(batches[0]?.[1][1]).toEqual([{ type: "AllBlocksCleared" }])
    expect(batches.map(([s]) => s)).toEqual(batches.map((_, i) => BigInt(i)))
    const tail = await replay(replayEndpoint, 2n)
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
        "--sim-kv-legacy-arrays"
      ].concat(["--sim-kv-skip-seq", "1", "--sim-kv-stop-after", "3"])
    })
  })
  afterAll(() => sim?.stop())

  it("sends tagged arrays, skips seq 1 and stops after 3 batches", async () => {
    for (let i = 0; i < 5; i++) await postJson(`${sim.url}/v1/completions`, { prompt: `x${i} y${i}`, max_tokens: 1 })
    const batches = await replay(replayEndpoint)
    expect(batches.map(([s]) => s)).toEqual([0n, 2n, 3n])
    expect(batches[0]?.[1][1]).toEqual([["AllBlocksCleared"]])
    const ev = batches[1]?.[1][1][0] as Array<unknown>
    expect(ev[0]).toBe("BlockStored")
    expect(ev[4]).toBe(2)
    expect(ev[6]).toBe("GPU")
  })
})

describe("SGLang KV events", () => {
  it("needs publisher zmq and sends signed int64 hashes", async () => {
    const replayPort = await freePort()
    const cfg = { publisher: "zmq", endpoint: `tcp://*:${await freePort()}`, replay_endpoint: `tcp://*:${replayPort}` }
    const sim = await startSim({
      args: ["--model-path", "m", "--page-size", "2", "--kv-events-config", JSON.stringify(cfg), "--sim-seed", "3"]
    })
    try {
      await sim.waitForLine((l) => l.includes('"model loaded"'))
      for (let i = 0; i < 6; i++)
        await postJson(`${sim.url}/v1/completions`, { prompt: `q${i} r${i} s${i} t${i}`, max_tokens: 1 })
      const events = (await replay(`tcp://127.0.0.1:${replayPort}`)).flatMap(
        ([, b]) => b[1] as Array<Record<string, unknown>>
      )
      const hashes = events.flatMap((e) => (e.type === "BlockStored" ? (e.block_hashes as Array<bigint | number>) : []))
      expect(hashes.length).toBeGreaterThan(0)
      expect(hashes.some((h) => BigInt(h) < 0n)).toBe(true)
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
})
