// The KV bridge's queue (src/services/kv/KvQueue.ts) and the receiver's state (src/services/kv/KvcachedReceiver.ts),
// tested directly: bytes accounted through push/take/ack, the byte bound dropping the oldest unsent records
// and an overflow Resync per DP rank saying which, nothing referenced once acknowledged or dropped, and
// the receiver applying each link seq exactly once.
import { Effect, Schema } from "effect"
import { describe, expect, it } from "vitest"
import { heldAtStop } from "../../src/layers/kv/KvBridge.ts"
import { ReceiverState } from "../../src/services/kv/KvcachedReceiver.ts"
import { KvRecord } from "../../src/services/kv/KvcachedRpc.ts"
import { KvQueue } from "../../src/services/kv/KvQueue.ts"
import type { Resync } from "../../src/services/kv/KvWire.ts"
import type { QueuedRecord } from "../../src/services/kv/QueueRecords.ts"

type Rec = { readonly tag: string }

const batch = (seq: bigint, bytes = 100, dpRank = 0): QueuedRecord<Rec> => ({
  record: { tag: `batch-${dpRank}-${seq}` },
  batch: true,
  dpRank,
  fromSeq: seq,
  nextSeq: seq + 1n,
  bytes
})
const resync = (r: Resync): QueuedRecord<Rec> => ({
  record: { tag: `resync-${r.reason}-${r.dpRank}-${r.fromSeq}-${r.toSeq}` },
  batch: false,
  dpRank: r.dpRank,
  fromSeq: r.fromSeq,
  nextSeq: r.toSeq,
  bytes: 10
})
const tags = (xs: ReadonlyArray<{ readonly record: Rec }>) => xs.map((x) => x.record.tag)
/** Everything the queue's own fields still reference (arrays and objects; records included), as text. */
const held = (q: KvQueue<Rec>) => JSON.stringify(q, (_k, v) => (typeof v === "bigint" ? v.toString() : v))

