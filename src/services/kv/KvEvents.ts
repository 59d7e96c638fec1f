/**
 * KV-cache events as the engines publish them: one ZMQ message `[topic, seq (8-byte BE), msgpack batch]`
 * decoded into a typed batch, the replay ROUTER's replies in both layouts, each data-parallel rank's
 * endpoint, and the per-publisher sequence check that tells in-order, gap and engine restart apart.
 * Accepts both event encodings (maps with "type", tagged arrays: legacy vLLM and SGLang) and both batch
 * shapes ([ts, events, dp_rank] and the older [ts, events]). Pure: no I/O, no node:* imports.
 */
import { decode } from "@msgpack/msgpack"

/** An integer hash as the engine sent it (vLLM: uint64, SGLang: int64), or raw digest bytes as `0x` hex. */
export type BlockHash = bigint | string

export type TokenIds = ReadonlyArray<number | ReadonlyArray<number>>

export type KvEvent =
  | {
      readonly type: "BlockStored"
      readonly blockHashes: ReadonlyArray<BlockHash>
      readonly parentBlockHash: BlockHash | null
      readonly tokenIds: TokenIds
      readonly blockSize: number | null
      readonly medium: string | null
      readonly loraName: string | null
      readonly groupIdx: number | undefined
      readonly specKind: string | undefined
      /** SGLang `BlockStoredWithMetadata.metadata.cache_salt`: the request's salt (its hashes are salted). */
      readonly cacheSalt?: string | undefined
    }
  | {
      readonly type: "BlockRemoved"
      readonly blockHashes: ReadonlyArray<BlockHash>
      readonly medium: string | null
      readonly groupIdx: number | undefined
    }
  | { readonly type: "AllBlocksCleared" }

export interface KvBatch {
  readonly topic: string
  readonly seq: bigint
  /** Unix seconds (float) stamped by the engine. */
  readonly ts: number
  readonly dpRank: number
  readonly events: ReadonlyArray<KvEvent>
  /** Events of a type this decoder does not know; skipped. */
  readonly unknownTypes: number
  /** Map keys this decoder does not know (newer engine fields); skipped. */
  readonly unknownKeys: number
}

export type DecodeResult =
  | { readonly ok: true; readonly batch: KvBatch }
  /** `seq` is known when only the payload was bad: that batch's events are lost. */
  | { readonly ok: false; readonly seq: bigint | undefined; readonly error: string }

/** The replay ROUTER's end-of-replay sequence number (-1 as signed). */
export const END_OF_REPLAY = 0xffffffffffffffffn

export const readSeq = (frame: Uint8Array): bigint | undefined =>
  frame.length === 8 ? new DataView(frame.buffer, frame.byteOffset, 8).getBigUint64(0, false) : undefined

export const seqFrame = (seq: bigint): Uint8Array => {
  const out = new Uint8Array(8)
  new DataView(out.buffer).setBigUint64(0, BigInt.asUintN(64, seq), false)
  return out
}

const hex = (b: Uint8Array): string => `0x${Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("")}`

class Malformed extends Error {}

const hashOf = (v: unknown): BlockHash => {
  if (typeof v === "bigint") return v
  if (typeof v === "number" && Number.isInteger(v)) return BigInt(v)
  if (v instanceof Uint8Array) return hex(v)
  throw new Malformed(`block hash is ${typeof v}`)
}
const hashes = (v: unknown): ReadonlyArray<BlockHash> => {
  if (!Array.isArray(v)) throw new Malformed("block_hashes is not an array")
  return v.map(hashOf)
}
const optHash = (v: unknown): BlockHash | null => (v === null || v === undefined ? null : hashOf(v))
const num = (v: unknown): number | undefined =>
  typeof v === "number" ? v : typeof v === "bigint" ? Number(v) : undefined
const str = (v: unknown): string | null => (typeof v === "string" ? v : null)
const tokens = (v: unknown): TokenIds => {
  if (v === null || v === undefined) return []
  if (!Array.isArray(v)) throw new Malformed("token_ids is not an array")
  // SGLang spec-decode paths may send [t, t+1] pairs; keep them as they came.
  return v.map((t) => (Array.isArray(t) ? t.map((x) => num(x) ?? 0) : (num(t) ?? 0)))
}

