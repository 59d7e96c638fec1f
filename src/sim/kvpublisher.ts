// KV-event publisher in the engines' wire format: per data-parallel rank a ZMQ PUB sending
// [topic, seq (8-byte BE), msgpack batch] where the batch is [ts, events, dp_rank], on the configured port
// plus the rank; a ROUTER on replay_endpoint (+ rank) answers [identity, "", seq8] with every buffered batch
// from that seq, then the end marker seq 0xFFFFFFFFFFFFFFFF with an empty payload. vLLM >= 0.26 puts the
// topic in each reply (["", topic, seq8, payload], end ["", "", END, ""], vllm-project/vllm PR #45177);
// older vLLM (--sim-kv-replay-3-frames) and SGLang reply ["", seq8, payload].
// vLLM: uint64 hashes, events as maps with "type" (legacy tagged arrays behind --sim-kv-legacy-arrays).
// SGLang: signed int64 hashes, events always tagged arrays (msgspec array_like=True); a salted BlockStored
// (BlockStoredWithMetadata, tag still "BlockStored") carries {cache_salt} in array slot 7
// (sgl-project/sglang python/sglang/srt/disaggregation/kv_events.py).
import { encode } from "@msgpack/msgpack"
import * as zmq from "zeromq"
import type { KvEvent } from "./kvblocks.ts"
import type { Flavor } from "./simConfig.ts"

export interface KvEventsSettings {
  readonly endpoint: string
  readonly replayEndpoint: string | undefined
  readonly topic: string
  readonly bufferSteps: number
  readonly hwm: number
}

/** The effective KV-events settings, or undefined when the flavor's config leaves them off. */
export const kvEventsSettings = (
  flavor: Flavor,
  cfg: Record<string, unknown> | undefined
): KvEventsSettings | undefined => {
  if (cfg === undefined) return undefined
  const publisher = cfg.publisher
  const on =
    flavor === "vllm"
      ? cfg.enable_kv_cache_events === true && publisher !== "null"
      : flavor === "sglang" && publisher === "zmq"
  if (!on) return undefined
  const str = (k: string) => (typeof cfg[k] === "string" ? (cfg[k] as string) : undefined)
  const int = (k: string, d: number) => (typeof cfg[k] === "number" ? (cfg[k] as number) : d)
  return {
    endpoint: str("endpoint") ?? "tcp://*:5557",
    replayEndpoint: str("replay_endpoint"),
    topic: str("topic") ?? "",
    bufferSteps: int("buffer_steps", 10_000),
    hwm: int("hwm", 100_000)
  }
}

/**
 * The engines' rule: bind for wildcard/IPv6-any/ipc/inproc endpoints, connect otherwise; newest SGLang also
 * binds `0.0.0.0` (sgl-project/sglang python/sglang/srt/disaggregation/kv_events.py `_socket_setup`).
 */
export const shouldBind = (endpoint: string, flavor: Flavor = "vllm"): boolean =>
  endpoint.includes("*") ||
  endpoint.includes("::") ||
  (flavor === "sglang" && endpoint.includes("0.0.0.0")) ||
  endpoint.startsWith("ipc://") ||
  endpoint.startsWith("inproc://")

const END_SEQ = 0xffffffffffffffffn

const seqFrame = (seq: bigint): Buffer => {
  const b = Buffer.alloc(8)
  b.writeBigUInt64BE(seq)
  return b
}

/** The endpoint of DP rank `rank`: TCP port + rank, inproc suffix `_dp<rank>` (both engines' `offset_endpoint_port`). */
export const offsetEndpoint = (endpoint: string, rank: number): string => {
  if (rank === 0) return endpoint
  if (endpoint.includes("inproc")) return `${endpoint}_dp${rank}`
  const i = endpoint.lastIndexOf(":")
  if (!endpoint.includes("tcp") || i < 0)
    throw new Error(`Invalid endpoint: must contain 'inproc' or 'tcp': ${endpoint}`)
  return `${endpoint.slice(0, i)}:${Number(endpoint.slice(i + 1)) + rank}`
}

export type EventShape = "map" | "vllm-array" | "sglang-array"

