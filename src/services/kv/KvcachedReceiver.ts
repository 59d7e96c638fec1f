/**
 * The receiving end of the kvcached contract (services/kv/KvcachedRpc.ts) as a pure state machine, for the
 * reference receiver and for a cgn-kvcached implementation to reuse: per node, the epoch it is in and the
 * last link seq `n` applied. Hello with a new epoch starts the node over; a Push applies records in `n`
 * order, skips those already applied (the agent resends what it had not seen acknowledged) and answers
 * with the last `n` applied. What "apply" means is the sink's business. Pure: no I/O.
 */
import { Effect } from "effect"
import {
  type Applied,
  type HelloPayload,
  KV_WIRE_VERSION,
  type KvRecord,
  type PushPayload,
  UnknownStream,
  UnsupportedVersion
} from "./KvcachedRpc.ts"

export interface ReceiverSink {
  /** A Hello; `fresh` when it starts a new epoch for the node (state of the old one is void). */
  readonly onHello: (hello: HelloPayload, fresh: boolean) => void
  /** A record applied, exactly once per `n` of a node's epoch. */
  readonly onRecord: (nodeId: string, epoch: string, record: KvRecord) => void
}

/** What a receiver knew before it restarted (from its own durable state). */
export interface RestoredStream {
  readonly node_id: string
  readonly epoch: string
  readonly applied: number | null
}

export class ReceiverState {
  private readonly streams = new Map<string, { epoch: string; applied: number | null }>()
  /** Records skipped because their `n` was already applied (resends after a reconnect). */
  duplicates = 0
  /** Records whose `n` skipped ahead of `applied + 1` (nothing the agent sends; counted, applied anyway). */
  holes = 0

  private readonly sink: ReceiverSink

  constructor(sink: ReceiverSink, restored: Iterable<RestoredStream> = []) {
    this.sink = sink
    for (const r of restored) this.streams.set(r.node_id, { epoch: r.epoch, applied: r.applied })
  }

  hello(h: HelloPayload): Effect.Effect<Applied, UnsupportedVersion> {
    if (h.version !== KV_WIRE_VERSION) {
      return Effect.fail(new UnsupportedVersion({ version: h.version, supported: [KV_WIRE_VERSION] }))
    }
    return Effect.sync(() => {
      const s = this.streams.get(h.node_id)
      const fresh = s === undefined || s.epoch !== h.epoch
      if (fresh) this.streams.set(h.node_id, { epoch: h.epoch, applied: null })
      this.sink.onHello(h, fresh)
      return { applied: fresh ? null : (s?.applied ?? null) }
    })
  }

  push(p: PushPayload): Effect.Effect<Applied, UnknownStream> {
    const s = this.streams.get(p.node_id)
    if (s === undefined || s.epoch !== p.epoch) {
      return Effect.fail(new UnknownStream({ node_id: p.node_id, epoch: p.epoch }))
    }
    return Effect.sync(() => {
      for (const r of p.records) {
        if (s.applied !== null && r.n <= s.applied) {
          this.duplicates++
          continue
        }
        if (s.applied !== null && r.n !== s.applied + 1) this.holes++
        this.sink.onRecord(p.node_id, p.epoch, r)
        s.applied = r.n
      }
      return { applied: s.applied }
    })
  }
}
