// KvBridge end to end with real sockets: the engine simulator (or a scripted ZMQ publisher) -> the bridge
// -> the reference kvcached receiver (RPC server on a temp Unix socket), in process. Covers both bind directions,
// kvcached absent at start, gaps with and without replay (3- and 4-frame replies), engine restart, overflow
// while the reader keeps up, SGLang's tagged arrays with salt metadata and its 0.0.0.0 bind rule, one
// stream per data-parallel rank, and the pure decoder/wire/queue pieces with msgpack built here.
import * as fs from "node:fs/promises"
import * as net from "node:net"
import * as os from "node:os"
import * as path from "node:path"
import { encode } from "@msgpack/msgpack"
import { Context, Effect, Exit, Fiber, Layer, Logger, Scope } from "effect"
import { afterEach, describe, expect, it, vi } from "vitest"
import * as zmq from "zeromq"
import * as ConfigLive from "../../src/layers/config/Config.ts"
import { decodeConfigObject } from "../../src/layers/config/Config.ts"
import { engineFor } from "../../src/layers/engine/backends/index.ts"
import { planLayer } from "../../src/layers/engine/EnginePlan.ts"
import * as KvBridgeLive from "../../src/layers/kv/KvBridge.ts"
import { runLink } from "../../src/layers/kv/kvcachedClient.ts"
import * as ReceiverLive from "../../src/layers/kv/kvcachedReceiver.ts"
import { type QueuedBody, queuedRecord, resyncOf } from "../../src/layers/kv/rankSequencer.ts"
import { EnginePlan } from "../../src/services/engine/Engine.ts"
import { State } from "../../src/services/engine/EngineState.ts"
import { KvBridge, type KvBridgeStatus } from "../../src/services/kv/KvBridge.ts"
import {
  checkSeq,
  decodeMessage,
  END_OF_REPLAY,
  rankEndpoint,
  seqFrame,
  splitReplayReply
} from "../../src/services/kv/KvEvents.ts"
import { KvQueue } from "../../src/services/kv/KvQueue.ts"
import { batchRecord, hello, resyncRecord } from "../../src/services/kv/KvWire.ts"
import { buildNodeHealth } from "../../src/services/node/NodeHealthView.ts"
import { Metrics } from "../../src/services/observability/Metrics.ts"
import { jitteredBackoffMs } from "../../src/services/retry/Backoff.ts"
import * as EngineProcessLayer from "../../src/testing/EngineProcess.ts"
import * as MetricsTest from "../../src/testing/Metrics.ts"
import { pollUntil } from "../support/poll.ts"
import { freePort, freePortRange } from "../support/ports.ts"
import { postJson, type SimHandle, startSim } from "../support/sim.ts"

/**
 * Faults for the bridge's SUB sockets (the real zeromq otherwise): `next` receives take their message and then
 * reject, as a socket error would lose it; while `always`, a receive rejects at once.
 */
const subFaults = vi.hoisted(() => ({ next: 0, always: false }))
/**
 * What the bridge's replay DEALER holds, measured outside the bridge: the frame bytes received by the one open now
 * (a replay keeps every reply until the range is complete), and the most it had kept while waiting for the next.
 */
const dealerBytes = vi.hoisted(() => ({ live: 0, maxKept: 0 }))
vi.mock("zeromq", async (importOriginal) => {
  const real = await importOriginal<typeof import("zeromq")>()
  class Subscriber extends real.Subscriber {
    override async receive(): Promise<Array<Buffer>> {
      if (subFaults.always) throw new Error("injected receive fault (always)")
      const frames = await super.receive()
      if (subFaults.next > 0) {
        subFaults.next--
        throw new Error("injected receive fault")
      }
      return frames
    }
  }
  class Dealer extends real.Dealer {
    override async receive(): Promise<Array<Buffer>> {
      dealerBytes.maxKept = Math.max(dealerBytes.maxKept, dealerBytes.live)
      const frames = await super.receive()
      for (const f of frames) dealerBytes.live += f.length
      return frames
    }
    override close(): void {
      dealerBytes.live = 0
      super.close()
    }
  }
  return { ...real, Subscriber, Dealer }
})

const BIG = 15760518052499183552n
const id = { node_id: "n1", cluster: "c1", model: "m", engine: "vllm" }
type Line = Record<string, unknown>

const cleanups: Array<() => Promise<unknown>> = []
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => undefined)
  subFaults.next = 0
  subFaults.always = false
  dealerBytes.live = 0
  dealerBytes.maxKept = 0
})

const until = <T>(f: () => T | undefined | false | Promise<T | undefined | false>, what: string, ms = 10_000) =>
  pollUntil(what, f, ms, 20)

const tmpSock = async () => {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), "kvb-"))
  cleanups.push(() => fs.rm(dir, { recursive: true, force: true }))
  return path.join(dir, "kvcached.sock")
}

/** The reference receiver: every Hello (as `{type: "Hello", ...}`) and record it applied, in order. */
const kvcached = async (sockPath: string) => {
  const lines: Array<Line> = []
  const scope = await Effect.runPromise(Scope.make())
  const sink = {
    onHello: (h: object) => void lines.push({ type: "Hello", ...h }),
    onRecord: (_node: string, _epoch: string, r: object) => void lines.push({ ...r })
  }
  await Effect.runPromise(Layer.buildWithScope(ReceiverLive.layer({ path: sockPath, sink }), scope))
  const close = () => Effect.runPromise(Scope.close(scope, Exit.void))
  cleanups.push(close)
  return { lines, close, batches: () => lines.filter((l) => l.type === "Batch") }
}

/** The bridge; with `logs`, each line it logs goes there as "level message" (the default logger's otherwise). */
const startBridge = async (
  o: Omit<KvBridgeLive.BridgeOptions, "identity" | "blockSize" | "epoch">,
  logs?: Array<string>
) => {
  const scope = await Effect.runPromise(Scope.make())
  cleanups.push(() => Effect.runPromise(Scope.close(scope, Exit.void)))
  const logger = Logger.make(({ logLevel, message }) => logs?.push(`${logLevel} ${[message].flat()[0]}`))
  const layer = KvBridgeLive.layerWith({ identity: id, blockSize: 4, epoch: "e1", backoffMaxMs: 200, ...o }).pipe(
    Layer.provideMerge(MetricsTest.layerTest),
    Layer.provide(logs === undefined ? Layer.empty : Logger.layer([logger]))
  )
  const ctx = await Effect.runPromise(Layer.buildWithScope(layer, scope))
  const status = () => Effect.runPromise(Context.get(ctx, KvBridge).status)
  const metrics = () => Effect.runPromise(Context.get(ctx, Metrics).render).then((t) => t.body)
  return { status, metrics }
}

const simKv = async (endpoint: string, extra: Array<string>, replay?: string) => {
  const cfg = {
    enable_kv_cache_events: true,
    publisher: "zmq",
    endpoint,
    topic: "kv-events",
    ...(replay ? { replay_endpoint: replay } : {})
  }
  const sim = await startSim({
    args: ["serve", "m", "--kv-events-config", JSON.stringify(cfg), "--sim-block-size", "4", ...extra]
  })
  cleanups.push(() => sim.stop())
  return sim
}
let n = 0
const complete = (sim: SimHandle) =>
  postJson(`${sim.url}/v1/completions`, { prompt: `a${n} b${n} c${n} d${n} e${n} f${n} g${++n} h`, max_tokens: 1 })

/** The last seq the bridge saw on a DP rank (its status, per rank). */
const lastSeq = (s: KvBridgeStatus, rank = 0) => s.ranks[rank]?.lastSeq

