/**
 * The byte-bounded queue between the KV-event reader and the kvcached link. `push` never blocks: past
 * `maxBytes` it drops the oldest unsent records and remembers, per DP rank, which seq range went, and
 * `take` then puts one overflow Resync per rank in front of what survived. A record larger than the whole bound
 * is the only one dropped (the oldest would all go and it still would not fit), and an overflow Resync takes its
 * place in the queue, so the records before it are sent first. Taken records stay here,
 * numbered (`n`), until kvcached acknowledges them (`ack`), so a reconnect can resend exactly those
 * (`unacked`). Memory is released as soon as a record is acknowledged or dropped: slots are cleared, not
 * just skipped, and the backing array is compacted. Pure data structure (the writer's wake-up is a plain
 * callback), tested directly.
 */
import type { Resync } from "./KvWire.ts"
import type { Prepared, QueuedRecord, SentRecord } from "./QueueRecords.ts"

/** Where a record too large for the whole bound was dropped: an overflow Resync of its range, rendered at `take`. */
interface LostHere {
  readonly lostHere: true
  readonly batch: false
  readonly dpRank: number
  readonly fromSeq: bigint
  nextSeq: bigint
  readonly bytes: number
}

type Pending<R> = QueuedRecord<R> | LostHere

/** What a LostHere costs (a Resync record's estimate, as KvWire.recordBytes counts it). */
const LOST_HERE_BYTES = 96

interface Lost {
  readonly fromSeq: bigint
  nextSeq: bigint
}

/** Compact the backing array once this many dead slots lead it (and they are at least half of it). */
const COMPACT_AT = 1024

export class KvQueue<R> {
  private pending: Array<Pending<R> | undefined> = []
  private head = 0
  private sent: Array<SentRecord<R>> = []
  private readonly lost = new Map<number, Lost>()
  private waker: (() => void) | undefined
  private nextN = 0
  /** Bytes held: unsent plus sent-but-unacknowledged records. */
  bytes = 0
  /** Batches among them. */
  batches = 0
  /** Batches dropped since the start: on overflow, or lost by `take`'s preparation. */
  dropped = 0
  /** Resync records kvcached acknowledged since the start (one it never got, dropped or unacknowledged, is not one). */
  resyncs = 0
  /**
   * Bytes held outside the queue under the same bound (a rank's batches held and its replay's replies while the
   * replay runs: rankSequencer.ts): `push` drops the oldest unsent records to keep `bytes + outside` within it.
   */
  outside = 0
  /**
   * Called before a push would drop records while `outside` holds bytes: its owner lets go of what it holds there
   * (rankSequencer.ts gives its running replays up, pushing their held batches in here), so that the records a
   * drop hits are the oldest of all, as without a replay. Pushes made meanwhile only append (it is not re-entered);
   * the push that called it then drops what must go, once.
   */
  reclaim: (() => void) | undefined = undefined
  private reclaiming = false
  /** Told how many batches a push dropped to stay within the bound, when it dropped any (overflowLog.ts logs it). */
  onOverflow: ((batches: number) => void) | undefined = undefined
  readonly maxBytes: number

  constructor(maxBytes: number) {
    this.maxBytes = Math.max(1, maxBytes)
  }

  /** Records not yet taken. */
  get size(): number {
    return this.pending.length - this.head
  }

  /** How many records were numbered for sending so far (those below the first unacknowledged one were acknowledged). */
  get numbered(): number {
    return this.nextN
  }

  /** Records taken and not yet acknowledged. */
  get unacked(): ReadonlyArray<SentRecord<R>> {
    return this.sent
  }

  /**
   * Appends; returns true when records had to go to stay within `maxBytes` (older ones, or this one alone). One that
   * does not fit beside what is held outside first has `reclaim` called: a live record comes before a replay's.
   */
  push(item: QueuedRecord<R>): boolean {
    // A push made by `reclaim` is counted in the one that called it.
    if (this.reclaiming) return this.pushWithin(item)
    const before = this.dropped
    const overflowed = this.pushWithin(item)
    if (this.dropped > before) this.onOverflow?.(this.dropped - before)
    return overflowed
  }

