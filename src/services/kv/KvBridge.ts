/**
 * KvBridge: forwards the engine's KV-cache events, stamped with this node's identity, to the host's
 * cgn-kvcached over `[kv].uds` (wire format: services/kv/KvWire.ts, README section `kv`). It never stalls
 * the ZMQ reader and never fails the agent: kvcached being slow or absent costs dropped batches and a
 * Resync record, nothing else. Disabled (a no-op) when `[kv].events` is off or the engine has no events.
 */
import { Context, type Effect } from "effect"

/** One data-parallel rank's event stream (each rank is its own publisher, with its own `seq`). */
export interface KvRankStatus {
  readonly rank: number
  /** This rank's reader is bound/connected. */
  readonly subscribed: boolean
  /** The last engine seq this rank sent (a decimal string; undefined before its first batch). */
  readonly lastSeq: string | undefined
  /** A replay for this rank is running (its live batches are held meanwhile). */
  readonly replaying: boolean
}

export interface KvBridgeStatus {
  readonly enabled: boolean
  /** Why the bridge is off (when `enabled` is false). */
  readonly disabledReason: string | undefined
  /** Every DP rank's ZMQ subscriber is bound/connected (false while one is failing and being resubscribed). */
  readonly subscribed: boolean
  readonly kvcachedConnected: boolean
  /** Batches kvcached acknowledged (applied). */
  readonly forwarded: number
  /** Batches lost: dropped on queue overflow or undecodable. */
  readonly dropped: number
  /** Sequence gaps seen on the engine stream (filled by replay or not). */
  readonly gaps: number
  /** Gaps filled completely by the replay endpoint. */
  readonly replayed: number
  /**
   * Resync records kvcached acknowledged: each made it drop a rank's blocks. One dropped before it was sent (an
   * overflow, whose own Resync covers its range) or never acknowledged is not counted.
   */
  readonly resyncs: number
  /**
   * Batches waiting for kvcached: unsent, held while their rank's replay runs (the replay's replies received so far
   * too), or sent and not yet acknowledged.
   */
  readonly queued: number
  /**
   * Bytes held for kvcached: those batches and the Resyncs, plus a running replay's replies so far (bounded by
   * `kv.max_queue_bytes`: a replay whose held batches or replies would pass it is abandoned).
   */
  readonly queuedBytes: number
  /** Each DP rank's stream, by rank (0 to dp - 1). */
  readonly ranks: ReadonlyArray<KvRankStatus>
  /** Events of unknown types and unknown map keys skipped (newer engine versions). */
  readonly unknownEvents: number
  readonly unknownKeys: number
  /**
   * What is failing now, undefined when nothing is: the kvcached link or a DP rank's reader that is down (why,
   * and when the next try is), or an endpoint that cannot be offset for a rank. Each part is cleared when what
   * it describes recovers (kvcached answers Hello, the reader is subscribed again); several are joined by "; ".
   */
  /** Times kvcached answered Hello with nothing applied after acknowledging records of this epoch (lost its state). */
  readonly kvcachedStateLosses: number
  readonly lastError: string | undefined
  /**
   * The last batch the bridge could not use (an undecodable message or batch, a replay that failed or answered short of a gap): history, never
   * cleared, since nothing recovers from it; what it cost is already counted in `dropped`, `resyncs` and `gaps`.
   */
  readonly lastBatchError: string | undefined
  /** This agent run's id, sent in Hello. */
  readonly epoch: string
}

export interface KvBridgeService {
  readonly status: Effect.Effect<KvBridgeStatus>
}

export class KvBridge extends Context.Service<KvBridge, KvBridgeService>()("cgn-agent/KvBridge") {}
