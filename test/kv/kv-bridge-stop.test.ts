// The KV bridge's end (src/layers/kv/KvBridge.ts, kvcachedClient.ts stopLink) with a real publisher and the
// reference receiver's state on a temp Unix socket: the engine's stop queues a `restart` Resync and the agent's
// shutdown closes the bridge at once, so the Resync is in flight as the link ends. Also the line a bound reader
// logs when its publisher reconnects after the agent dropped it for a frame over the bound.
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { encode } from "@msgpack/msgpack"
import { Effect, Exit, Layer, Logger, Scope } from "effect"
import { afterEach, describe, expect, it } from "vitest"
import * as zmq from "zeromq"
import * as KvBridgeLive from "../../src/layers/kv/KvBridge.ts"
import { STOP_ACK_WAIT_MS, STOP_BOUND_MS } from "../../src/layers/kv/kvcachedClient.ts"
import { type KvcachedHandlers, serve } from "../../src/layers/kv/kvcachedReceiver.ts"
import { ReceiverState } from "../../src/services/kv/KvcachedReceiver.ts"
import { seqFrame } from "../../src/services/kv/KvEvents.ts"
import { pollUntil } from "../support/poll.ts"
import { freePort } from "../support/ports.ts"

type Line = Record<string, unknown>
const id = { node_id: "n1", cluster: "c1", model: "m", engine: "vllm" }
const STOPPING = "kv events: stopping with records kvcached never acknowledged; they are dropped"

const cleanups: Array<() => Promise<unknown>> = []
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => undefined)
})

const payload = (seq: bigint): Uint8Array =>
  encode([1.5, [{ type: "BlockStored", block_hashes: [seq + 1n], parent_block_hash: null, token_ids: [1] }], 0], {
    useBigInt64: true
  })

/** The reference receiver's state behind the contract's server; while `hung`, a Push is never answered. */
const kvcached = async () => {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), "kvstop-"))
  cleanups.push(() => fs.rm(dir, { recursive: true, force: true }))
  const sock = path.join(dir, "kvcached.sock")
  const lines: Array<Line> = []
  const state = new ReceiverState({
    onHello: () => {},
    onRecord: (_node, _epoch, r) => void lines.push({ ...r })
  })
  const ctl = { hung: false }
  const scope = await Effect.runPromise(Scope.make())
  cleanups.push(() => Effect.runPromise(Scope.close(scope, Exit.void)))
  const handlers: KvcachedHandlers = {
    Hello: (h) => state.hello(h),
    Push: (p) => (ctl.hung ? Effect.never : state.push(p))
  }
  await Effect.runPromise(Layer.buildWithScope(serve(sock, handlers), scope))
  return { sock, lines, ctl }
}

/** The bridge in its own scope (closed as the agent's shutdown closes it); what it logs, as [message, fields]. */
const startBridge = async (o: Omit<KvBridgeLive.BridgeOptions, "identity" | "blockSize" | "epoch">) => {
  const logs: Array<{ level: string; msg: string; fields: Line }> = []
  const logger = Logger.make(({ logLevel, message }) => {
    const [msg, fields] = [message].flat() as [string, Line | undefined]
    logs.push({ level: logLevel, msg, fields: fields ?? {} })
  })
  const scope = await Effect.runPromise(Scope.make())
  let closed = false
  const close = () => {
    closed = true
    return Effect.runPromise(Scope.close(scope, Exit.void))
  }
  cleanups.push(() => (closed ? Promise.resolve() : close()))
  const bridge = await Effect.runPromise(
    KvBridgeLive.make({ identity: id, blockSize: 4, epoch: "e1", backoffMaxMs: 200, ...o }).pipe(
      Scope.provide(scope),
      Effect.provide(Logger.layer([logger]))
    )
  )
  const status = () => Effect.runPromise(bridge.status)
  return { bridge, status, logs, close }
}

