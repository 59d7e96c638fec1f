/**
 * What the KV bridge does with each message, per data-parallel rank: split it (topic, seq, payload), check its
 * seq against the one the rank owes next, and queue it for kvcached with its payload still undecoded: it is
 * decoded when the link sends it (`materialize`), so what the queue holds is the engine's bytes, and a batch
 * dropped while kvcached is away is never decoded at all. A gap (or, on joining, batches from before we
 * listened) starts a replay through the rank's replay ROUTER when one is configured, while later batches
 * of that rank are held; a replay that covers the range is forwarded in order, else a Resync says the
 * range is lost. What is held (the live batches and the replay's replies as they arrive) counts against
 * `kv.max_queue_bytes` with the queue: past it the replay is abandoned (a `gap` Resync) and what was held goes on
 * to the queue, and so it is when another rank's batch would not fit (live batches first: the queue's `reclaim`).
 * A replay's batches stay undecoded too. Batches are tagged with their endpoint's rank, so 2-element batches (no
 * rank inside) stay apart. Every call is a synchronous push: replays run as forked fibers (`runQueued`). */
import { Effect, type Scope } from "effect"
import type { KvBridgeStatus } from "../../services/kv/KvBridge.ts"
import type { BatchRecord } from "../../services/kv/KvcachedRpc.ts"
import { checkSeq, decodeRaw, type RawBatch, splitMessage } from "../../services/kv/KvEvents.ts"
import type { KvQueue } from "../../services/kv/KvQueue.ts"
import {
  batchRecord,
  type KvRecordBody,
  type Resync,
  recordBytes,
  resyncRecord,
  wireError
} from "../../services/kv/KvWire.ts"
import type { Prepared, QueuedRecord } from "../../services/kv/QueueRecords.ts"
import { fetchReplay, rawCost } from "./replayFetch.ts"

/** What the queue holds: records ready for the wire, or a batch as the engine sent it (decoded when sent). */
export type QueuedBody = KvRecordBody | { readonly type: "Raw"; readonly raw: RawBatch }

/** A batch in hand, live or replayed, as the engine sent it. */
type Incoming = RawBatch

/** The bridge's status as its parts write it. */
export type MutableStatus = { -readonly [K in keyof KvBridgeStatus]: KvBridgeStatus[K] }

/** Where, among the batches held during a replay, the engine run ended (engineGone is applied there). */
const ENGINE_GONE = Symbol("engineGone")
type Held = Incoming | typeof ENGINE_GONE

/**
 * The replay a rank waits for: its range's start, whether a gap (not a join) started it, how to abandon it, and
 * the replies it holds so far (counted with the held batches, under the bound).
 */
interface InFlight {
  readonly from: bigint
  readonly gap: boolean
  cancel: () => void
  batches: number
  bytes: number
}