/** Legacy array positions (≤ vLLM 0.23): names by index after the tag; the map encoding uses the same names. */
const STORED_POS = [
  "block_hashes",
  "parent_block_hash",
  "token_ids",
  "block_size",
  "lora_id",
  "medium",
  "lora_name",
  "extra_keys",
  "group_idx",
  "kv_cache_spec_kind",
  "kv_cache_spec_sliding_window"
]
const REMOVED_POS = ["block_hashes", "medium", "group_idx"]
// "metadata": the map form of SGLang's salted BlockStored (sgl-project/sglang PR #37271, closed).
const STORED_KEYS = new Set(["type", "metadata", ...STORED_POS])
const REMOVED_KEYS = new Set(["type", ...REMOVED_POS])

type Fields = Record<string, unknown>

const isMap = (v: unknown): v is Fields =>
  v !== null && typeof v === "object" && !Array.isArray(v) && !(v instanceof Uint8Array)

const build = (type: string, f: Fields): KvEvent | undefined => {
  switch (type) {
    case "BlockStored":
      return {
        type,
        blockHashes: hashes(f.block_hashes),
        parentBlockHash: optHash(f.parent_block_hash),
        tokenIds: tokens(f.token_ids),
        blockSize: num(f.block_size) ?? null,
        medium: str(f.medium),
        loraName: str(f.lora_name),
        groupIdx: num(f.group_idx),
        specKind: str(f.kv_cache_spec_kind) ?? undefined,
        cacheSalt: isMap(f.metadata) ? (str(f.metadata.cache_salt) ?? undefined) : undefined
      }
    case "BlockRemoved":
      return { type, blockHashes: hashes(f.block_hashes), medium: str(f.medium), groupIdx: num(f.group_idx) }
    case "AllBlocksCleared":
      return { type }
    default:
      return undefined
  }
}

/** One event in either encoding; `undefined` for an unknown type. Counts unknown keys into `stats`. */
export const decodeEvent = (raw: unknown, stats: { unknownKeys: number }): KvEvent | undefined => {
  if (Array.isArray(raw)) {
    const [tag, ...rest] = raw as Array<unknown>
    if (typeof tag !== "string") throw new Malformed("legacy event without a tag")
    const pos = tag === "BlockStored" ? STORED_POS : tag === "BlockRemoved" ? REMOVED_POS : []
    const f: Fields = {}
    rest.forEach((v, i) => {
      // SGLang's BlockStoredWithMetadata keeps the tag "BlockStored" and puts a `{cache_salt}` struct in
      // slot 7, where vLLM has lora_name (str | nil): a map there is the metadata
      // (sgl-project/sglang python/sglang/srt/disaggregation/kv_events.py).
      const k = tag === "BlockStored" && i === 6 && isMap(v) ? "metadata" : pos[i]
      if (k === undefined) stats.unknownKeys++
      else f[k] = v
    })
    return build(tag, f)
  }
  if (isMap(raw)) {
    const f = raw
    if (typeof f.type !== "string") throw new Malformed("event map without a type")
    const known = f.type === "BlockStored" ? STORED_KEYS : f.type === "BlockRemoved" ? REMOVED_KEYS : undefined
    if (known !== undefined) for (const k of Object.keys(f)) if (!known.has(k)) stats.unknownKeys++
    return build(f.type, f)
  }
  throw new Malformed("event is neither a map nor an array")
}

