/**
 * The agent -> cgn-kvcached wire format: NDJSON over a Unix stream socket, one JSON object per line,
 * dispatched on "type": "Hello" on every (re)connect, "Batch" per engine batch, "Resync" when events
 * were lost. 64-bit hashes travel as decimal strings (exact in every language). README section `kv`
 * is the spec; this module only renders lines. Pure: no I/O.
 */
import type { BlockHash, KvBatch, KvEvent } from "./KvEvents.ts"

export const KV_WIRE_VERSION = 1

/** Who the events come from; repeated on every line so each line stands alone. */
export interface NodeIdentity {
  readonly node_id: string
  readonly cluster: string
  readonly model: string
  readonly engine: string
}

export type ResyncReason = "gap" | "restart" | "overflow" | "decode"

export interface Resync {
  readonly reason: ResyncReason
  readonly dpRank: number
  /** First seq whose events are lost (or the old stream's next seq, on restart). */
  readonly fromSeq: bigint
  /** The seq the stream continues with. */
  readonly toSeq: bigint
}

const h = (x: BlockHash): string => (typeof x === "bigint" ? x.toString(10) : x)
// seq counts batches from 0: it stays far below 2^53, so a JSON number is exact.
const n = (x: bigint): number => Number(x)

const eventJson = (e: KvEvent): Record<string, unknown> => {
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

export const helloLine = (
  id: NodeIdentity,
  extra: { readonly epoch: string; readonly blockSize: number; readonly dpSize?: number }
): string =>
  `${JSON.stringify({
    type: "Hello",
    version: KV_WIRE_VERSION,
    ...id,
    block_size: extra.blockSize,
    // Data-parallel ranks: Batch and Resync lines carry dp_rank in [0, dp_size), one KV cache each.
    dp_size: extra.dpSize ?? 1,
    epoch: extra.epoch
  })}\n`

export const batchLine = (id: NodeIdentity, b: KvBatch): string =>
  `${JSON.stringify({
    type: "Batch",
    ...id,
    dp_rank: b.dpRank,
    seq: n(b.seq),
    ts: b.ts,
    events: b.events.map(eventJson)
  })}\n`

export const resyncLine = (id: NodeIdentity, r: Resync): string =>
  `${JSON.stringify({
    type: "Resync",
    ...id,
    dp_rank: r.dpRank,
    reason: r.reason,
    from_seq: n(r.fromSeq),
    to_seq: n(r.toSeq)
  })}\n`