  private pushWithin(item: QueuedRecord<R>): boolean {
    if (this.outside > 0 && !this.reclaiming && !this.fits(item.bytes > this.maxBytes ? LOST_HERE_BYTES : item.bytes)) {
      this.reclaiming = true
      try {
        this.reclaim?.()
      } finally {
        this.reclaiming = false
      }
    }
    let overflowed = false
    if (item.bytes > this.maxBytes) {
      // It cannot fit even alone: dropping everything before it to make room would lose those and it as well.
      if (item.batch) this.dropped++
      this.markLost(item)
      overflowed = true
    } else {
      this.pending.push(item)
      this.bytes += item.bytes
      if (item.batch) this.batches++
    }
    if (this.reclaiming) return overflowed
    // Sent records stay (they may already be applied); only unsent ones are dropped, oldest first.
    while (this.bytes + this.outside > this.maxBytes && this.head < this.pending.length) {
      const old = this.pending[this.head] as Pending<R>
      this.pending[this.head] = undefined
      this.head++
      this.release(old.bytes, old.batch)
      overflowed = true
      if (old.batch) this.dropped++
      const l = this.lost.get(old.dpRank)
      if (l === undefined) this.lost.set(old.dpRank, { fromSeq: old.fromSeq, nextSeq: old.nextSeq })
      else l.nextSeq = old.nextSeq
    }
    this.compact()
    const w = this.waker
    this.waker = undefined
    w?.()
    return overflowed
  }

  /**
   * Moves up to `maxRecords` / `maxBytes` (at least one record) from the queue to the unacknowledged set,
   * numbering them, with the overflow Resyncs (rendered by `resync`) in front. Returns what was taken.
   * `prepare` turns a record into the one that is sent (and kept until acknowledged, so a resend after a
   * reconnect sends the same record without preparing it again): the bridge decodes raw batches here. A batch
   * it reports dropped is counted so now (and no longer waits as a batch), so that it counts once.
   */
  take(
    maxRecords: number,
    maxBytes: number,
    resync: (r: Resync) => QueuedRecord<R>,
    prepare: (record: R) => Prepared<R> = (record) => ({ record, dropped: false })
  ): ReadonlyArray<SentRecord<R>> {
    const out: Array<SentRecord<R>> = []
    let size = 0
    const add = (q: QueuedRecord<R>, counted: boolean) => {
      const p = prepare(q.record)
      const lost = q.batch && p.dropped
      const s: SentRecord<R> = {
        n: this.nextN++,
        record: p.record,
        batch: q.batch && !lost,
        bytes: q.bytes,
        dpRank: q.dpRank,
        fromSeq: q.fromSeq,
        nextSeq: q.nextSeq
      }
      if (!counted) {
        this.bytes += q.bytes
        if (s.batch) this.batches++
      } else if (lost) {
        this.batches--
        this.dropped++
      }
      size += q.bytes
      out.push(s)
      this.sent.push(s)
    }
    for (const [dpRank, l] of this.lost) {
      add(resync({ reason: "overflow", dpRank, fromSeq: l.fromSeq, toSeq: l.nextSeq }), false)
    }
    this.lost.clear()
    while (out.length < maxRecords && this.head < this.pending.length) {
      const q = this.pending[this.head] as Pending<R>
      if (out.length > 0 && size + q.bytes > maxBytes) break
      this.pending[this.head] = undefined
      this.head++
      if ("lostHere" in q) {
        this.release(q.bytes, false)
        add(resync({ reason: "overflow", dpRank: q.dpRank, fromSeq: q.fromSeq, toSeq: q.nextSeq }), false)
      } else add(q, true)
    }
    this.compact()
    return out
  }

  /** Whether `bytes` more fit within the bound beside what is held, in the queue and outside it. */
  fits(bytes: number): boolean {
    return this.bytes + this.outside + bytes <= this.maxBytes
  }