/** Decodes the msgpack batch payload. Throws on a malformed one. */
export const decodePayload = (payload: Uint8Array): Omit<KvBatch, "topic" | "seq"> & { readonly rawEvents: number } => {
  const v = decode(payload, { useBigInt64: true })
  if (!Array.isArray(v) || v.length < 2) throw new Malformed("batch is not [ts, events, dp_rank?]")
  const [ts, evs, rank] = v as [unknown, unknown, unknown]
  if (!Array.isArray(evs)) throw new Malformed("batch events is not an array")
  const stats = { unknownKeys: 0 }
  const events: Array<KvEvent> = []
  let unknownTypes = 0
  for (const raw of evs) {
    const e = decodeEvent(raw, stats)
    if (e === undefined) unknownTypes++
    else events.push(e)
  }
  return {
    ts: num(ts) ?? 0,
    dpRank: num(rank) ?? 0,
    events,
    unknownTypes,
    unknownKeys: stats.unknownKeys,
    rawEvents: evs.length
  }
}

/**
 * A batch as it came off the wire, its payload not decoded yet: enough to check its seq and queue it. The
 * bridge decodes it only when it is sent to kvcached (`decodeRaw`), so a batch that is dropped while kvcached
 * is away costs its bytes and nothing more (no events in the heap, no decode garbage).
 */
export interface RawBatch {
  readonly topic: string
  readonly seq: bigint
  readonly dpRank: number
  readonly payload: Uint8Array
}

export type SplitResult =
  | { readonly ok: true; readonly raw: Omit<RawBatch, "dpRank"> }
  | { readonly ok: false; readonly seq: undefined; readonly error: string }

/** Seqs from here on cannot be sent (the wire's seq and seq + 1 must be safe integers). */
const MAX_WIRE_SEQ = BigInt(Number.MAX_SAFE_INTEGER)

/** One ZMQ message (3 frames: topic, seq, payload) split without decoding the payload. */
export const splitMessage = (frames: ReadonlyArray<Uint8Array>): SplitResult => {
  if (frames.length !== 3) return { ok: false, seq: undefined, error: `expected 3 frames, got ${frames.length}` }
  const [topicF, seqF, payload] = frames as [Uint8Array, Uint8Array, Uint8Array]
  const seq = readSeq(seqF)
  if (seq === undefined) return { ok: false, seq: undefined, error: `seq frame has ${seqF.length} bytes, not 8` }
  // An engine counts batches from 0 and never gets near 2^53; a seq up there is a corrupt frame, and one taken as
  // the stream's position would put it into every Resync after it, which the wire (a JSON number) cannot carry.
  if (seq >= MAX_WIRE_SEQ) return { ok: false, seq: undefined, error: `seq ${seq} is not below 2^53 - 1` }
  return { ok: true, raw: { topic: new TextDecoder().decode(topicF), seq, payload } }
}

/** A raw batch's payload decoded; the rank is the raw batch's (the endpoint's), not the payload's. */
export const decodeRaw = (raw: RawBatch): DecodeResult => {
  const d = decodeParts(raw.topic, raw.seq, raw.payload)
  return d.ok ? { ok: true, batch: { ...d.batch, dpRank: raw.dpRank } } : d
}

/** One ZMQ message (3 frames) into a batch (the payload's own rank, if it has one). */
export const decodeMessage = (frames: ReadonlyArray<Uint8Array>): DecodeResult => {
  if (frames.length !== 3) return { ok: false, seq: undefined, error: `expected 3 frames, got ${frames.length}` }
  const [topicF, seqF, payload] = frames as [Uint8Array, Uint8Array, Uint8Array]
  return decodeParts(new TextDecoder().decode(topicF), seqF, payload)
}

/** What a replay DEALER reads: a batch (its payload not decoded yet, as the live stream's), the end, or neither. */
export type ReplayReply =
  | { readonly end: true }
  | { readonly end: false; readonly ok: true; readonly raw: Omit<RawBatch, "dpRank"> }
  | { readonly end: false; readonly ok: false; readonly error: string }

/**
 * One replay ROUTER reply as a DEALER receives it (identity stripped). vLLM >= 0.26 sends the topic too:
 * `["", topic, seq8, payload]`, end marker `["", "", 0xFF..FF, ""]` (vllm-project/vllm PR #45177); older
 * vLLM and SGLang send `["", seq8, payload]`, end marker `["", 0xFF..FF, ""]`. `topic` names the
 * batches of the 3-frame layout, which carries none. The payload is decoded when the batch is sent (decodeRaw).
 */