/** Sends completions until the bridge has seen a batch with seq >= `seq` (the first ones may be lost to ZMQ's join). */
const pumpUntil = async (sim: SimHandle, status: () => Promise<KvBridgeStatus>, seq: number) => {
  await until(async () => {
    const s = await status()
    const at = lastSeq(s)
    if (at !== undefined && BigInt(at) >= BigInt(seq)) return true
    await complete(sim)
    return undefined
  }, `seq ${seq}`)
}

const seqs = (ls: Array<Line>) => ls.map((l) => l.seq as number)
const _stored = (block_hashes: Array<string>) => ({
  type: "BlockStored" as const,
  block_hashes,
  parent_block_hash: null,
  token_ids: [1],
  block_size: 1,
  medium: "GPU"
})

describe("KvBridge with the simulator", () => {
  it("agent binds; kvcached absent at start, then Hello and batches with exact hashes; gap -> Resync", async () => {
    const port = await freePort()
    const sock = await tmpSock()
    const bridge = await startBridge({
      kvEvents: {
        endpoint: `tcp://127.0.0.1:${port}`,
        engineBinds: false,
        replayEndpoint: undefined,
        topic: "kv-events"
      },
      uds: sock
    })
    // The skipped seq well past the join: ZMQ drops what the engine publishes before its connection to the agent is
    // made (the slow joiner), and on a loaded machine a dozen batches went before it, so seq 12 came as the join
    // itself, no gap, no Resync (a fresh-clone CI run).
    const sim = await simKv(`tcp://127.0.0.1:${port}`, ["--sim-kv-skip-seq", "40"])
    await pumpUntil(sim, bridge.status, 1)
    const before = await bridge.status()
    expect(before).toMatchObject({ enabled: true, subscribed: true, kvcachedConnected: false, forwarded: 0 })
    expect(before.lastError).toMatch(/^kvcached .*ENOENT.* \(reconnecting in \d+ ms\)$/)
    // the sample line, not the HELP line ("# HELP cgn_agent_kvcached_connected 1 while connected ...")
    expect(await bridge.metrics()).toMatch(/^cgn_agent_kvcached_connected 0$/m)

    const kc = await kvcached(sock)
    await until(() => kc.batches().length > 0 || undefined, "first batch")
    expect(kc.lines[0]).toMatchObject({ type: "Hello", version: 2, ...id, epoch: "e1", block_size: 4 })
    await pumpUntil(sim, bridge.status, 44)
    await until(() => kc.batches().some((b) => (b.seq as number) >= 44) || undefined, "batch 44")

    const batches = kc.batches()
    for (const b of batches) expect(b).toMatchObject({ dp_rank: 0 })
    const s = seqs(batches)
    expect(s).toEqual([...s].sort((a, b) => a - b))
    expect(new Set(s).size).toBe(s.length)
    expect(s).not.toContain(40)
    const resync = kc.lines.find((l) => l.type === "Resync")
    expect(resync).toMatchObject({ reason: "gap", from_seq: 40, to_seq: 41 })
    expect(kc.lines.indexOf(resync as Line)).toBeLessThan(kc.lines.findIndex((l) => l.seq === 41))

    const stored = batches.flatMap((b) => (b.events as Array<Line>).filter((e) => e.type === "BlockStored"))
    expect(stored[0]).toMatchObject({ block_size: 4, medium: "GPU" })
    const hashes = stored.flatMap((e) => e.block_hashes as Array<string>)
    expect(hashes.every((h) => typeof h === "string" && /^\d+$/.test(h))).toBe(true)
    expect(hashes.some((h) => BigInt(h) >= 1n << 63n)).toBe(true)

    // resyncs counts what kvcached acknowledged: the Resync's Push may still be answering.
    const st = await until(async () => {
      const s = await bridge.status()
      return s.resyncs === 1 ? s : undefined
    }, "the Resync acknowledged")
    expect(st).toMatchObject({ kvcachedConnected: true, gaps: 1, resyncs: 1, dropped: 0 })
    // kvcached is back: its connection error is not shown as if it were current.
    expect(st.lastError).toBeUndefined()
    const page = await bridge.metrics()
    expect(page).toMatch(/^cgn_agent_kv_events_forwarded_total [1-9]\d*$/m)
    expect(page).toMatch(/^cgn_agent_kvcached_connected 1$/m)
    // each counter mirrors its own status field: the gap (not replayed), its Resync, and no state lost by kvcached
    expect(page).toMatch(/^cgn_agent_kv_event_gaps_total 1$/m)
    expect(page).toMatch(/^cgn_agent_kv_resyncs_total 1$/m)
    expect(page).toMatch(/^cgn_agent_kvcached_state_losses_total 0$/m)
  })

  it("engine binds tcp://*:P; the join is filled from vLLM >= 0.26's 4-frame replay, an unreplayable gap still gets a Resync", async () => {
    const [port, rport] = [await freePort(), await freePort()]
    const sock = await tmpSock()
    const kc = await kvcached(sock)
    const sim = await simKv(`tcp://*:${port}`, ["--sim-kv-skip-seq", "8"], `tcp://*:${rport}`)
    // A request before the bridge exists: seq 0 (its blocks) is published before anyone listens.
    expect((await complete(sim)).status).toBe(200)
    const bridge = await startBridge({
      kvEvents: {
        endpoint: `tcp://*:${port}`,
        engineBinds: true,
        replayEndpoint: `tcp://*:${rport}`,
        topic: "kv-events"
      },
      uds: sock
    })
    await pumpUntil(sim, bridge.status, 10)
    await until(() => kc.batches().some((b) => (b.seq as number) >= 10) || undefined, "batch 10")
    const s = seqs(kc.batches())
    expect(s[0]).toBe(0)
    expect(kc.batches()[0]?.events).toEqual([expect.objectContaining({ type: "BlockStored" })])
    expect(s).toEqual([...s].sort((a, b) => a - b))
    expect(s).not.toContain(8)
    expect(s.filter((x) => x < 8)).toEqual([0, 1, 2, 3, 4, 5, 6, 7])
    expect(kc.lines.filter((l) => l.type === "Resync")).toMatchObject([{ reason: "gap", from_seq: 8, to_seq: 9 }])
    expect(await bridge.status()).toMatchObject({ gaps: 1, replayed: 0 })
  })
})

/** A scripted engine-side publisher: PUB plus replay ROUTER, where a batch can be buffered but not sent. */
/** The msgpack payload the fake engine sends for one BlockStored event of `hashes`. */
const enginePayload = (hashes: Array<bigint>): Uint8Array => {
  const ev = { type: "BlockStored", block_hashes: hashes, parent_block_hash: null, token_ids: [1] }
  return encode([1.5, [{ ...ev, block_size: 1, medium: "GPU" }], 0], { useBigInt64: true })
}

