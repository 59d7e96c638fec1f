// The KV bridge's sequencer (src/layers/kv/rankSequencer.ts) tested directly: what it queues for kvcached is
// the engine's payload as it came (the same bytes, not decoded), and the decode happens when the link takes a
// record to send it, so batches dropped while kvcached is away never become events in the heap.
import { encode } from "@msgpack/msgpack"
import { Effect, Exit } from "effect"
import { describe, expect, it } from "vitest"
import * as zmq from "zeromq"
import { disabledStatus } from "../../src/layers/kv/KvBridge.ts"
import { makeSequencer, type QueuedBody, type RankStream, resyncOf } from "../../src/layers/kv/rankSequencer.ts"
import { fetchReplay } from "../../src/layers/kv/replayFetch.ts"
import { END_OF_REPLAY, seqFrame, splitMessage } from "../../src/services/kv/KvEvents.ts"
import { KvQueue } from "../../src/services/kv/KvQueue.ts"
import { freePort } from "../support/ports.ts"

const topic = new TextEncoder().encode("kv")
const payload = (hash: bigint): Uint8Array =>
  encode([1.5, [{ type: "BlockStored", block_hashes: [hash], parent_block_hash: null, token_ids: [1, 2] }], 0], {
    useBigInt64: true
  })

/** A replay budget that takes everything. */
const anyBytes = { maxBytes: 1 << 30, take: () => true }

const setup = (maxBytes = 1 << 20, replayAt?: string, replayTimeoutMs = 1_000) => {
  const st = { ...disabledStatus("e", ""), enabled: true, disabledReason: undefined }
  const queue = new KvQueue<QueuedBody>(maxBytes)
  const sequencer = makeSequencer(st, queue, "kv", replayTimeoutMs)
  const rank: RankStream = {
    rank: 3,
    endpoint: "tcp://x",
    replayAt,
    expected: undefined,
    holding: undefined
  }
  return { st, queue, sequencer, rank }
}

/** A replay ROUTER on a free port that answers the first request with `answer` (its frames after the identity). */
const replayRouter = async (answer: (send: (frames: Array<Uint8Array | string>) => Promise<void>) => Promise<void>) => {
  const router = new zmq.Router({ linger: 0 })
  const port = await freePort()
  await router.bind(`tcp://127.0.0.1:${port}`)
  void (async () => {
    try {
      const [ident] = await router.receive()
      await answer((frames) => router.send([ident as Buffer, ...frames]))
    } catch {
      // closed
    }
  })()
  return { router, endpoint: `tcp://127.0.0.1:${port}` }
}