export const splitReplayReply = (frames: ReadonlyArray<Uint8Array>, topic: string): ReplayReply => {
  const n = frames.length
  if ((n !== 3 && n !== 4) || (frames[0] as Uint8Array).length !== 0) {
    return { end: false, ok: false, error: `unexpected replay reply of ${n} frames` }
  }
  const seqF = frames[n - 2] as Uint8Array
  const seq = readSeq(seqF)
  if (seq === END_OF_REPLAY) return { end: true }
  if (seq === undefined) return { end: false, ok: false, error: `seq frame has ${seqF.length} bytes, not 8` }
  const name = n === 4 ? new TextDecoder().decode(frames[1]) : topic
  return { end: false, ok: true, raw: { topic: name, seq, payload: frames[n - 1] as Uint8Array } }
}

const decodeParts = (topic: string, seqF: Uint8Array | bigint, payload: Uint8Array): DecodeResult => {
  const seq = typeof seqF === "bigint" ? seqF : readSeq(seqF)
  if (seq === undefined)
    return { ok: false, seq: undefined, error: `seq frame has ${(seqF as Uint8Array).length} bytes, not 8` }
  try {
    const { rawEvents: _, ...rest } = decodePayload(payload)
    return { ok: true, batch: { topic, seq, ...rest } }
  } catch (err) {
    return { ok: false, seq, error: err instanceof Error ? err.message : String(err) }
  }
}

/** How one sequence number relates to the one expected from the same publisher. */
export type SeqVerdict =
  | { readonly kind: "next" }
  /** The first batch seen from this publisher; batches [0, seq) were published before we listened. */
  | { readonly kind: "join"; readonly missed: boolean }
  /** Batches [from, to) never arrived. */
  | { readonly kind: "gap"; readonly from: bigint; readonly to: bigint }
  /** The counter went down: the engine restarted; everything it held is gone. */
  | { readonly kind: "restart"; readonly from: bigint; readonly to: bigint }

/** `expected` is last seq + 1, or undefined before the first batch. */
export const checkSeq = (expected: bigint | undefined, seq: bigint): SeqVerdict => {
  if (expected === undefined) return { kind: "join", missed: seq > 0n }
  if (seq === expected) return { kind: "next" }
  if (seq > expected) return { kind: "gap", from: expected, to: seq }
  return { kind: "restart", from: expected, to: seq }
}

/**
 * The endpoint data-parallel rank `rank` publishes on: TCP port + rank, `inproc://x` -> `inproc://x_dp<rank>`
 * (vllm-project/vllm vllm/distributed/kv_events.py and sgl-project/sglang
 * python/sglang/srt/disaggregation/kv_events.py, `offset_endpoint_port`). Rank 0 keeps the endpoint as
 * given; any other endpoint (ipc://) cannot be offset: the engines refuse it, and so does the config check.
 */
export const rankEndpoint = (endpoint: string, rank: number): string | undefined => {
  if (rank === 0) return endpoint
  if (endpoint.includes("inproc")) return `${endpoint}_dp${rank}`
  const m = /^(tcp:\/\/.*):(\d+)$/.exec(endpoint)
  return m === null ? undefined : `${m[1]}:${Number(m[2]) + rank}`
}

/**
 * The most messages a rank's SUB socket holds that the reader has not taken (ZMQ's receive high-water mark):
 * a message's share of `kv.max_queue_bytes` at 32 KiB a batch (a long prefill's batch is ~100 KB, a decode step's
 * under 1 KB), so that what a reader behind its engine leaves in the socket stays near the bridge's own bound
 * (1,024 messages with the default 32 MiB), not ZMQ's default of 1,000 nor the 100,000 that once held 1.2 GB.
 * Past it ZMQ drops at the SUB: the sequencer sees a gap, replayed or resynced.
 */
export const subscriberHighWaterMark = (maxQueueBytes: number): number =>
  Math.min(100_000, Math.max(256, Math.floor(maxQueueBytes / 32_768)))
