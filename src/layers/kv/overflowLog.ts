/**
 * Tells the operator when the KV-event queue overflows (`kv.max_queue_bytes`) and batches are dropped: before, only
 * `cgn_agent_kv_events_dropped_total` and /status `kv.dropped` showed it. A warning at the first drop, at most one
 * more a minute while drops go on (with the batches dropped since the last line), an info line once kvcached has
 * taken the queue down to half its bound again (below it: a queue that stays at the bound keeps dropping, and half
 * keeps a queue hovering at the bound from a line per ack).
 *
 * The rhythm is the trace exports' (services/observability/TraceExports.ts `recordExport`, reused: a push that
 * dropped batches is a failed "export" of them, kvcached's acknowledgement that drained the queue a successful
 * one). The queue calls plain callbacks from synchronous code (services/kv/KvQueue.ts `onOverflow`, the link's `onForwarded`);
 * each notice runs a short synchronous effect with the context the bridge was made in (its logger, its Clock), as
 * layers/observability/TraceExportMonitor.ts does.
 */
import { Clock, Duration, Effect } from "effect"
import type { KvQueue } from "../../services/kv/KvQueue.ts"
import { type ExportNotice, initialState, recordExport } from "../../services/observability/TraceExports.ts"

export interface OverflowLog {
  /** A push dropped `batches` to stay within the bound (services/kv/KvQueue.ts `onOverflow`). */
  readonly dropped: (batches: number) => void
  /** kvcached acknowledged records (the link's `onForwarded`): the queue may be drained. */
  readonly acked: () => void
}

/** What the trace exports' state machine sees as the failure: the same for every drop. */
const QUEUE_FULL = "queue full"

const logNotice = (notice: ExportNotice, fields: Record<string, unknown>): Effect.Effect<void> => {
  switch (notice._tag) {
    case "Quiet":
      return Effect.void
    case "StartedFailing":
      return Effect.logWarning(
        "kv events: the queue for cgn-kvcached is full (kv.max_queue_bytes); the oldest batches are dropped",
        { ...fields, droppedBatches: notice.items }
      )
    case "StillFailing":
      return Effect.logWarning("kv events: the queue for cgn-kvcached is still full; batches are still dropped", {
        ...fields,
        droppingFor: Duration.format(Duration.millis(notice.failingForMs)),
        droppedSinceLastWarning: notice.items
      })
    case "Recovered":
      return Effect.logInfo("kv events: the queue for cgn-kvcached is below half of kv.max_queue_bytes again", {
        ...fields,
        droppedFor: Duration.format(Duration.millis(notice.failedForMs)),
        droppedBatches: notice.items
      })
  }
}

/**
 * The overflow log of `queue`, logging through the context it is made in; `fields` (the socket, whether kvcached is
 * connected) are read at each line.
 */
export const make = (
  queue: Pick<KvQueue<unknown>, "bytes" | "outside" | "maxBytes">,
  fields: () => Record<string, unknown>
): Effect.Effect<OverflowLog> =>
  Effect.gen(function* () {
    const run = Effect.runSyncWith(yield* Effect.context<never>())
    let state = initialState
    const record = (batches: number | undefined) => {
      try {
        run(
          Effect.flatMap(Clock.currentTimeMillis, (now) => {
            const [next, notice] = recordExport(
              state,
              batches === undefined ? { items: 0 } : { items: batches, error: QUEUE_FULL },
              now
            )
            state = next
            return logNotice(notice, { ...fields(), maxQueueBytes: queue.maxBytes })
          })
        )
      } catch {
        // Only a defect (a logger that throws) lands here: the queue's push must go on, the line is lost.
      }
    }
    return {
      dropped: (batches) => record(batches),
      acked: () => {
        if (state.failing !== undefined && (queue.bytes + queue.outside) * 2 <= queue.maxBytes) record(undefined)
      }
    }
  })