const fakeEngine = async () => {
  const [port, rport] = [await freePort(), await freePort()]
  let pub = new zmq.Publisher({ linger: 0 })
  let router = new zmq.Router({ linger: 0 })
  await pub.bind(`tcp://127.0.0.1:${port}`)
  await router.bind(`tcp://127.0.0.1:${rport}`)
  let buffer: Array<[bigint, Uint8Array]> = []
  let gate: Promise<void> = Promise.resolve()
  /** Replay requests wait (and stay queued) until the returned function is called. */
  const holdReplays = () => {
    let open = () => {}
    gate = new Promise<void>((r) => {
      open = r
    })
    return open
  }
  let pause: { readonly after: number; readonly gate: Promise<void> } | undefined
  /** The next replay sends `after` replies, then waits until the returned function is called. */
  const holdReplayAfter = (after: number) => {
    let open = () => {}
    const gate = new Promise<void>((r) => {
      open = r
    })
    pause = { after, gate }
    return open
  }
  const serveReplays = async (router: zmq.Router, buffer: Array<[bigint, Uint8Array]>) => {
    try {
      for await (const [ident, , start] of router) {
        await gate
        const from = (start as Buffer).readBigUInt64BE()
        const paused = pause
        pause = undefined
        let sent = 0
        for (const [s, p] of buffer) {
          if (s < from) continue
          if (sent++ === paused?.after) await paused.gate
          await router.send([ident as Buffer, "", seqFrame(s), p])
        }
        await router.send([ident as Buffer, "", seqFrame(0xffffffffffffffffn), ""])
      }
    } catch {
      // closed
    }
  }
  void serveReplays(router, buffer)
  cleanups.push(async () => {
    pub.close()
    router.close()
  })
  let seq = 0n
  /** The engine (its publisher and replay ROUTER) gone and started again on the same ports: seq from 0, a new buffer. */
  const restart = async () => {
    pub.close()
    router.close()
    pub = new zmq.Publisher({ linger: 0 })
    router = new zmq.Router({ linger: 0 })
    // ZMQ closes a socket in its I/O thread: the port may still be held for a moment.
    const rebind = (socket: zmq.Publisher | zmq.Router, at: string) =>
      until(
        () =>
          socket.bind(at).then(
            () => true,
            () => undefined
          ),
        `rebind ${at}`
      )
    await rebind(pub, `tcp://127.0.0.1:${port}`)
    await rebind(router, `tcp://127.0.0.1:${rport}`)
    buffer = []
    seq = 0n
    void serveReplays(router, buffer)
  }
  const send = async (opts: { lose?: boolean; seq?: bigint; hashes?: Array<bigint>; payload?: Uint8Array } = {}) => {
    if (opts.seq !== undefined) seq = opts.seq
    const s = seq++
    const payload = opts.payload ?? enginePayload(opts.hashes ?? [s + 1n])
    buffer.push([s, payload])
    if (!opts.lose) await pub.send(["kv", seqFrame(s), payload])
    return s
  }
  const endpoint = (replay: boolean) => ({
    endpoint: `tcp://127.0.0.1:${port}`,
    engineBinds: true,
    replayEndpoint: replay ? `tcp://127.0.0.1:${rport}` : undefined,
    topic: "kv"
  })
  /** The seq of the last batch sent (or lost). */
  const sent = () => seq - 1n
  return { send, sent, endpoint, holdReplays, holdReplayAfter, restart }
}

/** The scripted engine, kvcached and a bridge (replaying from the engine's ROUTER or not), kvcached holding the join. */
const joinedBridge = async (replay: boolean, o: Partial<KvBridgeLive.BridgeOptions> = {}) => {
  const eng = await fakeEngine()
  const sock = await tmpSock()
  const kc = await kvcached(sock)
  const bridge = await startBridge({ kvEvents: eng.endpoint(replay), uds: sock, ...o })
  // Joined once the bridge has the last batch sent: one sent by an earlier poll may still be on its way behind it.
  const joined = BigInt(
    await until(async () => {
      const last = lastSeq(await bridge.status())
      if (last === undefined) await eng.send()
      else if (BigInt(last) === eng.sent()) return last
    }, "join")
  )
  await until(() => kc.batches().some((b) => BigInt(b.seq as number) === joined) || undefined, "joined batch")
  return { eng, kc, bridge, joined }
}

