/**
 * The bounded queue between the KV-event reader and the kvcached writer. `push` never blocks: past
 * capacity it drops the oldest line and remembers the loss, and `take` then puts one overflow Resync in
 * front of what survived, so kvcached learns exactly which seq range is gone. Pure data structure (the
 * writer's wake-up is a plain callback), tested directly.
 */
import type { Resync } from "../services/KvWire.ts"

export interface QueuedLine {
  readonly line: string
  /** True for a Batch line (counted as forwarded/dropped); false for a control line. */
  readonly batch: boolean
  readonly dpRank: number
  /** The seq this line starts (a batch's seq; a Resync's to_seq): where the stream continues after a drop. */
  readonly seq: bigint
}

export class LineQueue {
  private items: Array<QueuedLine> = []
  private head = 0
  private lost: { readonly fromSeq: bigint; readonly dpRank: number } | undefined
  private waker: (() => void) | undefined
  /** Batch lines dropped on overflow since the start. */
  dropped = 0
  readonly capacity: number

  constructor(capacity: number) {
    this.capacity = Math.max(1, capacity)
  }

  get size(): number {
    return this.items.length - this.head
  }

  /** Appends; returns true when the oldest line had to go. */
  push(item: QueuedLine): boolean {
    let overflowed = false
    if (this.size >= this.capacity) {
      const old = this.items[this.head] as QueuedLine
      this.head++
      overflowed = true
      if (old.batch) this.dropped++
      this.lost ??= { fromSeq: old.seq, dpRank: old.dpRank }
      // Compact once the dead prefix is as big as the live part: O(1) amortized.
      if (this.head >= this.capacity) {
        this.items = this.items.slice(this.head)
        this.head = 0
      }
    }
    this.items.push(item)
    const w = this.waker
    this.waker = undefined
    w?.()
    return overflowed
  }

  /** Up to `max` lines, oldest first, with the overflow Resync (rendered by `resync`) in front. */
  take(max: number, resync: (r: Resync) => string): Array<QueuedLine> {
    const out: Array<QueuedLine> = []
    if (this.lost !== undefined) {
      const next = this.items[this.head]
      const toSeq = next?.seq ?? this.lost.fromSeq
      const r: Resync = { reason: "overflow", dpRank: this.lost.dpRank, fromSeq: this.lost.fromSeq, toSeq }
      out.push({ line: resync(r), batch: false, dpRank: r.dpRank, seq: toSeq })
      this.lost = undefined
    }
    while (out.length < max && this.head < this.items.length) {
      out.push(this.items[this.head] as QueuedLine)
      this.head++
    }
    if (this.head === this.items.length) {
      this.items = []
      this.head = 0
    }
    return out
  }

  /** Calls `wake` once, at the next push (at once if something is waiting). Replaces an earlier waker. */
  onPush(wake: () => void): void {
    if (this.size > 0 || this.lost !== undefined) wake()
    else this.waker = wake
  }

  cancelWake(): void {
    this.waker = undefined
  }
}