  /** Forgets every sent record with `n <= upTo` (counting the Resyncs); returns how many batches that acknowledged. */
  ack(upTo: number): number {
    let i = 0
    let batches = 0
    while (i < this.sent.length && (this.sent[i] as SentRecord<R>).n <= upTo) {
      const s = this.sent[i] as SentRecord<R>
      this.release(s.bytes, s.batch)
      if (s.batch) batches++
      else this.resyncs++
      i++
    }
    if (i > 0) this.sent = this.sent.slice(i)
    return batches
  }

  /**
   * Rewrites the unacknowledged records: `fix` keeps or replaces each (a replacement that is no longer a batch
   * counts as a dropped batch) or removes it (undefined), and what remains is numbered again from `from` (the first
   * `n`, unless told), after the records of `front`. Only for records never delivered: the link calls it for a chunk
   * kvcached's client refused to encode, so kvcached has applied none of it and renumbering cannot collide with what
   * it holds; and when kvcached came back having applied only up to `from - 1` (it lost the rest: `front` holds the
   * Resyncs that say so), so that `n` goes on from there without a hole.
   */
  rewriteUnacked(
    fix: (s: SentRecord<R>) => SentRecord<R> | undefined,
    from = this.sent[0]?.n ?? this.nextN,
    front: ReadonlyArray<QueuedRecord<R>> = []
  ): void {
    const kept: Array<SentRecord<R>> = []
    for (const q of front) {
      this.bytes += q.bytes
      kept.push({ ...q, n: from + kept.length, batch: false })
    }
    for (const s of this.sent) {
      const f = fix(s)
      if (f === undefined) this.release(s.bytes, s.batch)
      else if (s.batch && !f.batch) this.batches--
      if (s.batch && (f === undefined || !f.batch)) this.dropped++
      if (f !== undefined) kept.push({ ...f, n: from + kept.length, bytes: s.bytes })
    }
    this.sent = kept
    this.nextN = from + kept.length
  }

  /**
   * The seq rank `dpRank`'s stream goes on with in what is held (its first record's), if any: the unacknowledged,
   * then a range dropped (its overflow Resync goes before every pending record), then the pending.
   */
  nextSeqOf(dpRank: number): bigint | undefined {
    const sent = this.sent.find((s) => s.dpRank === dpRank)
    if (sent !== undefined) return sent.fromSeq
    const lost = this.lost.get(dpRank)
    if (lost !== undefined) return lost.fromSeq
    for (let i = this.head; i < this.pending.length; i++) {
      const p = this.pending[i]
      if (p !== undefined && p.dpRank === dpRank) return p.fromSeq
    }
    return undefined
  }

  /** Ranges dropped whose overflow Resyncs are still to be sent (one per rank). */
  get lostRanges(): number {
    return this.lost.size
  }

  /** Calls `wake` once, at the next push (at once if something is waiting). Replaces an earlier waker. */
  onPush(wake: () => void): void {
    if (this.size > 0 || this.lost.size > 0) wake()
    else this.waker = wake
  }

  cancelWake(): void {
    this.waker = undefined
  }

  /** Drops `item` where it stands: a LostHere for its range, merged into one just before it of the same rank. */
  private markLost(item: QueuedRecord<R>): void {
    const last = this.head < this.pending.length ? this.pending[this.pending.length - 1] : undefined
    if (last !== undefined && "lostHere" in last && last.dpRank === item.dpRank && last.nextSeq === item.fromSeq) {
      last.nextSeq = item.nextSeq
      return
    }
    const mark: LostHere = {
      lostHere: true,
      batch: false,
      dpRank: item.dpRank,
      fromSeq: item.fromSeq,
      nextSeq: item.nextSeq,
      bytes: LOST_HERE_BYTES
    }
    this.pending.push(mark)
    this.bytes += mark.bytes
  }

  private release(bytes: number, batch: boolean): void {
    this.bytes -= bytes
    if (batch) this.batches--
  }

  private compact(): void {
    if (this.head === this.pending.length) {
      this.pending = []
      this.head = 0
    } else if (this.head >= COMPACT_AT && this.head * 2 >= this.pending.length) {
      this.pending = this.pending.slice(this.head)
      this.head = 0
    }
  }
}