/** Encodes one event in the flavor's shape. */
export const encodeEvent = (e: KvEvent, shape: EventShape, signed: boolean): unknown => {
  const h = (x: bigint) => (signed ? BigInt.asIntN(64, x) : x)
  switch (e.type) {
    case "BlockStored": {
      const hashes = e.blockHashes.map(h)
      const parent = e.parentBlockHash === null ? null : h(e.parentBlockHash)
      const salt = e.cacheSalt
      if (shape === "sglang-array") {
        const base = ["BlockStored", hashes, parent, e.tokenIds, e.blockSize, null, "GPU"]
        return salt === undefined ? base : [...base, { cache_salt: salt }]
      }
      if (shape === "vllm-array") return ["BlockStored", hashes, parent, e.tokenIds, e.blockSize, null, "GPU", null]
      return {
        type: "BlockStored",
        block_hashes: hashes,
        parent_block_hash: parent,
        token_ids: e.tokenIds,
        block_size: e.blockSize,
        lora_id: null,
        medium: "GPU",
        lora_name: null,
        // vLLM's per-block extra keys: the salt is part of the first block's key only.
        extra_keys: hashes.map((_, i) => (salt !== undefined && parent === null && i === 0 ? [salt] : null)),
        group_idx: 0,
        kv_cache_spec_kind: "full_attention"
      }
    }
    case "BlockRemoved":
      return shape === "map"
        ? { type: "BlockRemoved", block_hashes: e.blockHashes.map(h), medium: "GPU", group_idx: 0 }
        : ["BlockRemoved", e.blockHashes.map(h), "GPU"]
    case "AllBlocksCleared":
      return shape === "map" ? { type: "AllBlocksCleared" } : ["AllBlocksCleared"]
  }
}

export interface PublisherOptions {
  readonly settings: KvEventsSettings
  readonly flavor: Flavor
  /** vLLM only: legacy tagged arrays instead of maps (SGLang always sends arrays). */
  readonly legacy: boolean
  /** vLLM only: the pre-0.26 3-frame replay reply (SGLang always replies with 3 frames). */
  readonly replay3Frames: boolean
  /** Data-parallel ranks, each with its own publisher, ports and sequence. */
  readonly dp: number
  /** Stop publishing after this many batches per rank (fault switch). */
  readonly stopAfter: number | undefined
  /** Skip this sequence number on every rank (fault switch). */
  readonly skipSeq: number | undefined
  readonly log: (msg: string, fields?: Record<string, unknown>) => void
}

/** One rank's PUB, replay ROUTER, buffer and counter. */
class RankPublisher {
  private readonly pub: zmq.Publisher
  private router: zmq.Router | undefined
  private readonly buffer: Array<[bigint, Buffer]> = []
  private seq = 0n
  private published = 0
  private sending: Promise<void> = Promise.resolve()
  private closed = false
  private readonly opts: PublisherOptions
  private readonly rank: number

  constructor(opts: PublisherOptions, rank: number) {
    this.opts = opts
    this.rank = rank
    this.pub = new zmq.Publisher({ sendHighWaterMark: opts.settings.hwm, linger: 0 })
  }

  async start(): Promise<void> {
    const { settings, flavor, log } = this.opts
    const endpoint = offsetEndpoint(settings.endpoint, this.rank)
    const bind = shouldBind(endpoint, flavor)
    if (bind) await this.pub.bind(endpoint)
    else this.pub.connect(endpoint)
    log("kv events publisher", { endpoint, mode: bind ? "bind" : "connect", dpRank: this.rank })
    if (settings.replayEndpoint !== undefined) {
      const replay = offsetEndpoint(settings.replayEndpoint, this.rank)
      this.router = new zmq.Router({ linger: 0 })
      await this.router.bind(replay)
      log("kv events replay", { endpoint: replay, dpRank: this.rank })
      void this.serveReplay(this.router)
    }
  }

  get lastSeq(): number {
    return Number(this.seq) - 1
  }

  send(events: ReadonlyArray<KvEvent>): void {
    const o = this.opts
    if (this.closed || (o.stopAfter !== undefined && this.published >= o.stopAfter)) return
    if (o.skipSeq !== undefined && this.seq === BigInt(o.skipSeq)) this.seq++
    const seq = this.seq++
    this.published++
    let ts = Date.now() / 1000
    if (Number.isInteger(ts)) ts += 0.0001 // keep msgpack float64
    const shape: EventShape = o.flavor === "sglang" ? "sglang-array" : o.legacy ? "vllm-array" : "map"
    const encoded = events.map((e) => encodeEvent(e, shape, o.flavor === "sglang"))
    const payload = Buffer.from(encode([ts, encoded, this.rank], { useBigInt64: true }))
    this.buffer.push([seq, payload])
    if (this.buffer.length > o.settings.bufferSteps) this.buffer.shift()
    const frames = [Buffer.from(o.settings.topic), seqFrame(seq), payload]
    this.sending = this.sending
      .then(() => this.pub.send(frames))
      .catch((err: unknown) => o.log("kv events send failed", { error: String(err), dpRank: this.rank }))
  }

