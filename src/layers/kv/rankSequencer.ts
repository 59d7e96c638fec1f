/**
 * What the KV bridge does with each message, per data-parallel rank: split it (topic, seq, payload), check its
 * seq against the one the rank owes next, and queue it for kvcached with its payload still undecoded: it is
 * decoded when the link sends it (`materialize`), so what the queue holds is the engine's bytes, and a batch
 * dropped while kvcached is away is never decoded at all. A gap (or, on joining, batches from before we
 * listened) starts a replay through the rank's replay ROUTER when one is configured, while later batches
 * of that rank are held; a replay that covers the range is forwarded in order, else a Resync says the
 * range is lost. Batches are tagged with the rank of the endpoint they came from, so 2-element batches
 * (no rank inside) stay apart. Every call here is a synchronous push: replays run as forked fibers
 * (`runQueued`), so neither kvcached nor a replay can stall the reader.
 */
import { Effect, type Scope } from "effect"
import type { KvBridgeStatus } from "../../services/kv/KvBridge.ts"
import { checkSeq, decodeRaw, type KvBatch, type RawBatch, splitMessage } from "../../services/kv/KvEvents.ts"
import { batchRecord, type KvRecordBody, type Resync, recordBytes, resyncRecord } from "../../services/kv/KvWire.ts"
import type { KvQueue, Prepared, QueuedRecord } from "./queue.ts"
import { fetchReplay } from "./replayFetch.ts"

/** What the queue holds: records ready for the wire, or a batch as the engine sent it (decoded when sent). */
export type QueuedBody = KvRecordBody | { readonly type: "Raw"; readonly raw: RawBatch }

/** A batch in hand: decoded (a replay's) or raw (the live stream's). */
type Incoming = KvBatch | RawBatch

/** The bridge's status as its parts write it. */
export type MutableStatus = { -readonly [K in keyof KvBridgeStatus]: KvBridgeStatus[K] }

/** One rank's stream: its endpoints, the seq it owes next, the batches held while its replay runs. */
export interface RankStream {
  readonly rank: number
  readonly endpoint: string
  readonly replayAt: string | undefined
  expected: bigint | undefined
  holding: Array<Incoming> | undefined
}

/** A queue entry for a record covering [fromSeq, nextSeq) of one rank. */
export const queuedRecord = (
  record: QueuedBody,
  dpRank: number,
  fromSeq: bigint,
  nextSeq: bigint
): QueuedRecord<QueuedBody> => ({
  record,
  batch: record.type !== "Resync",
  dpRank,
  fromSeq,
  nextSeq,
  // A raw batch costs its payload (plus the record around it): the bound is on what is really held.
  bytes: record.type === "Raw" ? 96 + record.raw.payload.byteLength : recordBytes(record)
})

/** A queue entry for a Resync. */
export const resyncOf = (r: Resync): QueuedRecord<QueuedBody> =>
  queuedRecord(resyncRecord(r), r.dpRank, r.fromSeq, r.toSeq)

export interface Sequencer {
  /** Takes one message of a rank's stream. */
  readonly onMessage: (r: RankStream, frames: ReadonlyArray<Uint8Array>) => void
  /** Forks the replays messages have started since the last call. */
  readonly runQueued: Effect.Effect<void, never, Scope.Scope>
  /**
   * The record sent for a queued body: a raw batch decoded now (its counters go to the status); one whose
   * payload does not decode becomes a Resync of its seq (its events are lost; its seq still counts, so no gap)
   * and is reported dropped, so the queue counts it as dropped and never as forwarded.
   */
  readonly materialize: (body: QueuedBody) => Prepared<QueuedBody>
  /**
   * The engine run ended (it exited or was stopped): everything it held is gone, and the next run numbers its
   * batches from 0. A `restart` Resync per rank that had a stream says so at once; without it kvcached kept
   * the dead run's blocks until the next run's first batch (vLLM sends none until a request comes, and its
   * block hashes are seeded per process, so those blocks never match again). The next batch is then a join.
   */
  readonly engineGone: (r: RankStream) => void
}