describe("rankSequencer", () => {
  it("an engine run that ends is retracted at once (a restart Resync from the next seq), and the next run goes on at 0", () => {
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
    // The new run's first batch is the next one, not a second restart.
    sequencer.onMessage(rank, [topic, seqFrame(0n), payload(9n)])
    expect(queue.take(10, 1 << 20, resyncOf, sequencer.materialize).map((s) => s.record)).toMatchObject([
      { type: "Batch", dp_rank: 3, seq: 0 }
    ])
    expect(st.lastBatchError).toBeUndefined()
    expect(st.gaps).toBe(0)
  })

  it("a new run whose first batches the reader missed (it resubscribes after the restart) is a gap, said lost, not a join", () => {
    const { st, queue, sequencer, rank } = setup()
    for (const seq of [0n, 1n]) sequencer.onMessage(rank, [topic, seqFrame(seq), payload(seq)])
    sequencer.engineGone(rank)
    sequencer.onMessage(rank, [topic, seqFrame(2n), payload(2n)])
    expect(queue.take(10, 1 << 20, resyncOf, sequencer.materialize).map((s) => s.record)).toMatchObject([
      { type: "Batch", seq: 0 },
      { type: "Batch", seq: 1 },
      { type: "Resync", reason: "restart", from_seq: 2, to_seq: 0 },
      { type: "Resync", reason: "gap", from_seq: 0, to_seq: 2 },
      { type: "Batch", seq: 2 }
    ])
    expect(st.gaps).toBe(1)
  })

  it("a rank that restarts alone (no engine exit seen): its old run retracted, its new run's missed first batches a gap", () => {
    const { st, queue, sequencer, rank } = setup()
    for (const seq of [0n, 1n, 2n, 3n]) sequencer.onMessage(rank, [topic, seqFrame(seq), payload(seq)])
    // The seq went down: a new run, of which the reader missed seqs 0 and 1.
    sequencer.onMessage(rank, [topic, seqFrame(2n), payload(2n)])
    expect(queue.take(10, 1 << 20, resyncOf, sequencer.materialize).map((s) => s.record)).toMatchObject([
      { type: "Batch", seq: 0 },
      { type: "Batch", seq: 1 },
      { type: "Batch", seq: 2 },
      { type: "Batch", seq: 3 },
      // The new run began at 0: the stream goes on there (README: `to_seq` is the seq the stream continues with)
      { type: "Resync", reason: "restart", from_seq: 4, to_seq: 0 },
      { type: "Resync", reason: "gap", from_seq: 0, to_seq: 2 },
      { type: "Batch", seq: 2 }
    ])
    expect(st.gaps).toBe(1)
  })

  // A review's journal without a replay endpoint: `9000 R(restart,9001,49) R(gap,0,49) 49 50 51`, whose restart said
  // the stream went on at 49 and then a gap from 0. The same records as after an engine exit the supervisor saw.
  it("a restart whose new run the reader first sees past 0, without replay: restart to 0, then a gap Resync of [0, seq)", () => {
    const { st, queue, sequencer, rank } = setup()
    const r: RankStream = { ...rank, expected: 8998n }
    for (const seq of [8998n, 8999n, 9000n, 49n, 50n, 51n]) sequencer.onMessage(r, [topic, seqFrame(seq), payload(seq)])
    expect(queue.take(20, 1 << 20, resyncOf, sequencer.materialize).map((s) => s.record)).toMatchObject([
      { type: "Batch", seq: 8998 },
      { type: "Batch", seq: 8999 },
      { type: "Batch", seq: 9000 },
      { type: "Resync", dp_rank: 3, reason: "restart", from_seq: 9001, to_seq: 0 },
      { type: "Resync", dp_rank: 3, reason: "gap", from_seq: 0, to_seq: 49 },
      { type: "Batch", seq: 49 },
      { type: "Batch", seq: 50 },
      { type: "Batch", seq: 51 }
    ])
    // Each Resync says where the stream goes on, and the one after it starts there: no record contradicts another.
    expect({ gaps: st.gaps, expected: r.expected }).toEqual({ gaps: 1, expected: 52n })
  })

  // The same review with a replay endpoint: `5004 R(restart,5005,95) 0 1 2 ... 94 95 96`: batches from 0 right
  // after a Resync that said the stream went on at 95.
  it("a restart whose new run the reader first sees past 0, with replay: restart to 0, then the new run from 0", async () => {
    const { router, endpoint } = await replayRouter(async (send) => {
      for (let seq = 0n; seq <= 95n; seq++) await send(["", seqFrame(seq), payload(seq)])
      await send(["", seqFrame(END_OF_REPLAY), ""])
    })
    const { st, queue, sequencer, rank } = setup(1 << 20, endpoint, 10_000)
    const r: RankStream = { ...rank, expected: 5002n }
    try {
      for (const seq of [5002n, 5003n, 5004n, 95n]) sequencer.onMessage(r, [topic, seqFrame(seq), payload(seq)])
      await Effect.runPromise(
        Effect.scoped(
          Effect.andThen(
            sequencer.runQueued,
            Effect.sleep(10).pipe(Effect.repeat({ until: () => r.replay === undefined }), Effect.timeout(10_000))
          )
        )
      )
    } finally {
      router.close()
    }
    sequencer.onMessage(r, [topic, seqFrame(96n), payload(96n)])
    expect(queue.take(200, 1 << 22, resyncOf, sequencer.materialize).map((s) => s.record)).toMatchObject([
      { type: "Batch", seq: 5002 },
      { type: "Batch", seq: 5003 },
      { type: "Batch", seq: 5004 },
      { type: "Resync", dp_rank: 3, reason: "restart", from_seq: 5005, to_seq: 0 },
      ...Array.from({ length: 97 }, (_, seq) => ({ type: "Batch", dp_rank: 3, seq }))
    ])
    expect({ gaps: st.gaps, replayed: st.replayed, expected: r.expected }).toEqual({
      gaps: 1,
      replayed: 1,
      expected: 97n
    })
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
    expect(rank.lastSeq).toBe(1n)

    // Taken with the link's preparation: the good one is a Batch of rank 3, the bad one a Resync of its seq.
    sequencer.onMessage(rank, [topic, seqFrame(2n), good])
    sequencer.onMessage(rank, [topic, seqFrame(3n), bad])
    const sent = queue.take(10, 1 << 20, resyncOf, sequencer.materialize)
    expect(sent.map((s) => s.record)).toMatchObject([
      { type: "Batch", dp_rank: 3, seq: 2, events: [{ type: "BlockStored", block_hashes: ["7"] }] },
      { type: "Resync", dp_rank: 3, reason: "decode", from_seq: 3, to_seq: 4 }
    ])
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

  it("a batch the wire schema refuses (float token id, float block_size) is a decode Resync naming why; a seq past 2^53 is no seq", () => {
    const { st, queue, sequencer, rank } = setup()
    const ev = (tok: number, blockSize = 4) => ({
      type: "BlockStored",
      block_hashes: [1n],
      parent_block_hash: null,
      token_ids: [tok],
      block_size: blockSize
    })
    const msg = (seq: bigint, e: object) => [topic, seqFrame(seq), encode([1.5, [e]], { useBigInt64: true })]
    sequencer.onMessage(rank, msg(0n, ev(1)))
    sequencer.onMessage(rank, msg(1n, ev(1.5)))
    sequencer.onMessage(rank, msg(2n, ev(1, 16.5)))
    sequencer.onMessage(rank, msg(3n, ev(2)))
    const sent = queue.take(10, 1 << 20, resyncOf, sequencer.materialize)
    expect(sent.map((s) => s.record)).toMatchObject([
      { type: "Batch", seq: 0 },
      { type: "Resync", reason: "decode", from_seq: 1, to_seq: 2 },
      { type: "Resync", reason: "decode", from_seq: 2, to_seq: 3 },
      { type: "Batch", seq: 3 }
    ])
    expect(st.lastBatchError).toMatch(/^DP rank 3 seq 2: .*schema.*Expected an integer.*block_size/)
    expect(queue.dropped).toBe(2)
    // A corrupt seq frame is not the stream's position (it would be in every Resync after it).
    expect(splitMessage([topic, seqFrame(1n << 60n), new Uint8Array()]).ok).toBe(false)
    // README: "≥ 2^53 - 1 ... not taken as a seq": the bound itself is refused, the seq below it is one
    expect(splitMessage([topic, seqFrame((1n << 53n) - 1n), new Uint8Array()]).ok).toBe(false)
    expect(splitMessage([topic, seqFrame((1n << 53n) - 2n), new Uint8Array()]).ok).toBe(true)
    sequencer.onMessage(rank, [topic, seqFrame(1n << 60n), payload(1n)])
    sequencer.onMessage(rank, [topic, seqFrame(5n), payload(1n)])
    expect(queue.take(10, 1 << 20, resyncOf, sequencer.materialize).map((s) => s.record)).toMatchObject([
      { type: "Resync", reason: "gap", from_seq: 4, to_seq: 5 },
      { type: "Batch", seq: 5 }
    ])
  })

  // README: "Unknown event types and keys are skipped and counted (`unknownEvents`, `unknownKeys` in `/status`)"
  it("an unknown event type and an unknown key reach the status counts as the batch is sent", () => {
    const { st, queue, sequencer, rank } = setup()
    const known = { type: "BlockStored", block_hashes: [1n], parent_block_hash: null, token_ids: [1], future_key: 1 }
    const events = [{ type: "FutureEvent", x: 1 }, known, { type: "AllBlocksCleared" }]
    sequencer.onMessage(rank, [topic, seqFrame(0n), encode([1.5, events, 0], { useBigInt64: true })])
    expect(queue.take(10, 1 << 20, resyncOf, sequencer.materialize).map((s) => s.record)).toMatchObject([
      { type: "Batch", seq: 0 }
    ])
    expect({ unknownEvents: st.unknownEvents, unknownKeys: st.unknownKeys }).toEqual({
      unknownEvents: 1,
      unknownKeys: 1
    })
  })

  it("batches held during a replay count against the byte bound: past it the replay is given up (a gap Resync) and they go on", async () => {
    const one = 96 + payload(1n).byteLength
    // A replay endpoint where nothing listens, and a deadline far away: only the bound can end the wait.
    const { st, queue, sequencer, rank } = setup(8 * one, `tcp://127.0.0.1:${await freePort()}`, 60_000)
    sequencer.onMessage(rank, [topic, seqFrame(0n), payload(0n)])
    queue.take(10, 1 << 20, resyncOf)
    sequencer.onMessage(rank, [topic, seqFrame(2n), payload(2n)]) // seq 1 lost: a replay starts, 2 is held
    for (let s = 3n; s < 9n; s++) sequencer.onMessage(rank, [topic, seqFrame(s), payload(s)])
    // Held, and shown: 7 batches (with the unacknowledged seq 0, 8 of the bound).
    expect(sequencer.held).toEqual({ batches: 7, bytes: 7 * one })
    expect(queue.take(10, 1 << 20, resyncOf)).toEqual([])
    sequencer.onMessage(rank, [topic, seqFrame(9n), payload(9n)])
    expect(sequencer.held).toEqual({ batches: 0, bytes: 0 })
    // They went on to the queue under its own bound: with seq 0 still unacknowledged, the gap's Resync and seq 2
    // were the oldest unsent, so one overflow Resync covers both; nothing is waiting on the replay any more.
    expect(queue.take(20, 1 << 20, resyncOf, sequencer.materialize).map((s) => s.record)).toMatchObject([
      { type: "Resync", reason: "overflow", from_seq: 1, to_seq: 3 },
      ...[3, 4, 5, 6, 7, 8, 9].map((seq) => ({ type: "Batch", seq }))
    ])
    expect(st.lastBatchError).toMatch(/held during the replay passed \d+ bytes \(kv.max_queue_bytes\)/)
    // The replay fiber, started late, sees it was given up and does nothing.
    await Effect.runPromise(Effect.scoped(sequencer.runQueued))
    expect(rank.holding).toBeUndefined()
  })

  it("a replay given up while its fetch runs is settled once: the fetch, stopped, finds it settled", async () => {
    const one = 96 + payload(1n).byteLength
    // Nothing listens at the replay endpoint: the fetch runs (and waits) until it is stopped.
    const { st, queue, sequencer, rank } = setup(4 * one, `tcp://127.0.0.1:${await freePort()}`, 60_000)
    sequencer.onMessage(rank, [topic, seqFrame(0n), payload(0n)])
    queue.ack(queue.take(10, 1 << 20, resyncOf)[0]!.n)
    sequencer.onMessage(rank, [topic, seqFrame(2n), payload(2n)]) // seq 1 lost: a replay starts, 2 is held
    const idle = rank.replay!.cancel
    await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          yield* sequencer.runQueued
          // Its fetch is running once it can be stopped.
          yield* Effect.sleep(10).pipe(
            Effect.repeat({ until: () => rank.replay?.cancel !== idle }),
            Effect.timeout(10_000)
          )
          for (let s = 3n; s < 7n; s++) sequencer.onMessage(rank, [topic, seqFrame(s), payload(s)])
        })
      )
    )
    // Seq 6 did not fit beside the 4 held: they went on to the queue, whose bound then dropped the oldest (the
    // gap's Resync and seq 2). Before, stopping the fetch first settled the replay from its fiber, as a failed one.
    expect(queue.take(20, 1 << 20, resyncOf, sequencer.materialize).map((s) => s.record)).toMatchObject([
      { type: "Resync", reason: "overflow", from_seq: 1, to_seq: 3 },
      ...[3, 4, 5, 6].map((seq) => ({ type: "Batch", seq }))
    ])
    expect(st.lastBatchError).toMatch(/held during the replay passed \d+ bytes \(kv.max_queue_bytes\)/)
    expect({ held: sequencer.held, expected: rank.expected }).toEqual({ held: { batches: 0, bytes: 0 }, expected: 7n })
  })

  it("a replay gives its room up to another rank's live batches: a push that would drop while it holds replies ends it instead", async () => {
    const one = 96 + payload(1n).byteLength
    // Seqs 1 to 7, then nothing more (no end marker): with the batch that started it, the whole bound is held.
    const { router, endpoint } = await replayRouter(async (send) => {
      for (let seq = 1n; seq <= 7n; seq++) await send(["", seqFrame(seq), payload(seq)])
    })
    const { st, queue, sequencer, rank } = setup(8 * one, endpoint, 60_000)
    const other: RankStream = { ...rank, rank: 4, replayAt: undefined }
    try {
      sequencer.onMessage(rank, [topic, seqFrame(0n), payload(0n)])
      queue.ack(queue.take(10, 1 << 20, resyncOf)[0]!.n)
      sequencer.onMessage(rank, [topic, seqFrame(20n), payload(20n)]) // seqs 1 to 19 lost: a replay starts
      await Effect.runPromise(
        Effect.scoped(
          Effect.gen(function* () {
            yield* sequencer.runQueued
            yield* Effect.sleep(10).pipe(
              Effect.repeat({ until: () => sequencer.held.bytes === 8 * one }),
              Effect.timeout(10_000)
            )
            expect(sequencer.held).toEqual({ batches: 8, bytes: 8 * one })
            // Another rank's batches and its engine's end, while the replay holds the whole bound and still runs.
            sequencer.onMessage(other, [topic, seqFrame(0n), payload(100n)])
            sequencer.onMessage(other, [topic, seqFrame(1n), payload(101n)])
            sequencer.engineGone(other)
          })
        )
      )
    } finally {
      router.close()
    }
    // None of rank 4's records was dropped (before: each went at once, an overflow Resync for all of them); the
    // replay was given up instead: its range a gap Resync, its held batch queued ahead of rank 4's.
    expect(queue.dropped).toBe(0)
    expect(queue.take(20, 1 << 20, resyncOf, sequencer.materialize).map((s) => s.record)).toMatchObject([
      { type: "Resync", reason: "gap", dp_rank: 3, from_seq: 1, to_seq: 20 },
      { type: "Batch", dp_rank: 3, seq: 20 },
      { type: "Batch", dp_rank: 4, seq: 0 },
      { type: "Batch", dp_rank: 4, seq: 1 },
      { type: "Resync", reason: "restart", dp_rank: 4, from_seq: 2, to_seq: 0 }
    ])
    expect(st.lastBatchError).toMatch(/another rank's batch with what the replay holds passed \d+ bytes/)
    expect({ held: sequencer.held, holding: rank.holding, expected: rank.expected }).toEqual({
      held: { batches: 0, bytes: 0 },
      holding: undefined,
      expected: 21n
    })
  })

  it("a replay that fails lets the held batches go at once (their gaps resynced, not replayed again); an engine end during it follows them", async () => {
    const { queue, sequencer, rank } = setup(1 << 20, `tcp://127.0.0.1:${await freePort()}`, 100)
    for (const seq of [0n, 2n, 4n]) sequencer.onMessage(rank, [topic, seqFrame(seq), payload(seq)])
    sequencer.engineGone(rank)
    // The replay (nobody answers) fails at its 100 ms deadline; then everything held is queued in the same step.
    await Effect.runPromise(
      Effect.scoped(
        Effect.andThen(
          sequencer.runQueued,
          Effect.sleep(20).pipe(Effect.repeat({ until: () => queue.size > 1 }), Effect.timeout(10_000))
        )
      )
    )
    expect(queue.take(10, 1 << 20, resyncOf, sequencer.materialize).map((s) => s.record)).toMatchObject([
      { type: "Batch", seq: 0 },
      { type: "Resync", reason: "gap", from_seq: 1, to_seq: 2 },
      { type: "Batch", seq: 2 },
      { type: "Resync", reason: "gap", from_seq: 3, to_seq: 4 },
      { type: "Batch", seq: 4 },
      { type: "Resync", reason: "restart", from_seq: 5, to_seq: 0 }
    ])
    expect({ expected: rank.expected, holding: rank.holding, held: sequencer.held }).toEqual({
      expected: 0n,
      holding: undefined,
      held: { batches: 0, bytes: 0 }
    })
  })

  it("a replay that answers without the seqs asked (its buffer no longer holds them) is a gap Resync said in lastBatchError", async () => {
    // Only seq 2 of [1, 4), then the end marker.
    const { router, endpoint } = await replayRouter(async (send) => {
      await send(["", seqFrame(2n), payload(2n)])
      await send(["", seqFrame(END_OF_REPLAY), ""])
    })
    const { st, queue, sequencer, rank } = setup(1 << 20, endpoint, 10_000)
    try {
      sequencer.onMessage(rank, [topic, seqFrame(0n), payload(0n)])
      sequencer.onMessage(rank, [topic, seqFrame(4n), payload(4n)]) // seqs 1 to 3 missed: a replay starts
      await Effect.runPromise(
        Effect.scoped(
          Effect.andThen(
            sequencer.runQueued,
            Effect.sleep(10).pipe(Effect.repeat({ until: () => queue.size > 2 }), Effect.timeout(10_000))
          )
        )
      )
    } finally {
      router.close()
    }
    expect(queue.take(10, 1 << 20, resyncOf, sequencer.materialize).map((s) => s.record)).toMatchObject([
      { type: "Batch", seq: 0 },
      { type: "Resync", reason: "gap", from_seq: 1, to_seq: 4 },
      { type: "Batch", seq: 4 }
    ])
    expect({ gaps: st.gaps, replayed: st.replayed }).toEqual({ gaps: 1, replayed: 0 })
    expect(st.lastBatchError).toBe("DP rank 3: the replay of seqs [1, 4) answered 1 of them")
  })

  it("a replay has one deadline for the whole of it: a ROUTER that trickles replies forever cannot hold a rank", async () => {
    let open = true
    // One batch every 50 ms, each well within the receive timeout, and never the end marker.
    const { router, endpoint } = await replayRouter(async (send) => {
      for (let seq = 0n; open; seq++) {
        await send(["", seqFrame(seq), payload(seq)])
        await new Promise((r) => setTimeout(r, 50))
      }
    })
    try {
      const startedAt = performance.now()
      const exit = await Effect.runPromise(
        Effect.exit(fetchReplay(endpoint, "kv", { from: 0n, until: 1n << 40n }, 300, anyBytes))
      )
      const tookMs = performance.now() - startedAt
      expect(Exit.isFailure(exit) && String(exit.cause)).toMatch(/no complete replay within 300 ms/)
      // README: "Live batches of that rank are held meanwhile: the whole replay has one 2 s deadline": it ends at
      // the deadline (300 ms here), not at some multiple of it (a loaded host's slack allowed).
      expect(tookMs).toBeGreaterThanOrEqual(290)
      expect(tookMs).toBeLessThan(1_500)
    } finally {
      open = false
      router.close()
    }
  })
})