describe("KvBridge with a scripted publisher", () => {
  it("replay fills a lost batch; an engine restart gives Resync restart", async () => {
    const eng = await fakeEngine()
    const sock = await tmpSock()
    const kc = await kvcached(sock)
    const bridge = await startBridge({ kvEvents: eng.endpoint(true), uds: sock })
    await until(async () => lastSeq(await bridge.status()) ?? void (await eng.send()), "join")
    await eng.send({ lose: true })
    const last = await eng.send({ hashes: [BIG] })
    await until(() => kc.batches().some((b) => BigInt(b.seq as number) === last) || undefined, "last")
    expect(seqs(kc.batches())).toEqual(Array.from({ length: Number(last) + 1 }, (_, i) => i))
    expect(kc.lines.some((l) => l.type === "Resync")).toBe(false)
    expect(kc.batches().at(-1)?.events).toMatchObject([{ block_hashes: ["15760518052499183552"] }])
    expect(await bridge.status()).toMatchObject({ gaps: 1, replayed: 1, resyncs: 0 })

    await eng.send({ seq: 0n })
    await until(() => kc.lines.find((l) => l.type === "Resync"), "restart resync")
    // The Resync and the seq-0 batch may reach kvcached in separate reads: wait for the batch, then look behind it.
    await until(() => (kc.lines.at(-1)?.seq === 0 ? true : undefined), "seq 0 after restart")
    expect(kc.lines.at(-2)).toMatchObject({ type: "Resync", reason: "restart", from_seq: Number(last) + 1, to_seq: 0 })
  })

  it("a publisher that restarts by itself (no engine exit seen) and passes the old seq before the reader is back: a restart, the new run replayed from 0", async () => {
    const { eng, kc, bridge, joined } = await joinedBridge(true)
    const old = await eng.send()
    await until(() => kc.batches().some((x) => BigInt(x.seq as number) === old) || undefined, "the old run's last")
    await eng.restart()
    // The new run publishes seqs 0 to old + 2 while the reader is not back (lost to it, kept in the new replay buffer).
    for (let i = 0n; i <= old + 2n; i++) await eng.send({ lose: true })
    // Reconnected: the old run is retracted.
    await until(() => kc.lines.find((l) => l.type === "Resync"), "the restart Resync")
    expect(kc.lines.find((l) => l.type === "Resync")).toMatchObject({
      reason: "restart",
      from_seq: Number(old) + 1,
      to_seq: 0
    })
    // Live batches of the new run (the first may go out before the new connection's subscription joined): what the
    // reader missed of the run is replayed, from 0.
    await until(async () => {
      const at = lastSeq(await bridge.status())
      if (at !== undefined && BigInt(at) > old + 2n) return true
      await eng.send()
      return undefined
    }, "a live batch of the new run")
    const last = BigInt(lastSeq(await bridge.status()) ?? -1)
    const afterResync = () => kc.lines.slice(kc.lines.findIndex((l) => l.type === "Resync") + 1)
    await until(() => afterResync().some((l) => BigInt(l.seq as number) === last) || undefined, "the new run forwarded")
    expect(afterResync().map((l) => l.seq)).toEqual(Array.from({ length: Number(last) + 1 }, (_, i) => i))
    expect(joined).toBeLessThanOrEqual(old)
    expect(await bridge.status()).toMatchObject({ resyncs: 1 })
  })

  it("a gap found in the batches held during a replay is replayed too, with no new message to wake the reader", async () => {
    const { eng, kc, bridge, joined } = await joinedBridge(true)
    const open = eng.holdReplays()
    await eng.send({ lose: true })
    const b = await eng.send()
    await until(async () => ((await bridge.status()).gaps === 1 ? true : undefined), "first gap")
    await eng.send({ lose: true })
    const d = await eng.send()
    await until(async () => (lastSeq(await bridge.status()) === String(d) ? true : undefined), "d held")
    expect(b).toBe(joined + 2n)
    open()
    await until(() => kc.batches().some((x) => BigInt(x.seq as number) === d) || undefined, "d forwarded")
    expect(seqs(kc.batches())).toEqual(Array.from({ length: Number(d) + 1 }, (_, i) => i))
    expect(kc.lines.some((l) => l.type === "Resync")).toBe(false)
    expect(await bridge.status()).toMatchObject({ gaps: 2, replayed: 2, resyncs: 0 })
  })

  // README: "Live batches of that rank are held meanwhile: the whole replay has one 2 s deadline" (the bridge's
  // default: the daemon passes none of its own).
  it("a replay that never answers holds its rank's live batches for 2 s, then the gap is resynced", async () => {
    const { eng, kc } = await joinedBridge(true)
    const open = eng.holdReplays()
    try {
      await eng.send({ lose: true })
      const startedAt = performance.now()
      const held = await eng.send()
      await until(
        () => kc.batches().some((x) => BigInt(x.seq as number) === held) || undefined,
        "the held batch",
        8_000
      )
      const tookMs = performance.now() - startedAt
      expect(kc.lines.find((l) => l.type === "Resync")).toMatchObject({ reason: "gap", from_seq: Number(held) - 1 })
      expect(tookMs).toBeGreaterThanOrEqual(1_900)
      expect(tookMs).toBeLessThan(6_000)
    } finally {
      open()
    }
  })

  it("a replay larger than kv.max_queue_bytes is not held: the gap is resynced and the stream goes on", async () => {
    const { eng, kc, bridge, joined } = await joinedBridge(true, { maxQueueBytes: 4096 })
    // 100 lost batches of ~80 bytes of frames each: the replay of the gap would pass the 4 KiB bound.
    for (let i = 0; i < 100; i++) await eng.send({ lose: true })
    const after = await eng.send()
    await until(
      () => kc.batches().some((x) => BigInt(x.seq as number) === after) || undefined,
      "the batch after the gap"
    )
    expect(kc.lines.find((l) => l.type === "Resync")).toMatchObject({
      reason: "gap",
      from_seq: Number(joined) + 1,
      to_seq: Number(after)
    })
    const st = await bridge.status()
    expect(st).toMatchObject({ gaps: 1, replayed: 0 })
    expect(st.lastBatchError).toMatch(
      /passed 4096 bytes \(kv.max_queue_bytes\) with what the bridge holds; not replayed/
    )
  })

  it("a replay's replies count against kv.max_queue_bytes as they arrive, with the queue and the held batches: the bound holds, and the status shows them", async () => {
    const eng = await fakeEngine()
    const sock = await tmpSock() // kvcached stays away until the end: nothing leaves the queue meanwhile
    const max = 48 * 1024
    const bridge = await startBridge({ kvEvents: eng.endpoint(true), uds: sock, maxQueueBytes: max })
    await until(async () => lastSeq(await bridge.status()) ?? void (await eng.send()), "join")
    // Batches of ~1 KB: 20 queued, then 40 lost that the replay brings back (alone within the bound, not with the rest).
    const big = enginePayload(Array.from({ length: 100 }, (_, i) => BIG + BigInt(i)))
    const [one, frames] = [96 + big.byteLength, 8 + big.byteLength] // held; as the DEALER receives it
    let queuedLast = 0n
    for (let i = 0; i < 20; i++) queuedLast = await eng.send({ payload: big })
    const base = await until(async () => {
      const s = await bridge.status()
      const at = String(queuedLast)
      return lastSeq(s) === at && !s.ranks[0]?.replaying && s.queued === Number(at) + 1 ? s : undefined
    }, "the join's replay over, every batch queued")
    const lost = 40
    expect(lost * frames).toBeLessThan(max)
    expect(base.queuedBytes + one + lost * frames).toBeGreaterThan(max)
    const open = eng.holdReplayAfter(3)
    for (let i = 0; i < lost; i++) await eng.send({ lose: true, payload: big })
    const trigger = await eng.send({ payload: big })

    // The ROUTER sent 3 replies and waits: the bridge holds them beside the held batch, and says so.
    await until(() => dealerBytes.live === 3 * frames || undefined, "3 replies received")
    const during = await bridge.status()
    expect(during.ranks[0]).toMatchObject({ replaying: true, lastSeq: String(trigger) })
    expect(during).toMatchObject({ queued: base.queued + 4, queuedBytes: base.queuedBytes + 4 * one })
    expect(await bridge.metrics()).toMatch(`cgn_agent_kv_events_queued_bytes ${base.queuedBytes + 4 * one}\n`)
    open()
    const after = await until(async () => {
      const s = await bridge.status()
      return s.ranks[0]?.replaying === false ? s : undefined
    }, "the replay over")
    // What the replay kept, with the queue and the batch held, never passed the bound: it stopped there.
    expect(base.queuedBytes + one + dealerBytes.maxKept).toBeLessThanOrEqual(max)
    expect(after.lastBatchError).toMatch(`passed ${max} bytes (kv.max_queue_bytes) with what the bridge holds`)
    expect(after).toMatchObject({ gaps: 1, replayed: 0, queuedBytes: base.queuedBytes + 96 + one })
    const kc = await kvcached(sock)
    await until(() => kc.batches().some((b) => BigInt(b.seq as number) === trigger) || undefined, "the batch after")
    expect(kc.lines.filter((l) => l.type === "Resync")).toMatchObject([
      { reason: "gap", from_seq: Number(trigger) - lost, to_seq: Number(trigger) }
    ])
  })

  it("resyncs counts the Resyncs kvcached acknowledged: none while it is away, none an overflow dropped unsent", async () => {
    const eng = await fakeEngine()
    const sock = await tmpSock()
    const one = 96 + enginePayload([BIG]).byteLength
    const bridge = await startBridge({ kvEvents: eng.endpoint(false), uds: sock, maxQueueBytes: 5 * one })
    const send = () => eng.send({ hashes: [BIG] })
    await until(async () => lastSeq(await bridge.status()) ?? void (await send()), "join")
    await eng.send({ lose: true, hashes: [BIG] })
    await send()
    // A gap Resync is queued; kvcached has not received it.
    const gapped = await until(async () => {
      const s = await bridge.status()
      return s.gaps === 1 ? s : undefined
    }, "the gap")
    expect(gapped.resyncs).toBe(0)
    let last = 0n
    for (let i = 0; i < 10; i++) last = await send()
    // The overflow dropped it (the oldest) unsent: the overflow Resync that replaces it is the one kvcached gets.
    const full = await until(async () => {
      const s = await bridge.status()
      return lastSeq(s) === String(last) ? s : undefined
    }, "reader caught up")
    expect(full.dropped).toBeGreaterThan(0)
    expect(full.resyncs).toBe(0)
    const kc = await kvcached(sock)
    await until(() => kc.batches().some((b) => BigInt(b.seq as number) === last) || undefined, "the last batch")
    const st = await until(async () => {
      const s = await bridge.status()
      return s.queued === 0 ? s : undefined
    }, "everything acknowledged")
    const received = kc.lines.filter((l) => l.type === "Resync")
    expect(received).toMatchObject([{ reason: "overflow" }])
    expect(st.resyncs).toBe(received.length)
    expect(await bridge.metrics()).toMatch(/cgn_agent_kv_resyncs_total 1\n/)
  })

  it("an undecodable batch is one dropped batch (a decode Resync), not also a forwarded one", async () => {
    const { eng, kc, bridge, joined: first } = await joinedBridge(false)
    const bad = await eng.send({ payload: new Uint8Array([0xc1]) }) // never a valid msgpack byte
    const last = await eng.send()
    await until(() => kc.batches().some((b) => BigInt(b.seq as number) === last) || undefined, "last")
    expect(kc.lines.filter((l) => l.type === "Resync")).toMatchObject([
      { reason: "decode", from_seq: Number(bad), to_seq: Number(bad) + 1 }
    ])
    const received = Number(last - first) + 1
    const st = await until(async () => {
      const s = await bridge.status()
      return s.queued === 0 ? s : undefined
    }, "everything acknowledged")
    // Every batch the reader took counts once: forwarded (applied by kvcached) or dropped.
    expect(st).toMatchObject({ forwarded: received - 1, dropped: 1, resyncs: 1, lastError: undefined })
    // A batch that could not be used is history (lastBatchError), not a fault that is still there.
    expect(st.lastBatchError).toMatch(new RegExp(`^DP rank 0 seq ${bad}: undecodable KV event batch: `))
    expect(st.forwarded).toBe(kc.batches().filter((b) => BigInt(b.seq as number) >= first).length)
    expect(await bridge.metrics()).toMatch(/cgn_agent_kv_events_dropped_total 1\n/)
  })

  it("a batch the wire schema refuses (float token id, corrupt seq) is a decode Resync: the link goes on and says why", async () => {
    const { eng, kc, bridge, joined } = await joinedBridge(false)
    const ev = { type: "BlockStored", block_hashes: [7n], parent_block_hash: null, token_ids: [1.5], block_size: 1 }
    await eng.send({ seq: 1n << 60n }) // a corrupt seq frame (joined + 1): no seq at all, the next batch shows the gap
    const bad = await eng.send({ seq: joined + 2n, payload: encode([1.5, [ev], 0], { useBigInt64: true }) })
    const after = await eng.send()
    await until(() => kc.batches().some((b) => BigInt(b.seq as number) === after) || undefined, "the batch after")
    expect(kc.lines.filter((l) => l.type === "Resync")).toMatchObject([
      { reason: "gap", from_seq: Number(joined) + 1, to_seq: Number(bad) },
      { reason: "decode", from_seq: Number(bad), to_seq: Number(bad) + 1 }
    ])
    const st = await bridge.status()
    expect(st).toMatchObject({ kvcachedConnected: true, lastError: undefined, dropped: 1 })
    expect(st.lastBatchError).toMatch(
      /^DP rank 0 seq \d+: .*schema refuses: Expected an integer at \["events"\]\[0\]\["token_ids"\]\[0\]/
    )
  })

  it("whatever let it through, a record kvcached's client cannot encode becomes a decode Resync, never resent", async () => {
    const sock = await tmpSock()
    const kc = await kvcached(sock)
    const queue = new KvQueue<QueuedBody>(1 << 20)
    const rec = (seq: number, tok: number) =>
      queuedRecord(
        {
          ...batchRecord({
            topic: "kv",
            seq: BigInt(seq),
            ts: 1,
            dpRank: 0,
            events: [],
            unknownTypes: 0,
            unknownKeys: 0
          }),
          events: [{ ..._stored(["1"]), token_ids: [tok] }]
        },
        0,
        BigInt(seq),
        BigInt(seq + 1)
      )
    for (const [seq, tok] of [
      [0, 1],
      [1, 2 ** 60],
      [2, 1]
    ] as const)
      queue.push(rec(seq, tok))
    const errors: Array<string> = []
    const link = Effect.runFork(
      runLink({
        path: sock,
        queue,
        hello: hello(id, { epoch: "e1", blockSize: 4 }),
        resync: resyncOf,
        materialize: (record) => ({ record, dropped: false }), // no check on the way: the link's own must hold
        backoffMaxMs: 200,
        onConnected: () => undefined,
        onForwarded: () => undefined,
        onUnencodable: (e) => void errors.push(e)
      })
    )
    cleanups.push(() => Effect.runPromise(Fiber.interrupt(link)))
    await until(() => kc.lines.some((l) => l.seq === 2) || undefined, "the batch after")
    expect(kc.lines.filter((l) => l.type !== "Hello").map((l) => [l.n, l.type, l.seq ?? l.reason])).toEqual([
      [0, "Batch", 0],
      [1, "Resync", "decode"],
      [2, "Batch", 2]
    ])
    expect(kc.lines.filter((l) => l.type === "Hello")).toHaveLength(1)
    expect(errors.join()).toMatch(/DP rank 0 seq 1: Expected an integer at \["events"\]\[0\]\["token_ids"\]\[0\]/)
    expect({ batches: queue.batches, dropped: queue.dropped }).toEqual({ batches: 0, dropped: 1 })
  })

  it("a rank reader that fails is resubscribed with growing backoff; what it missed is a gap, and the status says so meanwhile", async () => {
    const { eng, kc, bridge, joined } = await joinedBridge(false, { backoffMaxMs: 1_000 })
    expect(await bridge.status()).toMatchObject({ subscribed: true })

    // The socket fails, losing the batch it was receiving, and fails again at once on every new socket.
    subFaults.next = 1
    subFaults.always = true
    const lost = await eng.send()
    const down = await until(async () => {
      const s = await bridge.status()
      return /failure 5\b/.test(s.lastError ?? "") ? s : undefined
    }, "the 5th failure in a row")
    expect(down.subscribed).toBe(false)
    expect(await bridge.metrics()).toMatch(/cgn_agent_kv_events_subscribed 0\n/)
    expect(down.lastError).toMatch(/^kv events reader of DP rank 0 stopped: .*injected receive fault/)
    // No message came between the failures: the backoff grew to its cap (at the base it would be 50-100 ms).
    const retryInMs = Number(/resubscribing in (\d+) ms/.exec(down.lastError ?? "")?.[1])
    expect(retryInMs).toBeGreaterThanOrEqual(jitteredBackoffMs(5, 1_000, 0))
    expect(retryInMs).toBeLessThanOrEqual(jitteredBackoffMs(5, 1_000, 1))

    subFaults.always = false
    const back = await until(async () => {
      const s = await bridge.status()
      const at = lastSeq(s)
      if (at !== undefined && BigInt(at) > lost) return s
      await eng.send()
      return undefined
    }, "batches after the resubscribe")
    expect(back.subscribed).toBe(true)
    // Subscribed again: the reader's failure is over, and lastError no longer shows it.
    expect(back.lastError).toBeUndefined()
    expect(await bridge.metrics()).toMatch(/cgn_agent_kv_events_subscribed 1\n/)
    const next = await until(() => kc.batches().find((b) => BigInt(b.seq as number) > lost), "the first batch after")
    // kvcached hears that the batches the reader missed are lost, right before the first one it got again.
    const resyncs = kc.lines.filter((l) => l.type === "Resync")
    expect(resyncs).toMatchObject([{ reason: "gap", dp_rank: 0, from_seq: Number(lost), to_seq: next.seq }])
    expect(kc.lines.indexOf(resyncs[0] as Line)).toBe(kc.lines.indexOf(next) - 1)
    expect(seqs(kc.batches()).filter((x) => BigInt(x) < lost)).toEqual(
      Array.from({ length: Number(lost - joined) }, (_, i) => Number(joined) + i)
    )
    await until(async () => ((await bridge.status()).resyncs === 1 ? true : undefined), "the Resync acknowledged")
    expect(await bridge.status()).toMatchObject({ subscribed: true, gaps: 1, resyncs: 1 })
  })

  it("a bind that fails (the port taken) is retried with the bridge's backoff and cap, and shown until it succeeds", async () => {
    const port = await freePort()
    const holder = net.createServer()
    await new Promise<void>((resolve) => holder.listen(port, "127.0.0.1", resolve))
    cleanups.push(() => new Promise((resolve) => holder.close(resolve)))
    const sock = await tmpSock()
    await kvcached(sock) // so that the reader's is the only fault
    const bridge = await startBridge({
      kvEvents: { endpoint: `tcp://127.0.0.1:${port}`, engineBinds: false, replayEndpoint: undefined, topic: "t" },
      uds: sock,
      backoffMaxMs: 300
    })
    const down = await until(async () => {
      const s = await bridge.status()
      return /failure 4\b/.test(s.lastError ?? "") ? s : undefined
    }, "the 4th failed bind in a row")
    expect(down.subscribed).toBe(false)
    expect(down.lastError).toMatch(
      new RegExp(
        `^kv events reader of DP rank 0 stopped: .*cannot bind tcp://127\\.0\\.0\\.1:${port}: .*resubscribing in \\d+ ms\\)$`
      )
    )
    // The bridge's own cap (300 ms here), not a fixed one of the reader's.
    const retryInMs = Number(/resubscribing in (\d+) ms/.exec(down.lastError ?? "")?.[1])
    expect(retryInMs).toBeGreaterThanOrEqual(jitteredBackoffMs(4, 300, 0))
    expect(retryInMs).toBeLessThanOrEqual(300)
    expect(await bridge.metrics()).toMatch(/cgn_agent_kv_events_subscribed 0\n/)

    await new Promise((resolve) => holder.close(resolve))
    const up = await until(async () => {
      const s = await bridge.status()
      return s.subscribed ? s : undefined
    }, "bound once the port is free")
    expect(up.lastError).toBeUndefined()
    expect(await bridge.metrics()).toMatch(/cgn_agent_kv_events_subscribed 1\n/)
  })

  it("a replay in flight when its rank's reader fails still finishes, and the restarted reader's batches follow it", async () => {
    const { eng, kc, bridge } = await joinedBridge(true)
    const open = eng.holdReplays()
    await eng.send({ lose: true })
    await eng.send()
    await until(async () => ((await bridge.status()).gaps === 1 ? true : undefined), "a gap, its replay held")
    // The reader fails while that replay waits, losing the batch it was receiving.
    subFaults.next = 1
    const lost = await eng.send()
    const last = await until(async () => {
      const s = await bridge.status()
      const at = lastSeq(s)
      if (s.subscribed && at !== undefined && BigInt(at) > lost) return BigInt(at)
      await eng.send()
      return undefined
    }, "the restarted reader's batches")
    open()
    await until(() => kc.batches().some((b) => BigInt(b.seq as number) === last) || undefined, "the last batch")
    // The held replay ended (and a second one filled what the failing reader lost): nothing missing, no Resync.
    expect(seqs(kc.batches())).toEqual(Array.from({ length: Number(last) + 1 }, (_, i) => i))
    expect(kc.lines.some((l) => l.type === "Resync")).toBe(false)
    const st = await bridge.status()
    expect(st.gaps).toBeGreaterThanOrEqual(2)
    expect(st).toMatchObject({ replayed: st.gaps, resyncs: 0, subscribed: true })
  })

  it("overflow while kvcached is away: the reader keeps up, oldest dropped, Resync overflow", async () => {
    const eng = await fakeEngine()
    const sock = await tmpSock()
    // Room for exactly 5 of these equal-sized batches. The queue holds them as the engine sent them (decoded
    // only when sent): each costs its payload plus a fixed 96 bytes of record around it.
    const one = 96 + enginePayload([BIG]).byteLength
    const logs: Array<string> = []
    const bridge = await startBridge({ kvEvents: eng.endpoint(false), uds: sock, maxQueueBytes: 5 * one }, logs)
    const send = () => eng.send({ hashes: [BIG] })
    const first = BigInt(await until(async () => lastSeq(await bridge.status()) ?? void (await send()), "join"))
    let last = 0n
    for (let i = 0; i < 50; i++) last = await send()
    await until(async () => (lastSeq(await bridge.status()) === String(last) ? true : undefined), "reader caught up")
    const st = await bridge.status()
    const received = Number(last - first) + 1
    expect(st).toMatchObject({ queued: 5, queuedBytes: 5 * one, dropped: received - 5, forwarded: 0 })

    const kc = await kvcached(sock)
    await until(() => kc.batches().length === 5 || undefined, "5 batches")
    expect(kc.lines[0]?.type).toBe("Hello")
    expect(kc.lines[1]).toMatchObject({
      type: "Resync",
      reason: "overflow",
      from_seq: Number(first),
      to_seq: Number(last) - 4
    })
    expect(seqs(kc.batches())).toEqual([4, 3, 2, 1, 0].map((d) => Number(last) - d))
    expect(await bridge.metrics()).toMatch(new RegExp(`cgn_agent_kv_events_dropped_total ${received - 5}`))
    // The log says so too: once when the drops started (all within a minute), once when kvcached drained the queue.
    const full = /queue for cgn-kvcached is (full|still full|below half)/
    await until(() => logs.filter((l) => full.test(l)).length === 2 || undefined, "the drained queue's line")
    expect(logs.filter((l) => full.test(l))).toEqual([
      "Warn kv events: the queue for cgn-kvcached is full (kv.max_queue_bytes); the oldest batches are dropped",
      "Info kv events: the queue for cgn-kvcached is below half of kv.max_queue_bytes again"
    ])
  })
})

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
  const engine = Context.get(ctx, EngineProcessLayer.EngineProcessControl)
  return {
    plan: Context.get(ctx, EnginePlan),
    status: () => Effect.runPromise(Context.get(ctx, KvBridge).status),
    /** The supervisor's view: the engine run ended (as a crash or a stop shows it). */
    engineExited: (run: number) =>
      Effect.runPromise(
        engine.set(
          State.Restarting({ attempt: 1, nextAt: Date.now() + 1_000, lastExit: EngineProcessLayer.testExit(run) })
        )
      )
  }
}