  private async serveReplay(router: zmq.Router): Promise<void> {
    const withTopic = this.opts.flavor === "vllm" && !this.opts.replay3Frames
    const topic = Buffer.from(this.opts.settings.topic)
    const empty = Buffer.alloc(0)
    try {
      for await (const frames of router) {
        if (frames.length !== 3 || (frames[2]?.length ?? 0) !== 8) {
          this.opts.log("kv events replay: bad request", { frames: frames.length })
          continue
        }
        const [identity, , start] = frames as [Buffer, Buffer, Buffer]
        const from = start.readBigUInt64BE()
        for (const [seq, payload] of this.buffer) {
          if (seq < from) continue
          await router.send(
            withTopic ? [identity, empty, topic, seqFrame(seq), payload] : [identity, empty, seqFrame(seq), payload]
          )
        }
        await router.send(
          withTopic ? [identity, empty, empty, seqFrame(END_SEQ), empty] : [identity, empty, seqFrame(END_SEQ), empty]
        )
      }
    } catch (err) {
      if (!this.closed) this.opts.log("kv events replay stopped", { error: String(err), dpRank: this.rank })
    }
  }

  close(): void {
    this.closed = true
    this.pub.close()
    this.router?.close()
  }
}

/**
 * The engine's publishers, one per DP rank, each with its own PUB on the endpoint offset by the rank, its own
 * replay ROUTER and `_seq_gen` from 0, stamping the rank into its batches. vLLM: "each DP rank runs its own
 * EventPublisher instance", ZmqEventPublisher on offset_endpoint_port(endpoint, data_parallel_rank)
 * (vllm-project/vllm vllm/distributed/kv_events.py). SGLang: one ZmqEventPublisher per scheduler that owns a
 * KV cache, offset by select_kv_publisher_dp_rank(), which is the replica's dp_rank under plain --dp-size and
 * the attention-DP rank under --enable-dp-attention (sgl-project/sglang
 * python/sglang/srt/disaggregation/kv_events.py). Older SGLang offset by attn_dp_rank alone, which is 0 for
 * every plain-DP replica: the second replica failed to bind the same port (fixed upstream with a regression
 * test; not modelled). Every engine step's events go out as one batch on the publisher of the rank whose
 * cache made them.
 */
export class KvPublisher {
  private readonly ranks: ReadonlyArray<RankPublisher>
  /** Events queued this tick, per rank. */
  private readonly pending = new Map<number, Array<KvEvent>>()
  private flushScheduled = false
  private last = 0
  private closed = false

  constructor(opts: PublisherOptions) {
    this.ranks = Array.from({ length: Math.max(1, opts.dp) }, (_, r) => new RankPublisher(opts, r))
  }

  async start(): Promise<void> {
    for (const r of this.ranks) await r.start()
  }

  /** Queues events of DP rank `rank`'s cache; everything queued in one tick for one rank is one batch (one step). */
  publish(events: ReadonlyArray<KvEvent>, rank: number): void {
    if (events.length === 0 || this.closed) return
    let queued = this.pending.get(rank)
    if (queued === undefined) {
      queued = []
      this.pending.set(rank, queued)
    }
    for (const e of events) queued.push(e)
    if (!this.flushScheduled) {
      this.flushScheduled = true
      setImmediate(() => this.flush())
    }
  }

  /** Sends one batch on every rank at once (each rank's own cache was cleared). */
  publishAll(events: ReadonlyArray<KvEvent>): void {
    if (events.length === 0 || this.closed) return
    for (const r of this.ranks) r.send(events)
  }

  /** The last seq of the rank that published last. */
  get lastSeq(): number {
    return (this.ranks[this.last] as RankPublisher).lastSeq
  }

  /** The last seq rank `rank` published (-1: none yet). */
  rankLastSeq(rank: number): number | null {
    return this.ranks[rank]?.lastSeq ?? null
  }

  private flush(): void {
    this.flushScheduled = false
    const batches = [...this.pending]
    this.pending.clear()
    if (this.closed) return
    for (const [rank, events] of batches) {
      const pub = this.ranks[rank]
      if (events.length === 0 || pub === undefined) continue
      this.last = rank
      pub.send(events)
    }
  }

  close(): void {
    this.closed = true
    for (const r of this.ranks) r.close()
  }
}
