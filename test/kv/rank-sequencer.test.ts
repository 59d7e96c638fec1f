// The KV bridge's sequencer (src/layers/kv/rankSequencer.ts) tested directly: what it queues for kvcached is
// the engine's payload as it came (the same bytes, not decoded), and the decode happens when the link takes a
// record to send it, so batches dropped while kvcached is away never become events in the heap.
import { encode } from "@msgpack/msgpack"
import { describe, expect, it } from "vitest"
import { disabledStatus } from "../../src/layers/kv/KvBridge.ts"
import { KvQueue } from "../../src/layers/kv/queue.ts"
import { makeSequencer, type QueuedBody, type RankStream, resyncOf } from "../../src/layers/kv/rankSequencer.ts"
import { seqFrame } from "../../src/services/kv/KvEvents.ts"

const topic = new TextEncoder().encode("kv")
const payload = (hash: bigint): Uint8Array =>
  encode([1.5, [{ type: "BlockStored", block_hashes: [hash], parent_block_hash: null, token_ids: [1, 2] }], 0], {
    useBigInt64: true
  })

const setup = (maxBytes = 1 << 20) => {
  const st = { ...disabledStatus("e", ""), enabled: true, disabledReason: undefined }
  const queue = new KvQueue<QueuedBody>(maxBytes)
  const sequencer = makeSequencer(st, queue, "kv", 1_000)
  const rank: RankStream = {
    rank: 3,
    endpoint: "tcp://x",
    replayAt: undefined,
    expected: undefined,
    holding: undefined
  }
  return { st, queue, sequencer, rank }
}

describe("rankSequencer", () => {
  it("an engine run that ends is retracted at once (a restart Resync from the next seq), and the next run joins at 0", () => {
    const { st, queue, sequencer, rank } = setup()
    const idle: RankStream = { ...rank, rank: 4 }
    for (const seq of [0n, 1n, 2n]) sequencer.onMessage(rank, [topic, seqFrame(seq), payload(seq)])
    queue.take(10, 1 << 20, resyncOf)
    sequencer.engineGone(rank)
    sequencer.engineGone(idle) // saw nothing: nothing to retract
    sequencer.engineGone(rank) // already retracted: once is enough
    expect(queue.take(10, 1 << 20, resyncOf).map((s) => s.record)).toMatchObject([
      { type: "Resync", dp_rank: 3, reason: "restart", from_seq: 3, to_seq: 0 }
    ])
    // The new run's first batch is a join, not a second restart.
    sequencer.onMessage(rank, [topic, seqFrame(0n), payload(9n)])
    expect(queue.take(10, 1 << 20, resyncOf, sequencer.materialize).map((s) => s.record)).toMatchObject([
      { type: "Batch", dp_rank: 3, seq: 0 }
    ])
    expect(st.resyncs).toBe(1)
  })

  it("queues the payload bytes as they came, and decodes a batch only when it is taken to be sent", () => {
    const { st, queue, sequencer, rank } = setup()
    const good = payload(7n)
    const bad = new Uint8Array([0xc1]) // never a valid msgpack byte
    sequencer.onMessage(rank, [topic, seqFrame(0n), good])
    sequencer.onMessage(rank, [topic, seqFrame(1n), bad])
    // Nothing decoded yet: the queue holds the very buffers the socket gave, counted at their size.
    const raw = queue.take(10, 1 << 20, resyncOf)
    expect(raw.map((s) => s.record.type)).toEqual(["Raw", "Raw"])
    expect(raw.map((s) => (s.record.type === "Raw" ? s.record.raw.payload : undefined))).toEqual([good, bad])
    expect((raw[0]!.record as { raw: { payload: Uint8Array } }).raw.payload).toBe(good)
    expect(raw[0]!.bytes).toBe(96 + good.byteLength)
    expect({ resyncs: st.resyncs, lastSeq: st.lastSeq }).toEqual({ resyncs: 0, lastSeq: "1" })

    // Taken with the link's preparation: the good one is a Batch of rank 3, the bad one a Resync of its seq.
    sequencer.onMessage(rank, [topic, seqFrame(2n), good])
    sequencer.onMessage(rank, [topic, seqFrame(3n), bad])
    const sent = queue.take(10, 1 << 20, resyncOf, sequencer.materialize)
    expect(sent.map((s) => s.record)).toMatchObject([
      { type: "Batch", dp_rank: 3, seq: 2, events: [{ type: "BlockStored", block_hashes: ["7"] }] },
      { type: "Resync", dp_rank: 3, reason: "decode", from_seq: 3, to_seq: 4 }
    ])
    expect(st.resyncs).toBe(1)
    // History of what could not be used, not a current fault: lastError stays for what is down.
    expect(st.lastBatchError).toMatch(/^DP rank 3 seq 3: undecodable KV event batch: /)
    expect(st.lastError).toBeUndefined()
  })

  it("an undecodable batch counts once, as dropped: not also as forwarded when kvcached acknowledges its Resync", () => {
    const { queue, sequencer, rank } = setup()
    sequencer.onMessage(rank, [topic, seqFrame(0n), payload(1n)])
    sequencer.onMessage(rank, [topic, seqFrame(1n), new Uint8Array([0xc1])])
    expect({ batches: queue.batches, dropped: queue.dropped }).toEqual({ batches: 2, dropped: 0 })
    const sent = queue.take(10, 1 << 20, resyncOf, sequencer.materialize)
    expect(sent.map((s) => s.record.type)).toEqual(["Batch", "Resync"])
    // Lost when it was taken: from then on it is a dropped batch, and what waits for kvcached is the good one.
    expect({ batches: queue.batches, dropped: queue.dropped }).toEqual({ batches: 1, dropped: 1 })
    // kvcached applies both records: one batch forwarded, the other stays dropped.
    expect(queue.ack(sent[1]!.n)).toBe(1)
    expect({ batches: queue.batches, bytes: queue.bytes, dropped: queue.dropped }).toEqual({
      batches: 0,
      bytes: 0,
      dropped: 1
    })
  })

  it("drops raw batches past the byte bound without decoding them, and says so with an overflow Resync", () => {
    const one = 96 + payload(1n).byteLength
    const { queue, sequencer, rank } = setup(3 * one)
    for (let s = 0n; s < 10n; s++) sequencer.onMessage(rank, [topic, seqFrame(s), payload(s)])
    expect({ size: queue.size, bytes: queue.bytes, dropped: queue.dropped }).toEqual({
      size: 3,
      bytes: 3 * one,
      dropped: 7
    })
    const sent = queue.take(10, 1 << 20, resyncOf, sequencer.materialize)
    expect(sent.map((s) => s.record.type)).toEqual(["Resync", "Batch", "Batch", "Batch"])
    expect(sent[0]!.record).toMatchObject({ reason: "overflow", dp_rank: 3, from_seq: 0, to_seq: 7 })
  })
})