/** Runs the simulator with the plan's own command line (the launcher words are stripped by the simulator). */
const simFromPlan = async (argv: ReadonlyArray<string>) => {
  const sim = await startSim({ args: [...argv] })
  cleanups.push(() => sim.stop())
  await sim.waitForLine((l) => l.includes('"model loaded"'))
  return sim
}

const events = (ls: Array<Line>) => ls.flatMap((b) => b.events as Array<Line>)

describe("SGLang through the bridge", () => {
  it("binds tcp://0.0.0.0:P itself, so the agent connects; salted tagged arrays reach kvcached with cache_salt", async () => {
    const [port, enginePort] = [await freePort(), await freePort()]
    const sock = await tmpSock()
    const kc = await kvcached(sock)
    const config = {
      engine: { kind: "sglang", url: `http://127.0.0.1:${enginePort}` },
      models: { m: { hf_repo: "org/m" } },
      kv: { events: true, uds: sock, events_endpoint: `tcp://0.0.0.0:${port}`, block_size: 2 }
    }
    const { plan, status, engineExited } = await bridgeFromConfig(config)
    expect(plan.kvEvents).toMatchObject({ endpoint: `tcp://0.0.0.0:${port}`, engineBinds: true })
    const sim = await simFromPlan(plan.argv)
    expect(sim.stderrLines.some((l) => l.includes('"mode":"bind"'))).toBe(true)
    await until(async () => {
      if (lastSeq(await status()) !== undefined) return true
      await postJson(`${sim.url}/v1/completions`, { prompt: `w${++n} x y z`, max_tokens: 1 })
      return undefined
    }, "first batch")
    await postJson(`${sim.url}/v1/completions`, { prompt: "s1 s2 s3 s4", max_tokens: 1, cache_salt: "tenant-a" })
    const salted = await until(
      () => events(kc.batches()).find((e) => e.type === "BlockStored" && e.cache_salt === "tenant-a"),
      "salted BlockStored"
    )
    expect(salted).toMatchObject({ type: "BlockStored", block_size: 2, medium: "GPU", token_ids: expect.any(Array) })
    expect(salted).not.toHaveProperty("lora_name")
    const st = await status()
    expect(st).toMatchObject({ subscribed: true, unknownEvents: 0, unknownKeys: 0 })
    const hashes = events(kc.batches()).flatMap((e) => (e.block_hashes as Array<string> | undefined) ?? [])
    expect(hashes.every((h) => /^-?\d+$/.test(h) && BigInt(h) >= -(1n << 63n) && BigInt(h) < 1n << 63n)).toBe(true)

    // The engine run ends: kvcached hears at once that the run's blocks are gone (a restart Resync from the
    // stream's next seq), not at the next run's first batch.
    const next = BigInt(lastSeq(await status()) ?? "0") + 1n
    await engineExited(0)
    const restart = await until(
      () => kc.lines.find((l) => l.type === "Resync" && l.reason === "restart"),
      "restart Resync"
    )
    expect(restart).toMatchObject({ dp_rank: 0, from_seq: Number(next), to_seq: 0 })
  })
})