export const makeSequencer = (
  st: MutableStatus,
  queue: KvQueue<QueuedBody>,
  topic: string,
  replayTimeoutMs: number
): Sequencer => {
  // Replays started by a message (or by the end of another replay, which may find a new gap in what it
  // held); they run beside the readers, never in their way.
  const fibers: Array<Effect.Effect<void, never, Scope.Scope>> = []
  const runQueued: Effect.Effect<void, never, Scope.Scope> = Effect.suspend(() => {
    const next = fibers.shift()
    return next === undefined ? Effect.void : Effect.andThen(Effect.forkScoped(next), runQueued)
  })

  const forward = (r: RankStream, b: Incoming) => {
    r.expected = b.seq + 1n
    const body: QueuedBody = "payload" in b ? { type: "Raw", raw: b } : batchRecord(b)
    queue.push(queuedRecord(body, r.rank, b.seq, b.seq + 1n))
  }
  const resync = (re: Resync) => {
    st.resyncs++
    queue.push(resyncOf(re))
  }

  // After a replay: forward it if it covers [from, until) exactly, else say the range is lost.
  const finishReplay = (r: RankStream, from: bigint, gap: boolean, got: ReadonlyArray<KvBatch> | Error) => {
    const held = r.holding ?? []
    r.holding = undefined
    const until = (held[0] as Incoming).seq
    const inRange =
      got instanceof Error
        ? []
        : got.filter((b) => b.seq >= from && b.seq < until).map((b) => ({ ...b, dpRank: r.rank }))
    const complete = inRange.length === Number(until - from) && inRange.every((b, i) => b.seq === from + BigInt(i))
    if (got instanceof Error) st.lastBatchError = `DP rank ${r.rank}: ${got.message}`
    if (complete) {
      for (const b of inRange) forward(r, b)
      if (gap) st.replayed++
    } else if (gap) resync({ reason: "gap", dpRank: r.rank, fromSeq: from, toSeq: until })
    r.expected = until
    for (const b of held) accept(r, b)
  }

  const startReplay = (r: RankStream, at: string, from: bigint, trigger: Incoming, gap: boolean) => {
    r.holding = [trigger]
    fibers.push(
      fetchReplay(at, topic, from, replayTimeoutMs, queue.maxBytes).pipe(
        Effect.catch((e: Error) => Effect.succeed(e)),
        Effect.flatMap((got) => Effect.sync(() => finishReplay(r, from, gap, got))),
        Effect.andThen(runQueued)
      )
    )
  }

  const accept = (r: RankStream, b: Incoming) => {
    if (r.holding !== undefined) {
      r.holding.push(b)
      return
    }
    const v = checkSeq(r.expected, b.seq)
    switch (v.kind) {
      case "next":
        return forward(r, b)
      case "join":
        // Hello already tells kvcached to start over, so batches from before we listened are only a bonus.
        if (v.missed && r.replayAt !== undefined) return startReplay(r, r.replayAt, 0n, b, false)
        return forward(r, b)
      case "gap":
        st.gaps++
        if (r.replayAt !== undefined) return startReplay(r, r.replayAt, v.from, b, true)
        resync({ reason: "gap", dpRank: r.rank, fromSeq: v.from, toSeq: v.to })
        return forward(r, b)
      case "restart":
        resync({ reason: "restart", dpRank: r.rank, fromSeq: v.from, toSeq: v.to })
        return forward(r, b)
    }
  }

  const engineGone = (r: RankStream) => {
    // A replay in flight settles the old stream itself; a rank that saw nothing has nothing to retract.
    if (r.expected === undefined || r.holding !== undefined) return
    resync({ reason: "restart", dpRank: r.rank, fromSeq: r.expected, toSeq: 0n })
    r.expected = undefined
  }

  const onMessage = (r: RankStream, frames: ReadonlyArray<Uint8Array>) => {
    const d = splitMessage(frames)
    if (!d.ok) {
      // No seq: nothing to account it to; the next batch's seq shows the gap.
      st.lastBatchError = `DP rank ${r.rank}: undecodable KV event message: ${d.error}`
      return
    }
    st.lastSeq = d.raw.seq.toString()
    // The endpoint says which rank this is; a 2-element batch carries no rank of its own.
    accept(r, { ...d.raw, dpRank: r.rank })
  }

  const materialize = (body: QueuedBody): Prepared<QueuedBody> => {
    if (body.type !== "Raw") return { record: body, dropped: false }
    const d = decodeRaw(body.raw)
    if (d.ok) {
      st.unknownEvents += d.batch.unknownTypes
      st.unknownKeys += d.batch.unknownKeys
      return { record: batchRecord(d.batch), dropped: false }
    }
    st.lastBatchError = `DP rank ${body.raw.dpRank} seq ${body.raw.seq}: undecodable KV event batch: ${d.error}`
    st.resyncs++
    const seq = body.raw.seq
    const record = resyncRecord({ reason: "decode", dpRank: body.raw.dpRank, fromSeq: seq, toSeq: seq + 1n })
    return { record, dropped: true }
  }

  return { onMessage, runQueued, materialize, engineGone }
}