describe("KvQueue", () => {
  it("accounts bytes through push, take and ack, and numbers records without holes", () => {
    const q = new KvQueue<Rec>(1_000)
    q.push(batch(1n, 100))
    q.push(batch(2n, 150))
    q.push(batch(3n, 50))
    expect({ bytes: q.bytes, batches: q.batches, size: q.size }).toEqual({ bytes: 300, batches: 3, size: 3 })
    const first = q.take(2, 1_000, resync)
    expect(first.map((s) => s.n)).toEqual([0, 1])
    // Taken but not acknowledged: still held and counted.
    expect({ bytes: q.bytes, batches: q.batches, size: q.size }).toEqual({ bytes: 300, batches: 3, size: 1 })
    expect(tags(q.unacked)).toEqual(["batch-0-1", "batch-0-2"])
    expect(q.ack(0)).toBe(1)
    expect(q.bytes).toBe(200)
    expect(tags(q.take(10, 1_000, resync))).toEqual(["batch-0-3"])
    expect(q.unacked.map((s) => s.n)).toEqual([1, 2])
    expect(q.ack(2)).toBe(2)
    expect({ bytes: q.bytes, batches: q.batches, size: q.size, unacked: q.unacked.length }).toEqual({
      bytes: 0,
      batches: 0,
      size: 0,
      unacked: 0
    })
    expect(held(q)).not.toMatch(/batch-/)
  })

  it("a chunk stops at its byte budget but always carries one record", () => {
    const q = new KvQueue<Rec>(10_000)
    for (let s = 0n; s < 4n; s++) q.push(batch(s, 400))
    expect(tags(q.take(10, 900, resync))).toEqual(["batch-0-0", "batch-0-1"])
    q.push(batch(9n, 5_000))
    q.ack(1)
    expect(tags(q.take(10, 900, resync))).toEqual(["batch-0-2", "batch-0-3"])
    q.ack(3)
    expect(tags(q.take(10, 900, resync))).toEqual(["batch-0-9"])
  })

  it("past the byte bound drops the oldest unsent records, never the unacknowledged, and says so per rank", () => {
    const q = new KvQueue<Rec>(500)
    q.push(batch(1n))
    q.push(batch(2n))
    expect(tags(q.take(10, 10_000, resync))).toEqual(["batch-0-1", "batch-0-2"])
    q.push(batch(3n))
    q.push(batch(7n, 100, 1))
    q.push(batch(4n))
    expect(q.push(batch(5n))).toBe(true) // 600 bytes: batch 3 goes (unacked 1 and 2 stay)
    expect(q.push(batch(8n, 100, 1))).toBe(true) // rank 1's 7 goes
    expect(q.push(batch(6n))).toBe(true) // 4 goes
    expect(q.dropped).toBe(3)
    expect(q.bytes).toBe(500)
    expect(held(q)).not.toMatch(/batch-0-3|batch-1-7|batch-0-4/)
    // Resent first after a reconnect: the unacknowledged ones, as they were.
    expect(tags(q.unacked)).toEqual(["batch-0-1", "batch-0-2"])
    q.ack(1)
    const next = q.take(10, 10_000, resync)
    expect(tags(next)).toEqual([
      "resync-overflow-0-3-5",
      "resync-overflow-1-7-8",
      "batch-0-5",
      "batch-1-8",
      "batch-0-6"
    ])
    expect(next.map((s) => s.n)).toEqual([2, 3, 4, 5, 6])
    expect(q.take(10, 10_000, resync)).toEqual([])
    q.ack(6)
    expect({ bytes: q.bytes, batches: q.batches }).toEqual({ bytes: 0, batches: 0 })
  })

  it("bytes held outside it (a replay's batches and replies) share the bound: pushes drop the oldest to keep the sum within it", () => {
    const q = new KvQueue<Rec>(1_000)
    for (let s = 0n; s < 5n; s++) q.push(batch(s, 100))
    q.outside = 600
    expect([q.fits(0), q.fits(1)]).toEqual([false, false])
    q.push(batch(5n, 100))
    // 600 held outside: the queue keeps 400 bytes, the newest.
    expect({ bytes: q.bytes, size: q.size, dropped: q.dropped }).toEqual({ bytes: 400, size: 4, dropped: 2 })
    expect(q.fits(0)).toBe(true)
    q.outside = 0
    expect(q.fits(600)).toBe(true)
    expect(tags(q.take(10, 10_000, resync))).toEqual([
      "resync-overflow-0-0-2",
      ...[2, 3, 4, 5].map((s) => `batch-0-${s}`)
    ])
  })

  it("a push that would drop while bytes are held outside calls reclaim first, once: what it pushes goes in ahead, and the drop comes after", () => {
    const q = new KvQueue<Rec>(1_000)
    const calls: Array<number> = []
    q.reclaim = () => {
      // The owner lets go of what it held (here still counted while it pushes, as a second replay's would be):
      // these pushes only append, neither dropping nor calling reclaim again.
      for (let s = 10n; s < 13n; s++) q.push(batch(s, 200, 1))
      calls.push(q.dropped)
      q.outside = 0
    }
    for (let s = 0n; s < 4n; s++) q.push(batch(s, 100))
    q.outside = 500
    q.push(batch(4n, 100)) // fits exactly: nothing to reclaim
    expect(calls).toEqual([])
    q.push(batch(5n, 100))
    expect(calls).toEqual([0])
    // 1,200 bytes once everything is in: the oldest 200 go (seqs 0 and 1), the held batches ahead of seq 5.
    expect({ bytes: q.bytes, outside: q.outside, dropped: q.dropped }).toEqual({ bytes: 1_000, outside: 0, dropped: 2 })
    expect(tags(q.take(20, 10_000, resync))).toEqual([
      "resync-overflow-0-0-2",
      ...[2, 3, 4].map((s) => `batch-0-${s}`),
      ...[10, 11, 12].map((s) => `batch-1-${s}`),
      "batch-0-5"
    ])
  })

  it("counts the Resyncs kvcached acknowledged, not those taken and unacknowledged, nor those dropped unsent", () => {
    const q = new KvQueue<Rec>(300)
    q.push(resync({ reason: "gap", dpRank: 0, fromSeq: 0n, toSeq: 1n }))
    for (let s = 1n; s < 5n; s++) q.push(batch(s, 100))
    // The gap Resync and seq 1 were dropped unsent; one overflow Resync says so.
    const sent = q.take(10, 10_000, resync)
    expect(tags(sent)).toEqual(["resync-overflow-0-0-2", "batch-0-2", "batch-0-3", "batch-0-4"])
    expect(q.resyncs).toBe(0)
    q.ack(sent[1]!.n)
    expect(q.resyncs).toBe(1)
  })

  it("holds nothing of a long run it dropped: memory follows the bound, not the history", () => {
    const q = new KvQueue<Rec>(100 * 100)
    for (let s = 0n; s < 50_000n; s++) q.push(batch(s))
    expect(q.size).toBe(100)
    expect(q.dropped).toBe(49_900)
    // Only the 100 survivors are referenced (no dead prefix kept alive by the backing array).
    expect(held(q).match(/batch-/g)?.length).toBe(100)
    const out = q.take(1_000, 1e9, resync)
    expect(tags(out).slice(0, 2)).toEqual(["resync-overflow-0-0-49900", "batch-0-49900"])
    q.ack(out.length - 1)
    expect(held(q)).not.toMatch(/batch-|resync-/)
  })

  it("wakes the writer at the next push, or at once when work waits", () => {
    const q = new KvQueue<Rec>(1_000)
    let woke = 0
    q.onPush(() => woke++)
    expect(woke).toBe(0)
    q.push(batch(1n))
    expect(woke).toBe(1)
    q.push(batch(2n))
    expect(woke).toBe(1)
    q.onPush(() => woke++)
    expect(woke).toBe(2)
  })

  it("one record larger than the whole bound is the only one dropped: an overflow Resync in its place, the rest kept", () => {
    const q = new KvQueue<Rec>(1_000)
    for (let i = 0n; i < 5n; i++) q.push(batch(i, 100, Number(i % 2n)))
    expect(q.push(batch(5n, 5_000, 1))).toBe(true)
    q.push(batch(6n, 5_000, 1)) // the next one of the same rank too: one Resync covers both
    q.push(batch(7n, 100, 1))
    expect({ batches: q.batches, dropped: q.dropped }).toEqual({ batches: 6, dropped: 2 })
    expect(tags(q.take(100, 1 << 20, resync))).toEqual([
      "batch-0-0",
      "batch-1-1",
      "batch-0-2",
      "batch-1-3",
      "batch-0-4",
      "resync-overflow-1-5-7",
      "batch-1-7"
    ])
    expect(q.ack(6)).toBe(6)
    expect({ bytes: q.bytes, batches: q.batches }).toEqual({ bytes: 0, batches: 0 })
  })

  // README: "a single batch larger than the whole bound is the only one dropped": one of exactly the bound fits
  it("a record of exactly the whole bound is kept, the ones before it dropped to make room", () => {
    const q = new KvQueue<Rec>(1_000)
    q.push(batch(0n, 100))
    expect(q.push(batch(1n, 1_000))).toBe(true)
    expect({ batches: q.batches, dropped: q.dropped, bytes: q.bytes }).toEqual({ batches: 1, dropped: 1, bytes: 1_000 })
    expect(tags(q.take(100, 1 << 20, resync))).toEqual(["resync-overflow-0-0-1", "batch-0-1"])
  })

  it("rewriteUnacked replaces or removes unsent records and numbers what remains again, without holes", () => {
    const q = new KvQueue<Rec>(1_000)
    for (let i = 0n; i < 3n; i++) q.push(batch(i, 100))
    q.take(1, 1_000, resync)
    q.ack(0)
    q.take(10, 1_000, resync)
    q.rewriteUnacked((s) =>
      s.fromSeq === 1n ? undefined : { ...s, record: { tag: `resync-decode-${s.fromSeq}` }, batch: false }
    )
    expect(q.unacked.map((s) => [s.n, s.record.tag])).toEqual([[1, "resync-decode-2"]])
    expect({ bytes: q.bytes, batches: q.batches, dropped: q.dropped }).toEqual({ bytes: 100, batches: 0, dropped: 2 })
    q.push(batch(3n, 100))
    expect(q.take(10, 1_000, resync).map((s) => s.n)).toEqual([2])
  })
})

