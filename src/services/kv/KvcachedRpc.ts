/**
 * The agent -> cgn-kvcached contract (wire version 2): an effect RPC group served by cgn-kvcached on its
 * Unix socket, NDJSON-framed (`RpcSerialization.layerNdjson`). The agent is the client. Version 1 wrote
 * NDJSON lines and never heard back, so batches in flight when kvcached restarted vanished without a
 * Resync; here every record carries a link sequence number (`n`, per agent epoch, gapless over Batch and
 * Resync records) and kvcached answers each Push with the last `n` it has applied. The agent keeps what
 * is not yet acknowledged and resends it after a reconnect; the receiver skips `n` it already applied.
 * Shipped as `cgn-agent/kvcached` so a kvcached implementation imports these schemas instead of copying
 * them. README section `kv` is the prose spec. Pure: schemas only, no I/O.
 */
import { Schema } from "effect"
import { Rpc, RpcGroup } from "effect/rpc"

export const KV_WIRE_VERSION = 2

/**
 * A block hash: the decimal string of the integer the engine sent (vLLM: unsigned 64-bit, often >= 2^63;
 * SGLang: signed 64-bit, may be negative), or `0x` hex when the engine sends digest bytes.
 */
export const BlockHash = Schema.String

export const BlockStored = Schema.Struct({
  type: Schema.Literal("BlockStored"),
  block_hashes: Schema.Array(BlockHash),
  parent_block_hash: Schema.NullOr(BlockHash),
  // SGLang spec-decode may send [t, t+1] pairs.
  token_ids: Schema.Array(Schema.Union([Schema.Int, Schema.Array(Schema.Int)])),
  block_size: Schema.NullOr(Schema.Int),
  medium: Schema.NullOr(Schema.String),
  lora_name: Schema.optionalKey(Schema.String),
  group_idx: Schema.optionalKey(Schema.Int),
  kv_cache_spec_kind: Schema.optionalKey(Schema.String),
  /** The request's cache salt (SGLang BlockStoredWithMetadata slot 7; vLLM puts it in the hash instead). */
  cache_salt: Schema.optionalKey(Schema.String)
})

export const BlockRemoved = Schema.Struct({
  type: Schema.Literal("BlockRemoved"),
  block_hashes: Schema.Array(BlockHash),
  medium: Schema.NullOr(Schema.String),
  group_idx: Schema.optionalKey(Schema.Int)
})

export const AllBlocksCleared = Schema.Struct({ type: Schema.Literal("AllBlocksCleared") })

export const KvEventRecord = Schema.Union([BlockStored, BlockRemoved, AllBlocksCleared])
export type KvEventRecord = typeof KvEventRecord.Type

/** Link sequence number: counts the records of one agent epoch from 0, without holes. */
const LinkSeq = Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))
/** An engine batch counter (far below 2^53, so a JSON number is exact). */
const EngineSeq = Schema.Int

/** One engine batch. `seq` is the engine's per-`dp_rank` counter. */
export const BatchRecord = Schema.Struct({
  type: Schema.Literal("Batch"),
  n: LinkSeq,
  dp_rank: Schema.Int,
  seq: EngineSeq,
  ts: Schema.Number,
  events: Schema.Array(KvEventRecord)
})
export type BatchRecord = typeof BatchRecord.Type

/**
 * Events of `dp_rank` in `[from_seq, to_seq)` are lost; `to_seq` is the seq the stream continues with.
 * kvcached drops this node's blocks for that rank and rebuilds from the records that follow.
 */
export const ResyncReason = Schema.Literals(["gap", "restart", "overflow", "decode"])
export const ResyncRecord = Schema.Struct({
  type: Schema.Literal("Resync"),
  n: LinkSeq,
  dp_rank: Schema.Int,
  reason: ResyncReason,
  from_seq: EngineSeq,
  to_seq: EngineSeq
})
export type ResyncRecord = typeof ResyncRecord.Type

export const KvRecord = Schema.Union([BatchRecord, ResyncRecord])
export type KvRecord = typeof KvRecord.Type

/** Where the records come from; sent once per connection. */
export const HelloPayload = Schema.Struct({
  version: Schema.Int,
  node_id: Schema.String,
  cluster: Schema.String,
  /** The served model name. */
  model: Schema.String,
  /** The engine kind (vllm, sglang, ...). */
  engine: Schema.String,
  block_size: Schema.Int,
  /** Data-parallel ranks: records carry dp_rank in [0, dp_size), one KV cache each. */
  dp_size: Schema.Int,
  /** This agent run's id: a new epoch means a new stream (`n` starts at 0 again, old state is void). */
  epoch: Schema.String
})
export type HelloPayload = typeof HelloPayload.Type

/** The last `n` applied for this node and epoch; null when the receiver holds nothing of this epoch. */
export const Applied = Schema.Struct({ applied: Schema.NullOr(LinkSeq) })
export type Applied = typeof Applied.Type

export const PushPayload = Schema.Struct({
  node_id: Schema.String,
  epoch: Schema.String,
  /** In `n` order; after a reconnect the first ones may repeat what the receiver already applied. */
  records: Schema.Array(KvRecord)
})
export type PushPayload = typeof PushPayload.Type

/** A Push whose node and epoch were not announced by Hello on this receiver (it restarted): say Hello again. */
export class UnknownStream extends Schema.TaggedError<UnknownStream>()("UnknownStream", {
  node_id: Schema.String,
  epoch: Schema.String
}) {}

/** The agent speaks a wire version the receiver does not. */
export class UnsupportedVersion extends Schema.TaggedError<UnsupportedVersion>()("UnsupportedVersion", {
  version: Schema.Int,
  supported: Schema.Array(Schema.Int)
}) {}

/**
 * Hello: first call on every connection; the answer tells the agent which records it can forget.
 * Push: records in `n` order; the answer acknowledges every record up to `applied`.
 */
export class KvcachedRpcs extends RpcGroup.make(
  Rpc.make("Hello", { payload: HelloPayload, success: Applied, error: UnsupportedVersion }),
  Rpc.make("Push", { payload: PushPayload, success: Applied, error: UnknownStream })
) {}