/** One rank's stream: its endpoints, the seq it owes next, the batches held while its replay runs. */
export interface RankStream {
  readonly rank: number
  readonly endpoint: string
  readonly replayAt: string | undefined
  expected: bigint | undefined
  holding: Array<Held> | undefined
  replay?: InFlight | undefined
  /** The last seq a message of this rank carried (for the status; rendered only when it is read). */
  lastSeq?: bigint | undefined
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
  bytes: record.type === "Raw" ? rawCost(record.raw) : recordBytes(record)
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
   * The record sent for a queued body: a raw batch decoded now (its counters go to the status); a batch whose
   * payload does not decode, or that the wire schema refuses, becomes a Resync of its seq (its events are lost;
   * its seq still counts, so no gap) and is reported dropped, so the queue counts it dropped, never forwarded.
   */
  readonly materialize: (body: QueuedBody) => Prepared<QueuedBody>
  /**
   * The engine run ended (it exited or was stopped): everything it held is gone, and the next run numbers its
   * batches from 0. A `restart` Resync per rank that had a stream says so at once; without it kvcached kept
   * the dead run's blocks until the next run's first batch (vLLM sends none until a request comes, and its
   * block hashes are seeded per process, so those blocks never match again). The next batch is then a join.
   */
  readonly engineGone: (r: RankStream) => void
  /** Batches held while replays run (live ones, replies so far) and their bytes: queue.outside (status: queued). */
  readonly held: { readonly batches: number; readonly bytes: number }
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
    queue.push(queuedRecord({ type: "Raw", raw: b }, r.rank, b.seq, b.seq + 1n))
  }
  // Counted (status `resyncs`) when kvcached acknowledges it (services/kv/KvQueue.ts): one dropped on the way never reached it.
  const resync = (re: Resync) => queue.push(resyncOf(re))

  // Held bytes live in queue.outside, so that the queue's own bound counts them (and the replies) too.
  let heldBatches = 0
  const replaying = new Set<RankStream>()
  const hold = (r: RankStream, b: Held) => {
    ;(r.holding as Array<Held>).push(b)
    if (b === ENGINE_GONE) return
    heldBatches++
    queue.outside += rawCost(b)
  }

  // After a replay: forward it if it covers [from, until) exactly, else say the range is lost. `replay` false:
  // what was held goes on without starting another replay (it was abandoned for memory; see accept).
  const finishReplay = (r: RankStream, got: ReadonlyArray<Omit<RawBatch, "dpRank">> | Error, replay = true) => {
    const { from, gap, batches, bytes } = r.replay as InFlight
    const wasHeld = r.holding ?? []
    r.holding = undefined
    r.replay = undefined
    replaying.delete(r)
    // Its replies are let go (or queued below, counted there): the budget no longer holds them here.
    heldBatches -= batches
    queue.outside -= bytes
    for (const b of wasHeld) {
      if (b === ENGINE_GONE) continue
      heldBatches--
      queue.outside -= rawCost(b)
    }
    const until = (wasHeld[0] as Incoming).seq
    const inRange =
      got instanceof Error
        ? []
        : got.filter((b) => b.seq >= from && b.seq < until).map((b) => ({ ...b, dpRank: r.rank }))
    const complete = inRange.length === Number(until - from) && inRange.every((b, i) => b.seq === from + BigInt(i))
    const short = `the replay of seqs [${from}, ${until}) answered ${inRange.length} of them`
    if (!complete && (gap || got instanceof Error))
      st.lastBatchError = `DP rank ${r.rank}: ${got instanceof Error ? got.message : short}`
    if (complete) {
      for (const b of inRange) forward(r, b)
      if (gap) st.replayed++
    } else if (gap) resync({ reason: "gap", dpRank: r.rank, fromSeq: from, toSeq: until })
    r.expected = until
    // A replay that failed (no answer by its deadline, too large) would fail again for a gap among the batches
    // held meanwhile, holding the rest again: one deadline per gap, and a backlog that grows when gaps come
    // faster. Those gaps get their Resync at once; the next live gap tries the endpoint again.
    const again = replay && !(got instanceof Error)
    for (const b of wasHeld) {
      if (b === ENGINE_GONE) engineGone(r)
      else accept(r, b, again)
    }
  }

  const startReplay = (r: RankStream, at: string, from: bigint, trigger: Incoming, gap: boolean) => {
    r.holding = []
    hold(r, trigger)
    const me: InFlight = { from, gap, cancel: () => undefined, batches: 0, bytes: 0 }
    r.replay = me
    replaying.add(r)
    // Each reply is taken into the bound as it arrives, with the queue and every held batch: a replay that would
    // pass it stops there (a failed replay: a gap Resync). Once given up, it takes nothing more.
    const budget = {
      maxBytes: queue.maxBytes,
      take: (bytes: number) => {
        if (r.replay !== me || !queue.fits(bytes)) return false
        me.batches++
        me.bytes += bytes
        heldBatches++
        queue.outside += bytes
        return true
      }
    }
    // Abandoned (abandon, below): the fetch stops at once, closing its dealer.
    const cancelled = Effect.callback<never, Error>((resume) => {
      me.cancel = () => resume(Effect.fail(new Error("abandoned")))
    })
    fibers.push(
      Effect.suspend(() =>
        r.replay !== me
          ? Effect.void
          : Effect.raceFirst(
              fetchReplay(at, topic, { from, until: trigger.seq }, replayTimeoutMs, budget),
              cancelled
            ).pipe(
              Effect.catch((e: Error) => Effect.succeed(e)),
              // A replay abandoned meanwhile was settled by accept; its late result is void.
              Effect.flatMap((got) => Effect.sync(() => r.replay === me && finishReplay(r, got)))
            )
      ).pipe(Effect.andThen(runQueued))
    )
  }

  // Given up for memory, settled before its fetch is stopped: cancel resumes the fiber at once, which must find it so.
  const abandon = (r: RankStream, what: string) => {
    const inFlight = r.replay as InFlight
    finishReplay(r, new Error(`${what} passed ${queue.maxBytes} bytes (kv.max_queue_bytes)`), false)
    inFlight.cancel()
  }
  // A replay saves one rank a Resync; its room must not cost other ranks' live batches theirs: a push that would
  // drop while replays hold bytes gives them all up first (held batches go in ahead of it, replies are let go). Not
  // half the bound for replays: the held live batches, which push can never drop, would crowd the others out.
  queue.reclaim = () => {
    for (const r of [...replaying]) abandon(r, "another rank's batch with what the replay holds")
  }

  const accept = (r: RankStream, b: Incoming, replay = true) => {
    if (r.holding !== undefined) {
      // Held batches are memory like the queue's, under the same bound: when they and the queue would pass it,
      // the replay is given up (its range becomes a gap Resync) and the batches go on to the queue, whose own
      // overflow then drops the oldest, so a replay endpoint that never answers cannot grow them for good.
      if (queue.fits(rawCost(b))) return hold(r, b)
      abandon(r, "batches held during the replay")
      return accept(r, b, false)
    }
    const v = checkSeq(r.expected, b.seq)
    switch (v.kind) {
      case "next":
        return forward(r, b)
      case "join":
        // Hello already tells kvcached to start over, so batches from before we listened are only a bonus.
        if (v.missed && replay && r.replayAt !== undefined) return startReplay(r, r.replayAt, 0n, b, false)
        return forward(r, b)
      case "gap":
        st.gaps++
        if (replay && r.replayAt !== undefined) return startReplay(r, r.replayAt, v.from, b, true)
        resync({ reason: "gap", dpRank: r.rank, fromSeq: v.from, toSeq: v.to })
        return forward(r, b)
      case "restart":
        // A rank restarted alone (no engine exit seen): its new run began at 0, as after engineGone, so the stream goes
        // on at 0 (`to_seq`, not this batch's seq); the run's [0, seq) the reader missed is then a gap like any other.
        resync({ reason: "restart", dpRank: r.rank, fromSeq: v.from, toSeq: 0n })
        r.expected = 0n
        return accept(r, b, replay)
    }
  }

  const engineGone = (r: RankStream) => {
    // During a replay the old run's batches are still held: the retraction goes after them, when they are let go
    // (finishReplay), and before any of the next run's; dropping it would leave the dead run's blocks in kvcached.
    if (r.holding !== undefined) return void r.holding.push(ENGINE_GONE)
    // Nothing seen (of this run: 0 is next), nothing to retract. After it a new run's seq past 0 is a gap, not a join.
    if (r.expected === undefined || r.expected === 0n) return
    resync({ reason: "restart", dpRank: r.rank, fromSeq: r.expected, toSeq: 0n })
    r.expected = 0n
  }

  const onMessage = (r: RankStream, frames: ReadonlyArray<Uint8Array>) => {
    const d = splitMessage(frames)
    if (!d.ok) {
      // No seq: nothing to account it to; the next batch's seq shows the gap.
      st.lastBatchError = `DP rank ${r.rank}: undecodable KV event message: ${d.error}`
      return
    }
    r.lastSeq = d.raw.seq
    // The endpoint says which rank this is; a 2-element batch carries no rank of its own.
    accept(r, { ...d.raw, dpRank: r.rank })
  }

  // A batch that cannot go to kvcached as it is: its events are lost, a decode Resync of its seq goes instead.
  const lost = (dpRank: number, seq: bigint, why: string): Prepared<QueuedBody> => {
    st.lastBatchError = `DP rank ${dpRank} seq ${seq}: ${why}`
    return { record: resyncRecord({ reason: "decode", dpRank, fromSeq: seq, toSeq: seq + 1n }), dropped: true }
  }

  const materialize = (body: QueuedBody): Prepared<QueuedBody> => {
    if (body.type === "Resync") return { record: body, dropped: false }
    let record = body
    let unknown = { unknownTypes: 0, unknownKeys: 0 }
    if (body.type === "Raw") {
      const d = decodeRaw(body.raw)
      if (!d.ok) return lost(body.raw.dpRank, body.raw.seq, `undecodable KV event batch: ${d.error}`)
      record = batchRecord(d.batch)
      unknown = d.batch
    }
    // The decoder takes any number where the wire wants a safe integer (a float token id or block_size, a
    // 64-bit value): kvcached's client would refuse the whole Push that carries it, again at every resend.
    const bad = wireError(record as KvRecordBody)
    const b = record as Omit<BatchRecord, "n">
    if (bad !== undefined) return lost(b.dp_rank, BigInt(b.seq), `KV event batch the wire schema refuses: ${bad}`)
    st.unknownEvents += unknown.unknownTypes
    st.unknownKeys += unknown.unknownKeys
    return { record, dropped: false }
  }

  return {
    onMessage,
    runQueued,
    materialize,
    engineGone,
    get held() {
      return { batches: heldBatches, bytes: queue.outside }
    }
  }
}