describe("data parallelism", () => {
  const decode = (raw: Record<string, unknown>) => decodeConfigObject(raw, undefined, { NODE_NAME: "n" })
  const models = (m: Record<string, unknown>) => ({ models: { m: { hf_repo: "org/m", ...m } } })

  it("renders --data-parallel-size (vLLM) and --dp-size (SGLang); refuses dp where the engine has none", () => {
    const argv = (kind: string) => {
      const r = decode({ engine: { kind }, ...models({ dp: 2 }) })
      if (r._tag === "Failure") throw new Error(r.failure.message)
      return engineFor(r.success.engine.kind).render(r.success).argv.join(" ")
    }
    expect(argv("vllm")).toContain("--data-parallel-size 2")
    expect(argv("sglang")).toContain("--dp-size 2")
    const one = decode({ ...models({}) })
    if (one._tag === "Failure") throw new Error(one.failure.message)
    expect(engineFor("vllm").render(one.success).argv).not.toContain("--data-parallel-size")
    for (const kind of ["llama_cpp", "mlx", "openai_compat"]) {
      const r = decode({ engine: { kind }, models: { m: { path: "/m.gguf", dp: 2 } } })
      expect(r._tag === "Failure" && r.failure.problems).toContain(
        `models."m".dp: ${kind} has no data parallelism; set dp = 1`
      )
    }
    const ipc = decode({ kv: { events: true, events_endpoint: "ipc:///tmp/kv" }, ...models({ dp: 2 }) })
    expect(ipc._tag === "Failure" && ipc.failure.problems.join("\n")).toMatch(/^models\."m"\.dp: .*ipc:\/\/ endpoint/)
    expect(decode({ ...models({ dp: 0 }) })._tag).toBe("Failure")
    const kv = (replay: string) => ({ events: true, events_endpoint: "tcp://*:5557", replay_endpoint: replay })
    const overlap = decode({ kv: kv("tcp://*:5558"), ...models({ dp: 2 }) })
    expect(overlap._tag === "Failure" && overlap.failure.problems).toEqual([
      'kv.replay_endpoint: with models."m".dp = 2 the KV events use ports 5557-5558 and replay ports 5558-5559; they overlap, move replay_endpoint to port 5559 or above'
    ])
    expect(decode({ kv: kv("tcp://*:5559"), ...models({ dp: 2 }) })._tag).toBe("Success")
    expect(decode({ kv: kv("tcp://*:5558"), ...models({}) })._tag).toBe("Success")
  })

  it("each rank's endpoint is the port + rank, inproc gets _dp<rank>, ipc cannot be offset", () => {
    expect(rankEndpoint("tcp://*:5557", 0)).toBe("tcp://*:5557")
    expect(rankEndpoint("tcp://*:5557", 3)).toBe("tcp://*:5560")
    expect(rankEndpoint("tcp://[::1]:5557", 1)).toBe("tcp://[::1]:5558")
    expect(rankEndpoint("inproc://kv", 2)).toBe("inproc://kv_dp2")
    expect(rankEndpoint("ipc:///tmp/kv", 0)).toBe("ipc:///tmp/kv")
    expect(rankEndpoint("ipc:///tmp/kv", 1)).toBeUndefined()
  })

  it("NodeHealth capacity carries dp", () => {
    const r = decode(models({ dp: 4 }))
    if (r._tag === "Failure") throw new Error(r.failure.message)
    const health = buildNodeHealth({
      config: r.success,
      agentVersion: "0",
      advertiseAddr: "127.0.0.1:7071",
      engine: { _tag: "Stopped", lastExit: undefined } as never,
      engineGpus: [],
      problem: undefined,
      restarts: 0,
      draining: false,
      signals: undefined,
      inflight: 0,
      queued: 0,
      tokensPerSecond: 0,
      gpus: [],
      now: 0
    })
    expect(health.capacity).toMatchObject({ dp: 4 })
  })

  it("subscribes to every rank (port + rank), replays each from its own ROUTER, tags batches with the rank", async () => {
    const [port, enginePort] = [await freePortRange(4), await freePort()]
    const rport = port + 2 // events on port, port + 1; replay on port + 2, port + 3
    const sock = await tmpSock()
    const kc = await kvcached(sock)
    const config = {
      engine: { kind: "vllm", url: `http://127.0.0.1:${enginePort}` },
      models: { m: { hf_repo: "org/m", dp: 2, args: ["--sim-block-size", "2"] } },
      kv: { events: true, uds: sock, events_endpoint: `tcp://*:${port}`, replay_endpoint: `tcp://*:${rport}` }
    }
    // The engine first, and a request to each rank before the bridge listens: each rank's join is filled by replay.
    const rendered = await Effect.runPromise(
      Effect.provide(EnginePlan, planLayer.pipe(Layer.provide(ConfigLive.layerFromObject(config))))
    )
    const sim = await simFromPlan(rendered.argv)
    for (let i = 0; i < 2; i++) await postJson(`${sim.url}/v1/completions`, { prompt: `r${++n} s t u`, max_tokens: 1 })
    const { plan, status } = await bridgeFromConfig(config)
    expect(plan.kvEvents).toMatchObject({ dpSize: 2 })
    // Requests sent one after another alternate ranks (vLLM's API server counts its own picks between the
    // DP coordinator's load reports), and each rank publishes what its own cache stored, on its own seq.
    const ranksAt = (seq: number) =>
      [0, 1].every((r) => kc.batches().some((b) => b.dp_rank === r && (b.seq as number) >= seq))
    const lastOf = (r: number) => Math.max(...seqs(kc.batches().filter((b) => b.dp_rank === r)))
    // Until the ranks' streams stand at different seqs, so that one lastSeq for both could not be right.
    await until(async () => {
      if (ranksAt(3) && lastOf(0) !== lastOf(1)) return true
      await postJson(`${sim.url}/v1/completions`, { prompt: `r${++n} s t u`, max_tokens: 1 })
      return undefined
    }, "batches from both ranks")
    // /status kv says where each rank's stream is.
    const byRank = await until(async () => {
      const s = await status()
      return s.ranks.every((r) => r.lastSeq === String(lastOf(r.rank))) ? s.ranks : undefined
    }, "each rank's last seq in the status")
    expect(byRank).toEqual(
      [0, 1].map((rank) => ({ rank, subscribed: true, lastSeq: String(lastOf(rank)), replaying: false }))
    )
    expect(kc.lines[0]).toMatchObject({ type: "Hello", dp_size: 2 })
    for (const r of [0, 1]) {
      const s = seqs(kc.batches().filter((b) => b.dp_rank === r))
      // seq 0 went out before the bridge existed: only its rank's replay brought it.
      expect(s.slice(0, 4)).toEqual([0, 1, 2, 3])
      expect(kc.batches().find((b) => b.dp_rank === r)?.events).toEqual([
        expect.objectContaining({ type: "BlockStored" })
      ])
    }
    expect(kc.lines.some((l) => l.type === "Resync")).toBe(false)
    expect(await status()).toMatchObject({ subscribed: true, gaps: 0, resyncs: 0 })
  })
})

