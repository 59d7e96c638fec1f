/**
 * What the KV bridge does with each message, per data-parallel rank: decode it, check its seq against
 * the one the rank owes next, and queue it for kvcached. A gap (or, on joining, batches from before we
 * listened) starts a replay through the rank's replay ROUTER when one is configured, while later batches
 * of that rank are held; a replay that covers the range is forwarded in order, else a Resync says the
 * range is lost. Batches are tagged with the rank of the endpoint they came from, so 2-element batches
 * (no rank inside) stay apart. Every call here is a synchronous push: replays run as forked fibers
 * (`runQueued`), so neither kvcached nor a replay can stall the reader.
 */
import { Effect, type Scope } from "effect"
import type { KvBridgeStatus } from "../../services/kv/KvBridge.ts"
import { checkSeq, decodeMessage, type KvBatch } from "../../services/kv/KvEvents.ts"
import { batchRecord, type KvRecordBody, type Resync, recordBytes, resyncRecord } from "../../services/kv/KvWire.ts"
import type { KvQueue, QueuedRecord } from "./queue.ts"
import { fetchReplay } from "./replayFetch.ts"

/** The bridge's status as its parts write it. */
export type MutableStatus = { -readonly [K in keyof KvBridgeStatus]: KvBridgeStatus[K] }

/** One rank's stream: its endpoints, the seq it owes next, the batches held while its replay runs. */
export interface RankStream {
  readonly rank: number
  readonly endpoint: string
  readonly replayAt: string | undefined
  expected: bigint | undefined
  holding: Array<KvBatch> | undefined
}

/** A queue entry for a record covering [fromSeq, nextSeq) of one rank. */
export const queuedRecord = (
  record: KvRecordBody,
  dpRank: number,
  fromSeq: bigint,
  nextSeq: bigint
): QueuedRecord<KvRecordBody> => ({
  record,
  batch: record.type === "Batch",
  dpRank,
  fromSeq,
  nextSeq,
  bytes: recordBytes(record)
})

/** A queue entry for a Resync. */
export const resyncOf = (r: Resync): QueuedRecord<KvRecordBody> =>
  queuedRecord(resyncRecord(r), r.dpRank, r.fromSeq, r.toSeq)

export interface Sequencer {
  /** Takes one message of a rank's stream. */
  readonly onMessage: (r: RankStream, frames: ReadonlyArray<Uint8Array>) => void
  /** Forks the replays messages have started since the last call. */
  readonly runQueued: Effect.Effect<void, never, Scope.Scope>
  /** Batches lost to undecodable messages. */
  readonly decodeDrops: () => number
}

export const makeSequencer = (
  st: MutableStatus,
  queue: KvQueue<KvRecordBody>,
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

  let decodeDrops = 0
  const push = (q: QueuedRecord<KvRecordBody>) => {
    queue.push(q)
    st.dropped = queue.dropped + decodeDrops
  }
  const forward = (r: RankStream, b: KvBatch) => {
    r.expected = b.seq + 1n
    push(queuedRecord(batchRecord(b), r.rank, b.seq, b.seq + 1n))
  }
  const resync = (re: Resync) => {
    st.resyncs++
    push(resyncOf(re))
  }

  // After a replay: forward it if it covers [from, until) exactly, else say the range is lost.
  const finishReplay = (r: RankStream, from: bigint, gap: boolean, got: ReadonlyArray<KvBatch> | Error) => {
    const held = r.holding ?? []
    r.holding = undefined
    const until = (held[0] as KvBatch).seq
    const inRange =
      got instanceof Error
        ? []
        : got.filter((b) => b.seq >= from && b.seq < until).map((b) => ({ ...b, dpRank: r.rank }))
    const complete = inRange.length === Number(until - from) && inRange.every((b, i) => b.seq === from + BigInt(i))
    if (got instanceof Error) st.lastError = got.message
    if (complete) {
      for (const b of inRange) forward(r, b)
      if (gap) st.replayed++
    } else if (gap) resync({ reason: "gap", dpRank: r.rank, fromSeq: from, toSeq: until })
    r.expected = until
    for (const b of held) accept(r, b)
  }

  const startReplay = (r: RankStream, at: string, from: bigint, trigger: KvBatch, gap: boolean) => {
    r.holding = [trigger]
    fibers.push(
      fetchReplay(at, topic, from, replayTimeoutMs).pipe(
        Effect.catch((e: Error) => Effect.succeed(e)),
        Effect.flatMap((got) => Effect.sync(() => finishReplay(r, from, gap, got))),
        Effect.andThen(runQueued)
      )
    )
  }

  const accept = (r: RankStream, b: KvBatch) => {
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

  const onMessage = (r: RankStream, frames: ReadonlyArray<Uint8Array>) => {
    const d = decodeMessage(frames)
    if (d.ok) {
      st.lastSeq = d.batch.seq.toString()
      st.unknownEvents += d.batch.unknownTypes
      st.unknownKeys += d.batch.unknownKeys
      // The endpoint says which rank this is; a 2-element batch carries no rank of its own.
      return accept(r, { ...d.batch, dpRank: r.rank })
    }
    st.lastError = `undecodable KV event message: ${d.error}`
    if (d.seq === undefined || r.holding !== undefined) return
    // The batch's events are lost; its seq still counts, so no gap is reported for it as well.
    decodeDrops++
    st.lastSeq = d.seq.toString()
    r.expected = d.seq + 1n
    resync({ reason: "decode", dpRank: r.rank, fromSeq: d.seq, toSeq: d.seq + 1n })
  }

  return { onMessage, runQueued, decodeDrops: () => decodeDrops }
}