describe("nextSeqOf: where a rank's stream goes on in what the queue holds", () => {
  it("the unacknowledged first, then a dropped range (its overflow Resync leads), then the pending", () => {
    const q = new KvQueue<Rec>(250)
    expect(q.nextSeqOf(0)).toBeUndefined()
    for (const seq of [0n, 1n, 2n]) q.push(batch(seq))
    // 300 bytes past 250: seq 0 dropped, an overflow Resync [0, 1) owed before seq 1
    expect(q.dropped).toBe(1)
    expect(q.nextSeqOf(0)).toBe(0n)
    expect(heldAtStop(q)).toEqual({ batches: 2, resyncs: 1 })
    q.take(10, 10_000, resync)
    expect(q.nextSeqOf(0)).toBe(0n)
    expect(q.nextSeqOf(1)).toBeUndefined()
  })
})

describe("heldAtStop: what the bridge says it drops as it stops", () => {
  it("a restart Resync alone (the engine stopped while kvcached was away) is said, as batches are", () => {
    const q = new KvQueue<Rec>(10_000)
    expect(heldAtStop(q)).toBeUndefined()
    q.push(resync({ reason: "restart", dpRank: 0, fromSeq: 59n, toSeq: 0n }))
    expect(heldAtStop(q)).toEqual({ batches: 0, resyncs: 1 })
    q.push(batch(0n))
    q.take(2, 1_000, resync)
    // sent, not acknowledged: still held
    expect(heldAtStop(q)).toEqual({ batches: 1, resyncs: 1 })
    q.ack(1)
    expect(heldAtStop(q)).toBeUndefined()
  })
})

