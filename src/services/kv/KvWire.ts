/**
 * Renders what the agent sends cgn-kvcached (the contract is services/kv/KvcachedRpc.ts): the Hello payload
 * on every (re)connect, a Batch record per engine batch, a Resync record when events were lost. 64-bit
 * hashes travel as decimal strings (exact in every language). README section `kv` is the spec; this module
 * only builds records (without their link seq `n`, which the queue gives). Pure: no I/O.
 */

import { Cause, Exit, Schema } from "effect"
import {
  type BatchRecord,
  type HelloPayload,
  KV_WIRE_VERSION,
  type KvEventRecord,
  KvRecord,
  type ResyncReason as ResyncReasonSchema,
  type ResyncRecord
} from "./KvcachedRpc.ts"
import type { BlockHash, KvBatch, KvEvent } from "./KvEvents.ts"

/** Who the events come from; sent in Hello. */
export interface NodeIdentity {
  readonly node_id: string
  readonly cluster: string
  readonly model: string
  readonly engine: string
}

/** The wire schema's reasons (KvcachedRpc.ResyncReason): one list, so a reason cannot exist on one side only. */
export type ResyncReason = typeof ResyncReasonSchema.Type

export interface Resync {
  readonly reason: ResyncReason
  readonly dpRank: number
  /** First seq whose events are lost (or the old stream's next seq, on restart). */
  readonly fromSeq: bigint
  /** The seq the stream continues with. */
  readonly toSeq: bigint
}

const h = (x: BlockHash): string => (typeof x === "bigint" ? x.toString(10) : x)
// seq counts batches from 0, far below 2^53 (KvEvents.splitMessage refuses a seq frame from 2^53 - 1 on): exact.
const n = (x: bigint): number => Number(x)

const eventRecord = (e: KvEvent): KvEventRecord => {
  switch (e.type) {
    case "BlockStored":
      return {
        type: e.type,
        block_hashes: e.blockHashes.map(h),
        parent_block_hash: e.parentBlockHash === null ? null : h(e.parentBlockHash),
        token_ids: e.tokenIds,
        block_size: e.blockSize,
        medium: e.medium,
        ...(e.loraName !== null ? { lora_name: e.loraName } : {}),
        ...(e.groupIdx !== undefined ? { group_idx: e.groupIdx } : {}),
        ...(e.specKind !== undefined ? { kv_cache_spec_kind: e.specKind } : {}),
        ...(e.cacheSalt !== undefined ? { cache_salt: e.cacheSalt } : {})
      }
    case "BlockRemoved":
      return {
        type: e.type,
        block_hashes: e.blockHashes.map(h),
        medium: e.medium,
        ...(e.groupIdx !== undefined ? { group_idx: e.groupIdx } : {})
      }
    case "AllBlocksCleared":
      return { type: e.type }
  }
}

/** A record as queued, before the link gives it its `n`. */
export type KvRecordBody = Omit<BatchRecord, "n"> | Omit<ResyncRecord, "n">

export const hello = (
  id: NodeIdentity,
  extra: { readonly epoch: string; readonly blockSize: number; readonly dpSize?: number }
): HelloPayload => ({
  version: KV_WIRE_VERSION,
  ...id,
  block_size: extra.blockSize,
  // Data-parallel ranks: Batch and Resync records carry dp_rank in [0, dp_size), one KV cache each.
  dp_size: extra.dpSize ?? 1,
  epoch: extra.epoch
})

export const batchRecord = (b: KvBatch): Omit<BatchRecord, "n"> => ({
  type: "Batch",
  dp_rank: b.dpRank,
  seq: n(b.seq),
  ts: b.ts,
  events: b.events.map(eventRecord)
})

export const resyncRecord = (r: Resync): Omit<ResyncRecord, "n"> => ({
  type: "Resync",
  dp_rank: r.dpRank,
  reason: r.reason,
  from_seq: n(r.fromSeq),
  to_seq: n(r.toSeq)
})

/**
 * About what a record costs, in bytes, held in memory or encoded as JSON: what the queue's byte bound
 * counts. An estimate from the shape (no encoding), within a small factor of both.
 */
export const recordBytes = (r: KvRecordBody): number => {
  if (r.type === "Resync") return 96
  let bytes = 96
  for (const e of r.events) {
    bytes += 48
    if (e.type === "AllBlocksCleared") continue
    for (const x of e.block_hashes) bytes += 16 + x.length
    if (e.type === "BlockStored") {
      bytes += 32 + (e.parent_block_hash?.length ?? 0)
      for (const t of e.token_ids) bytes += typeof t === "number" ? 8 : 8 + 8 * t.length
    }
  }
  return bytes
}

const encodeRecord = Schema.encodeUnknownExit(KvRecord)

/**
 * Why kvcached's RPC client would refuse to encode `r` (the wire schema wants safe integers where the engine's
 * msgpack may carry floats or 64-bit values), or undefined when it encodes. The client refuses a whole Push for
 * one such record, so each record is checked before it is sent (`n` is the queue's and always valid).
 */
export const wireError = (r: KvRecordBody | KvRecord): string | undefined => {
  const exit = encodeRecord({ n: 0, ...r })
  if (Exit.isSuccess(exit)) return undefined
  const e = Cause.squash(exit.cause)
  return (e instanceof Error ? e.message : String(e)).replace(/\s*\n\s*/g, " ")
}
