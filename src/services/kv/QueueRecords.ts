/**
 * The records of the KV bridge's queue (KvQueue.ts): as queued, as prepared for sending, as sent and held until
 * kvcached acknowledges them.
 */
/** A record waiting for its link seq (`n`, given when it is taken). */
export interface QueuedRecord<R> {
  readonly record: R
  /** True for a Batch (counted as forwarded/dropped); false for a Resync. */
  readonly batch: boolean
  readonly dpRank: number
  /** The first engine seq this record covers (a batch's seq; a Resync's from_seq). */
  readonly fromSeq: bigint
  /** The seq the stream continues with after it (seq + 1; a Resync's to_seq). */
  readonly nextSeq: bigint
  /** Its approximate size in memory and on the wire. */
  readonly bytes: number
}

/**
 * What `take`'s preparation made of a record: the record to send and whether a batch was lost on the way (it
 * could not be prepared and is sent as something else, e.g. a Resync of its seq): such a batch counts as
 * dropped, never as forwarded when kvcached acknowledges what replaced it.
 */
export interface Prepared<R> {
  readonly record: R
  readonly dropped: boolean
}

export interface SentRecord<R> {
  readonly n: number
  readonly record: R
  /** Still a batch once prepared (its acknowledgement counts it as forwarded). */
  readonly batch: boolean
  readonly bytes: number
  /** The rank and seq range it covers (as queued): what a Resync says is lost if it cannot be sent. */
  readonly dpRank: number
  readonly fromSeq: bigint
  readonly nextSeq: bigint
}