describe("ReceiverState", () => {
  const hello = (epoch: string, version = 2) => ({
    version,
    node_id: "n1",
    cluster: "c",
    model: "m",
    engine: "vllm",
    block_size: 16,
    dp_size: 1,
    epoch
  })
  const rec = (n: number, seq = n): KvRecord => ({ type: "Batch", n, dp_rank: 0, seq, ts: 1, events: [] })

  it("applies each link seq once, skips resends, starts over on a new epoch", async () => {
    const applied: Array<string> = []
    const fresh: Array<boolean> = []
    const st = new ReceiverState({
      onHello: (_h, f) => void fresh.push(f),
      onRecord: (_node, epoch, r) => void applied.push(`${epoch}:${r.n}`)
    })
    const run = <A, E>(e: Effect.Effect<A, E>) => Effect.runPromise(Effect.result(e))
    expect(await run(st.push({ node_id: "n1", epoch: "e1", records: [rec(0)] }))).toMatchObject({
      _tag: "Failure",
      failure: { _tag: "UnknownStream" }
    })
    expect(await run(st.hello(hello("e1", 1)))).toMatchObject({ failure: { _tag: "UnsupportedVersion" } })
    expect(await run(st.hello(hello("e1")))).toMatchObject({ success: { applied: null } })
    expect(await run(st.push({ node_id: "n1", epoch: "e1", records: [rec(0), rec(1)] }))).toMatchObject({
      success: { applied: 1 }
    })
    // A reconnect: Hello says what is applied; the resend overlaps it.
    expect(await run(st.hello(hello("e1")))).toMatchObject({ success: { applied: 1 } })
    expect(await run(st.push({ node_id: "n1", epoch: "e1", records: [rec(1), rec(2)] }))).toMatchObject({
      success: { applied: 2 }
    })
    expect(st.duplicates).toBe(1)
    expect(await run(st.hello(hello("e2")))).toMatchObject({ success: { applied: null } })
    await run(st.push({ node_id: "n1", epoch: "e2", records: [rec(0)] }))
    expect(applied).toEqual(["e1:0", "e1:1", "e1:2", "e2:0"])
    expect(fresh).toEqual([true, false, true])
    // a Push of the epoch the new Hello superseded (a stale connection's) is refused, not applied to the new stream
    expect(await run(st.push({ node_id: "n1", epoch: "e1", records: [rec(3)] }))).toMatchObject({
      failure: { _tag: "UnknownStream", epoch: "e1" }
    })
    expect(applied).toEqual(["e1:0", "e1:1", "e1:2", "e2:0"])
  })

  it("counts a record whose n skips ahead (a hole) and applies it anyway", async () => {
    const applied: Array<number> = []
    const st = new ReceiverState({ onHello: () => {}, onRecord: (_n, _e, r) => void applied.push(r.n) })
    await Effect.runPromise(st.hello(hello("e1")))
    await Effect.runPromise(st.push({ node_id: "n1", epoch: "e1", records: [rec(0), rec(2), rec(3)] }))
    expect([st.holes, applied]).toEqual([1, [0, 2, 3]])
  })

  it("resumes from what a journal says it applied", async () => {
    const applied: Array<number> = []
    const st = new ReceiverState({ onHello: () => {}, onRecord: (_n, _e, r) => void applied.push(r.n) }, [
      { node_id: "n1", epoch: "e1", applied: 4 }
    ])
    expect(await Effect.runPromise(st.hello(hello("e1")))).toEqual({ applied: 4 })
    await Effect.runPromise(st.push({ node_id: "n1", epoch: "e1", records: [rec(3), rec(4), rec(5)] }))
    expect(applied).toEqual([5])
  })

  it("the contract's records carry a link seq counted from 0: a negative or fractional n is refused", () => {
    const decode = Schema.decodeUnknownSync(KvRecord)
    const resync = { type: "Resync", dp_rank: 0, reason: "gap", from_seq: 0, to_seq: 1 }
    expect(decode({ ...rec(0), n: 0 })).toMatchObject({ n: 0 })
    expect(decode({ ...resync, n: 0 })).toMatchObject({ n: 0 })
    for (const n of [-1, 0.5]) {
      expect(() => decode({ ...rec(0), n })).toThrow()
      expect(() => decode({ ...resync, n })).toThrow()
    }
  })
})