describe("KvBridge.layer from the config", () => {
  const statusOf = (kv: Record<string, unknown>) =>
    Effect.runPromise(
      Effect.scoped(
        Effect.flatMap(KvBridge, (b) => b.status).pipe(
          Effect.provide(
            KvBridgeLive.layer.pipe(
              Layer.provide(planLayer),
              Layer.provide(ConfigLive.layerFromObject({ models: { m: { hf_repo: "org/m" } }, kv })),
              Layer.provide(MetricsTest.layerTest),
              Layer.provide(EngineProcessLayer.layerTest())
            )
          )
        )
      )
    )
  it("is a no-op that says why when events are off or nothing receives them", async () => {
    expect(await statusOf({})).toMatchObject({ enabled: false, disabledReason: "[kv].events is off", forwarded: 0 })
    expect(await statusOf({ events: true })).toMatchObject({ enabled: false, disabledReason: "[kv].uds is not set" })
  })
})

describe("pure pieces", () => {
  const frames = (batch: unknown, seq = 7n) => [
    new TextEncoder().encode("t"),
    seqFrame(seq),
    encode(batch, { useBigInt64: true })
  ]

  it("decodes map events, legacy arrays, 2-element batches, bin hashes; counts unknowns", () => {
    const map = decodeMessage(
      frames([
        1.25,
        [
          { type: "BlockStored", block_hashes: [BIG, 5], parent_block_hash: null, token_ids: [1, 2], block_size: 2 },
          { type: "BlockRemoved", block_hashes: [BIG], medium: "CPU", locality: "x" },
          { type: "Snapshot" },
          { type: "AllBlocksCleared" }
        ],
        3
      ])
    )
    expect(map.ok && map.batch).toMatchObject({
      topic: "t",
      seq: 7n,
      ts: 1.25,
      dpRank: 3,
      unknownTypes: 1,
      unknownKeys: 1
    })
    expect(map.ok && map.batch.events).toMatchObject([
      { type: "BlockStored", blockHashes: [BIG, 5n], parentBlockHash: null, tokenIds: [1, 2], blockSize: 2 },
      { type: "BlockRemoved", blockHashes: [BIG], medium: "CPU" },
      { type: "AllBlocksCleared" }
    ])
    const legacy = decodeMessage(
      frames([
        2,
        [
          ["BlockStored", [-5n, new Uint8Array([0xab, 1])], 9, [3], 1, null, "GPU"],
          ["BlockRemoved", [1]],
          ["AllBlocksCleared"]
        ]
      ])
    )
    expect(legacy.ok && legacy.batch).toMatchObject({ dpRank: 0, unknownTypes: 0 })
    expect(legacy.ok && legacy.batch.events).toMatchObject([
      { type: "BlockStored", blockHashes: [-5n, "0xab01"], parentBlockHash: 9n, medium: "GPU" },
      { type: "BlockRemoved", blockHashes: [1n], medium: null },
      { type: "AllBlocksCleared" }
    ])
    expect(decodeMessage(frames("nope"))).toMatchObject({ ok: false, seq: 7n })
    expect(decodeMessage(frames([1, [{ no: "type" }]]))).toMatchObject({ ok: false, seq: 7n })
    expect(decodeMessage([new Uint8Array(1), new Uint8Array(3), new Uint8Array(0)])).toMatchObject({
      ok: false,
      seq: undefined
    })
    expect(decodeMessage([new Uint8Array(1)])).toMatchObject({ ok: false })
  })

  it('reads replay replies in both layouts: vLLM >= 0.26 ["", topic, seq, payload], older and SGLang ["", seq, payload]', () => {
    const empty = new Uint8Array(0)
    const payload = encode([1.5, [{ type: "AllBlocksCleared" }], 0], { useBigInt64: true })
    const topic = new TextEncoder().encode("kv")
    // Split, not decoded: the payload is decoded when the batch is sent, as the live stream's.
    expect(splitReplayReply([empty, topic, seqFrame(4n), payload], "ignored")).toEqual({
      end: false,
      ok: true,
      raw: { topic: "kv", seq: 4n, payload }
    })
    expect(splitReplayReply([empty, seqFrame(4n), payload], "kv")).toEqual({
      end: false,
      ok: true,
      raw: { topic: "kv", seq: 4n, payload }
    })
    expect(splitReplayReply([empty, empty, seqFrame(END_OF_REPLAY), empty], "kv")).toEqual({ end: true })
    expect(splitReplayReply([empty, seqFrame(END_OF_REPLAY), empty], "kv")).toEqual({ end: true })
    expect(splitReplayReply([empty, seqFrame(1n)], "kv")).toMatchObject({ end: false, ok: false })
    expect(splitReplayReply([empty, topic, new Uint8Array(3), payload], "kv")).toMatchObject({ ok: false })
  })

  it("reads SGLang's salted BlockStored: metadata in array slot 7 (not lora_name), negative int64 hashes", () => {
    const salted = ["BlockStored", [-5n, -(1n << 63n)], null, [1, 2], 2, null, "GPU", { cache_salt: "tenant-a" }]
    const plain = ["BlockStored", [7n], -5n, [3, 4], 2, null, "GPU"]
    const vllmLegacy = ["BlockStored", [BIG], null, [1], 1, null, "GPU", "my-lora"]
    const d = decodeMessage(frames([1.5, [salted, plain, vllmLegacy], 0]))
    expect(d.ok && d.batch).toMatchObject({ unknownKeys: 0, unknownTypes: 0 })
    expect(d.ok && d.batch.events).toMatchObject([
      { blockHashes: [-5n, -(1n << 63n)], cacheSalt: "tenant-a", loraName: null, medium: "GPU", blockSize: 2 },
      { blockHashes: [7n], parentBlockHash: -5n, cacheSalt: undefined, loraName: null },
      { blockHashes: [BIG], cacheSalt: undefined, loraName: "my-lora" }
    ])
    const record = batchRecord(d.ok ? d.batch : (undefined as never))
    expect(record.events[0]).toMatchObject({
      block_hashes: ["-5", "-9223372036854775808"],
      cache_salt: "tenant-a"
    })
    expect(record.events[0]).not.toHaveProperty("lora_name")
    expect(hello(id, { epoch: "e", blockSize: 16, dpSize: 2 })).toMatchObject({ dp_size: 2 })
  })

  it("tells next, join, gap and restart apart", () => {
    expect(checkSeq(undefined, 0n)).toEqual({ kind: "join", missed: false })
    expect(checkSeq(undefined, 4n)).toEqual({ kind: "join", missed: true })
    expect(checkSeq(5n, 5n)).toEqual({ kind: "next" })
    expect(checkSeq(5n, 9n)).toEqual({ kind: "gap", from: 5n, to: 9n })
    expect(checkSeq(5n, 0n)).toEqual({ kind: "restart", from: 5n, to: 0n })
  })

  it("renders records with decimal-string hashes", () => {
    const record = batchRecord({
      topic: "t",
      seq: 3n,
      ts: 1.5,
      dpRank: 0,
      unknownKeys: 0,
      unknownTypes: 0,
      events: [
        {
          type: "BlockStored",
          blockHashes: [BIG, -1n],
          parentBlockHash: BIG,
          tokenIds: [1],
          blockSize: 1,
          medium: "GPU",
          loraName: null,
          groupIdx: 0,
          specKind: undefined
        }
      ]
    })
    expect(record).toEqual({
      type: "Batch",
      dp_rank: 0,
      seq: 3,
      ts: 1.5,
      events: [
        {
          type: "BlockStored",
          block_hashes: ["15760518052499183552", "-1"],
          parent_block_hash: "15760518052499183552",
          token_ids: [1],
          block_size: 1,
          medium: "GPU",
          group_idx: 0
        }
      ]
    })
    expect(resyncRecord({ reason: "gap", dpRank: 1, fromSeq: 4n, toSeq: 6n })).toEqual({
      type: "Resync",
      dp_rank: 1,
      reason: "gap",
      from_seq: 4,
      to_seq: 6
    })
  })
})
