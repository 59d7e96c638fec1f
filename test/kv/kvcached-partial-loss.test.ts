// The kvcached link against a receiver back with part of its state (src/layers/kv/kvcachedClient.ts partlyLost), in
// process on a temp Unix socket, so the Hello answer is exactly what the case needs. README: "`applied` below the last
// `n` it had acknowledged ... sends a `gap` Resync per `dp_rank`, from seq 0 to the seq its stream goes on with" (every
// rank, not only rank 0; and a journal that lost only its last acknowledged record is such a loss too).
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { Effect, Exit, Fiber, Layer, Scope } from "effect"
import { afterEach, describe, expect, it } from "vitest"
import { runLink } from "../../src/layers/kv/kvcachedClient.ts"
import { serve } from "../../src/layers/kv/kvcachedReceiver.ts"
import { type QueuedBody, queuedRecord, resyncOf } from "../../src/layers/kv/rankSequencer.ts"
import { type KvRecord, UnknownStream } from "../../src/services/kv/KvcachedRpc.ts"
import { KvQueue } from "../../src/services/kv/KvQueue.ts"
import { batchRecord, hello } from "../../src/services/kv/KvWire.ts"
import { pollUntil } from "../support/poll.ts"

const cleanups: Array<() => Promise<unknown>> = []
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => undefined)
})

const batch = (dpRank: number, seq: number) =>
  queuedRecord(
    batchRecord({ topic: "kv", seq: BigInt(seq), ts: 1, dpRank, events: [], unknownTypes: 0, unknownKeys: 0 }),
    dpRank,
    BigInt(seq),
    BigInt(seq + 1)
  )

/**
 * A link of `dpSize` ranks to a receiver that records every Push; `ctl.applied` is its next Hello answer, and
 * `ctl.failPushes` Pushes fail (UnknownStream) before it acknowledges again, so the link reconnects and says Hello.
 */
const setup = async (dpSize: number) => {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), "kvpartial-"))
  cleanups.push(() => fs.rm(dir, { recursive: true, force: true }))
  const sock = path.join(dir, "kvcached.sock")
  const ctl = { applied: null as number | null, failPushes: 0, hellos: 0 }
  const got: Array<KvRecord> = []
  const scope = await Effect.runPromise(Scope.make())
  cleanups.push(() => Effect.runPromise(Scope.close(scope, Exit.void)))
  const server = serve(sock, {
    Hello: () =>
      Effect.sync(() => {
        ctl.hellos++
        return { applied: ctl.applied }
      }),
    Push: (p) =>
      Effect.suspend(() => {
        if (ctl.failPushes > 0) {
          ctl.failPushes--
          return Effect.fail(new UnknownStream(p))
        }
        got.push(...p.records)
        return Effect.succeed({ applied: p.records.at(-1)?.n ?? null })
      })
  })
  await Effect.runPromise(Layer.buildWithScope(server, scope))
  const queue = new KvQueue<QueuedBody>(1 << 20)
  const losses: Array<number> = []
  const fiber = Effect.runFork(
    runLink({
      path: sock,
      queue,
      hello: hello({ node_id: "n1", cluster: "c", model: "m", engine: "vllm" }, { epoch: "e", blockSize: 4, dpSize }),
      resync: resyncOf,
      materialize: (record) => ({ record, dropped: false }),
      backoffMaxMs: 200,
      onConnected: () => undefined,
      onForwarded: () => undefined,
      onStateLost: (n) => void losses.push(n),
      // what each rank's engine stream goes on with when the queue holds none of it
      nextSeqOf: (rank) => BigInt(100 + rank)
    })
  )
  cleanups.push(() => Effect.runPromise(Fiber.interrupt(fiber)))
  const settled = () =>
    pollUntil("everything acknowledged", () => queue.size === 0 && queue.unacked.length === 0, 10_000, 10)
  return { ctl, got, queue, losses, settled }
}

describe("the kvcached link to a receiver back with part of its state", () => {
  it("with 2 DP ranks, having lost only its last acknowledged record: one gap Resync per rank from seq 0, n without a hole", async () => {
    const link = await setup(2)
    // n 0..5, ranks alternating, all acknowledged on the first connection
    for (let seq = 0; seq < 3; seq++) for (const rank of [0, 1]) link.queue.push(batch(rank, seq))
    await link.settled()
    expect(link.got.map((r) => r.n)).toEqual([0, 1, 2, 3, 4, 5])

    // the receiver goes away and comes back having applied up to 4: it lost exactly one record it had acknowledged
    // (n 5, one un-fsynced write)
    link.ctl.applied = 4
    link.ctl.failPushes = 1
    link.queue.push(batch(1, 3))
    await pollUntil("a Hello after the failed Push", () => link.ctl.hellos >= 2, 10_000, 10)
    await link.settled()
    const after = link.got.slice(6)
    expect(link.losses).toEqual([1])
    expect(after.map((r) => [r.n, r.type, r.dp_rank])).toEqual([
      [5, "Resync", 0],
      [6, "Resync", 1],
      [7, "Batch", 1]
    ])
    // from seq 0 to where each rank's stream goes on: rank 1 with its record resent, rank 0 with its reader's next
    expect(after.slice(0, 2)).toMatchObject([
      { type: "Resync", reason: "gap", dp_rank: 0, from_seq: 0, to_seq: 100 },
      { type: "Resync", reason: "gap", dp_rank: 1, from_seq: 0, to_seq: 3 }
    ])
  })

  it("one that applied everything it acknowledged loses nothing: no Resync, no state loss", async () => {
    const link = await setup(2)
    for (let seq = 0; seq < 3; seq++) for (const rank of [0, 1]) link.queue.push(batch(rank, seq))
    await link.settled()
    link.ctl.applied = 5
    link.ctl.failPushes = 1
    link.queue.push(batch(1, 3))
    await pollUntil("a Hello after the failed Push", () => link.ctl.hellos >= 2, 10_000, 10)
    await link.settled()
    expect(link.losses).toEqual([])
    expect(link.got.slice(6).map((r) => [r.n, r.type])).toEqual([[6, "Batch"]])
  })
})
