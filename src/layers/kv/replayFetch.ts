/**
 * One replay request to an engine's KV-event replay ROUTER: a ZMQ DEALER sends ["", seq8] and reads
 * batches until the end marker (replies in both the 3- and 4-frame layouts, split by
 * services/kv/KvEvents.ts; payloads stay undecoded, as the live stream's). The dealer is closed on every exit,
 * interruption included.
 */
import { Effect } from "effect"
import { type RawBatch, seqFrame, splitReplayReply } from "../../services/kv/KvEvents.ts"
import { maxFrameBytes } from "./rankSubscriber.ts"

/** The bridge's byte budget, shared with its queue (`kv.max_queue_bytes`). */
export interface ReplayBudget {
  readonly maxBytes: number
  /** Takes `bytes` more into the budget; false (nothing taken) when they would pass it. */
  readonly take: (bytes: number) => boolean
}

/** What a replayed batch costs held: what the same batch costs queued (rankSequencer costOf). */
export const rawCost = (b: Omit<RawBatch, "dpRank">): number => 96 + b.payload.byteLength

/**
 * The batches of [from, until) the replay ROUTER holds, as it sent them. Each reply is taken into `budget` as it
 * arrives, before the next is read: an engine's replay buffer holds thousands of batches (a join from seq 0 on a
 * busy engine asks for all of them), held here until the range is complete, and they are memory like the queue's.
 * Fails on a bad frame, on a reply the budget refuses, or when the whole replay took longer than `timeoutMs`: its
 * rank's live batches are held meanwhile, so a ROUTER that trickles replies (each within the receive timeout) must
 * not hold them for longer than one deadline.
 */
export const fetchReplay = (
  endpoint: string,
  topic: string,
  range: { readonly from: bigint; readonly until: bigint },
  timeoutMs: number,
  budget: ReplayBudget
) =>
  Effect.timeoutOrElse(receiveAll(endpoint, topic, range, timeoutMs, budget), {
    duration: timeoutMs,
    orElse: () => Effect.fail(new Error(`replay from ${endpoint}: no complete replay within ${timeoutMs} ms`))
  })

const receiveAll = (
  endpoint: string,
  topic: string,
  { from, until }: { readonly from: bigint; readonly until: bigint },
  timeoutMs: number,
  budget: ReplayBudget
) =>
  Effect.tryPromise({
    try: async (signal) => {
      // Loaded on use, as in rankSubscriber.ts (already loaded by then: a replay follows a subscription).
      const zmq = await import("zeromq")
      // A reply frame over the live stream's bound drops the connection: the replay times out and a Resync goes.
      const dealer = new zmq.Dealer({
        linger: 0,
        receiveTimeout: timeoutMs,
        maxMessageSize: maxFrameBytes(budget.maxBytes)
      })
      // Interruption closes the dealer, which rejects the pending receive.
      const onAbort = () => dealer.close()
      signal.addEventListener("abort", onAbort, { once: true })
      try {
        dealer.connect(endpoint)
        await dealer.send([new Uint8Array(0), seqFrame(from)])
        const out: Array<Omit<RawBatch, "dpRank">> = []
        for (;;) {
          const r = splitReplayReply(await dealer.receive(), topic)
          if (r.end) return out
          if (!r.ok) throw new Error(r.error)
          // The ROUTER sends its buffer in seq order (vllm-project/vllm vllm/distributed/kv_events.py, the replay
          // loop over its deque): from `until` on it is what the live stream already gave, held; not needed twice.
          if (r.raw.seq >= until) return out
          if (!budget.take(rawCost(r.raw)))
            throw new Error(
              `the replay from seq ${from} passed ${budget.maxBytes} bytes (kv.max_queue_bytes) with what the bridge holds; not replayed`
            )
          out.push(r.raw)
        }
      } finally {
        signal.removeEventListener("abort", onAbort)
        if (!dealer.closed) dealer.close()
      }
    },
    catch: (err) => new Error(`replay from ${endpoint}: ${err instanceof Error ? err.message : String(err)}`)
  })
