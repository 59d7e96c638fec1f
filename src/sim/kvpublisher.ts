// KV-event publisher in vLLM's wire format: a ZMQ PUB sending [topic, seq (8-byte BE), msgpack batch]
// where the batch is [ts, events, dp_rank]; a ROUTER on replay_endpoint answers [identity, "", seq8] with
// every buffered batch from that seq, then the end marker seq 0xFFFFFFFFFFFFFFFF with an empty payload.
// Hashes are uint64 BigInts (vLLM) or signed int64 (SGLang); events are maps with "type" or legacy arrays.
import { encode } from "@msgpack/msgpack"
import * as zmq from "zeromq"
import type { Flavor } from "./args.ts"
import type { KvEvent } from "./kvblocks.ts"

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

/** vLLM's rule: bind for wildcard/IPv6-any/ipc/inproc endpoints, connect otherwise. */
export const shouldBind = (endpoint: string): boolean =>
  endpoint.includes("*") || endpoint.includes("::") || endpoint.startsWith("ipc://") || endpoint.startsWith("inproc://")

const END_SEQ = 0xffffffffffffffffn

const seqFrame = (seq: bigint): Buffer => {
  const b = Buffer.alloc(8)
  b.writeBigUInt64BE(seq)
  return b
}

/** Encodes one event in the map (current) or tagged-array (legacy) shape. */
export const encodeEvent = (e: KvEvent, legacy: boolean, signed: boolean): unknown => {
  const h = (x: bigint) => (signed ? BigInt.asIntN(64, x) : x)
  switch (e.type) {
    case "BlockStored": {
      const hashes = e.blockHashes.map(h)
      const parent = e.parentBlockHash === null ? null : h(e.parentBlockHash)
      if (legacy) return ["BlockStored", hashes, parent, e.tokenIds, e.blockSize, null, "GPU", null]
      return {
        type: "BlockStored",
        block_hashes: hashes,
        parent_block_hash: parent,
        token_ids: e.tokenIds,
        block_size: e.blockSize,
        lora_id: null,
        medium: "GPU",
        lora_name: null,
        extra_keys: hashes.map(() => null),
        group_idx: 0,
        kv_cache_spec_kind: "full_attention"
      }
    }
    case "BlockRemoved":
      return legacy
        ? ["BlockRemoved", e.blockHashes.map(h), "GPU"]
        : { type: "BlockRemoved", block_hashes: e.blockHashes.map(h), medium: "GPU", group_idx: 0 }
    case "AllBlocksCleared":
      return legacy ? ["AllBlocksCleared"] : { type: "AllBlocksCleared" }
  }
}

export interface PublisherOptions {
  readonly settings: KvEventsSettings
  readonly legacy: boolean
  readonly signedHashes: boolean
  /** Stop publishing after this many batches (fault switch). */
  readonly stopAfter: number | undefined
  /** Skip this sequence number (fault switch). */
  readonly skipSeq: number | undefined
  readonly log: (msg: string, fields?: Record<string, unknown>) => void
}

export class KvPublisher {
  private readonly pub: zmq.Publisher
  private router: zmq.Router | undefined
  private readonly buffer: Array<[bigint, Buffer]> = []
  private pending: Array<KvEvent> = []
  private flushScheduled = false
  private seq = 0n
  private published = 0
  private sending: Promise<void> = Promise.resolve()
  private closed = false
  private readonly opts: PublisherOptions

  constructor(opts: PublisherOptions) {
    this.opts = opts
    this.pub = new zmq.Publisher({ sendHighWaterMark: opts.settings.hwm, linger: 0 })
  }

  async start(): Promise<void> {
    const { endpoint, replayEndpoint } = this.opts.settings
    if (shouldBind(endpoint)) await this.pub.bind(endpoint)
    else this.pub.connect(endpoint)
    this.opts.log("kv events publisher", { endpoint, mode: shouldBind(endpoint) ? "bind" : "connect" })
    if (replayEndpoint !== undefined) {
      this.router = new zmq.Router({ linger: 0 })
      await this.router.bind(replayEndpoint)
      this.opts.log("kv events replay", { endpoint: replayEndpoint })
      void this.serveReplay(this.router)
    }
  }

  /** Queues events; everything queued in one tick goes out as one batch (one engine step). */
  publish(events: ReadonlyArray<KvEvent>): void {
    if (events.length === 0 || this.closed) return
    for (const e of events) this.pending.push(e)
    if (!this.flushScheduled) {
      this.flushScheduled = true
      setImmediate(() => this.flush())
    }
  }

  get lastSeq(): number {
    return Number(this.seq) - 1
  }

  private flush(): void {
    this.flushScheduled = false
    const events = this.pending
    this.pending = []
    if (this.closed || events.length === 0) return
    if (this.opts.stopAfter !== undefined && this.published >= this.opts.stopAfter) return
    if (this.opts.skipSeq !== undefined && this.seq === BigInt(this.opts.skipSeq)) this.seq++
    const seq = this.seq++
    this.published++
    let ts = Date.now() / 1000
    if (Number.isInteger(ts)) ts += 0.0001 // keep msgpack float64
    const payload = Buffer.from(
      encode([ts, events.map((e) => encodeEvent(e, this.opts.legacy, this.opts.signedHashes)), 0], {
        useBigInt64: true
      })
    )
    this.buffer.push([seq, payload])
    if (this.buffer.length > this.opts.settings.bufferSteps) this.buffer.shift()
    const frames = [Buffer.from(this.opts.settings.topic), seqFrame(seq), payload]
    this.sending = this.sending
      .then(() => this.pub.send(frames))
      .catch((err: unknown) => this.opts.log("kv events send failed", { error: String(err) }))
  }

  private async serveReplay(router: zmq.Router): Promise<void> {
    try {
      for await (const frames of router) {
        if (frames.length !== 3 || (frames[2]?.length ?? 0) !== 8) {
          this.opts.log("kv events replay: bad request", { frames: frames.length })
          continue
        }
        const [identity, , start] = frames as [Buffer, Buffer, Buffer]
        const from = start.readBigUInt64BE()
        for (const [seq, payload] of this.buffer) {
          if (seq >= from) await router.send([identity, Buffer.alloc(0), seqFrame(seq), payload])
        }
        await router.send([identity, Buffer.alloc(0), seqFrame(END_SEQ), Buffer.alloc(0)])
      }
    } catch (err) {
      if (!this.closed) this.opts.log("kv events replay stopped", { error: String(err) })
    }
  }

  close(): void {
    this.closed = true
    this.pub.close()
    this.router?.close()
  }
}