/** A publisher the bridge connects to (the engine binds), and a bridge that has forwarded its batches to kvcached. */
const joined = async () => {
  const kc = await kvcached()
  const port = await freePort()
  const pub = new zmq.Publisher({ linger: 0 })
  await pub.bind(`tcp://127.0.0.1:${port}`)
  cleanups.push(async () => pub.close())
  const b = await startBridge({
    kvEvents: { endpoint: `tcp://127.0.0.1:${port}`, engineBinds: true, replayEndpoint: undefined, topic: "kv" },
    uds: kc.sock
  })
  let seq = 0n
  // Sends until the bridge has the batch just sent (ZMQ drops what a subscription not yet joined misses), then until
  // kvcached applied it and the link says it is connected.
  await pollUntil("the bridge joined", async () => {
    if ((await b.status()).ranks[0]?.lastSeq === String(seq - 1n)) return true
    await pub.send(["kv", seqFrame(seq), payload(seq)])
    seq++
    return undefined
  })
  const last = Number(seq - 1n)
  await pollUntil("kvcached applied the last batch", async () =>
    kc.lines.some((l) => l.seq === last) && (await b.status()).kvcachedConnected ? true : undefined
  )
  return { kc, b, next: last + 1 }
}

describe("the KV bridge's stop", () => {
  it("waits for kvcached to acknowledge the engine stop's restart Resync: applied, and not said dropped", async () => {
    const { kc, b, next } = await joined()
    // The engine stopped (its restart Resync queued) and the agent's shutdown closes the bridge at once.
    await Effect.runPromise(b.bridge.engineGone)
    await b.close()
    // Before, the link was interrupted with the Resync in flight: kvcached may or may not have applied it, and the
    // bridge said it was dropped.
    expect({ last: kc.lines.at(-1), said: b.logs.filter((l) => l.msg === STOPPING) }).toMatchObject({
      last: { type: "Resync", reason: "restart", dp_rank: 0, from_seq: next, to_seq: 0 },
      said: []
    })
  })

  it("a kvcached that never acknowledges it: the Resync is said dropped, within the stop's bound", async () => {
    const { kc, b } = await joined()
    kc.ctl.hung = true
    await Effect.runPromise(b.bridge.engineGone)
    const startedAt = performance.now()
    await b.close()
    const tookMs = performance.now() - startedAt
    expect(b.logs.filter((l) => l.msg === STOPPING)).toMatchObject([
      { level: "Warn", fields: { batches: 0, resyncs: 1, kvcachedConnected: true } }
    ])
    expect(kc.lines.some((l) => l.type === "Resync")).toBe(false)
    // It waited for the acknowledgement (a loaded host's timer may fire a little early or late), no longer than the
    // stop's share of the shutdown bound (programs/shutdownBound.ts) with a loaded host's slack.
    expect(tookMs).toBeGreaterThanOrEqual(STOP_ACK_WAIT_MS - 20)
    expect(tookMs).toBeLessThan(STOP_BOUND_MS + 500)
  })

  it("bound, a publisher dropped for a frame over the bound reconnects: the line says that cause and the bound", async () => {
    const kc = await kvcached()
    const port = await freePort()
    // kv.max_queue_bytes below 1 MiB: the frame bound is 1 MiB (rankSubscriber.ts maxFrameBytes).
    const b = await startBridge({
      kvEvents: { endpoint: `tcp://127.0.0.1:${port}`, engineBinds: false, replayEndpoint: undefined, topic: "kv" },
      uds: kc.sock,
      maxQueueBytes: 256 * 1024
    })
    const pub = new zmq.Publisher({ linger: 0 })
    pub.connect(`tcp://127.0.0.1:${port}`)
    cleanups.push(async () => pub.close())
    let seq = 0n
    const read = () =>
      pollUntil("the bridge read the batch just sent", async () => {
        if ((await b.status()).ranks[0]?.lastSeq === String(seq - 1n)) return true
        await pub.send(["kv", seqFrame(seq), payload(seq)])
        seq++
        return undefined
      })
    await read()
    await pub.send(["kv", seqFrame(seq++), new Uint8Array(2 * 1024 * 1024)])
    const line = await pollUntil("the reconnect line", () =>
      b.logs.find((l) => l.msg.startsWith("kv events: a rank's publisher reconnected"))
    )
    expect(line).toMatchObject({ level: "Info", fields: { dpRank: 0 } })
    expect(line.msg).toContain(
      "the agent dropped its connection for a frame over 1048576 bytes (the frame bound from kv.max_queue_bytes)"
    )
    await read()
  })
})
