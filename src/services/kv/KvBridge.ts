/**
 * KvBridge: forwards the engine's KV-cache events, stamped with this node's identity, to the host's
 * cgn-kvcached over `[kv].uds` (wire format: services/kv/KvWire.ts, README section `kv`). It never stalls
 * the ZMQ reader and never fails the agent: kvcached being slow or absent costs dropped batches and a
 * Resync record, nothing else. Disabled (a no-op) when `[kv].events` is off or the engine has no events.
 */
import { Context, type Effect } from "effect"

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
  /** Resync records queued for kvcached (an overflow may drop some of them before they are sent). */
  readonly resyncs: number
  /** Batches waiting for kvcached: unsent, held while their rank's replay runs, or sent and not yet acknowledged. */
  readonly queued: number
  /** Bytes those hold (bounded by `kv.max_queue_bytes`: a replay whose held batches would pass it is abandoned). */
  readonly queuedBytes: number
  /** Last engine seq seen on any DP rank, whichever wrote last (a decimal string; undefined before the first batch). */
  readonly lastSeq: string | undefined
  /** Events of unknown types and unknown map keys skipped (newer engine versions). */
  readonly unknownEvents: number
  readonly unknownKeys: number
  /**
   * What is failing now, undefined when nothing is: the kvcached link or a DP rank's reader that is down (why,
   * and when the next try is), or an endpoint that cannot be offset for a rank. Each part is cleared when what
   * it describes recovers (kvcached answers Hello, the reader is subscribed again); several are joined by "; ".
   */
  readonly lastError: string | undefined
  /**
   * The last batch the bridge could not use (an undecodable message or batch, a failed replay): history, never
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
