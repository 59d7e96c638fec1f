/**
 * One replay request to an engine's KV-event replay ROUTER: a ZMQ DEALER sends ["", seq8] and reads
 * batches until the end marker (replies in both the 3- and 4-frame layouts, decoded by
 * services/kv/KvEvents.ts). The dealer is closed on every exit, interruption included.
 */
import { Effect } from "effect"
import { decodeReplayReply, type KvBatch, seqFrame } from "../../services/kv/KvEvents.ts"

/**
 * Every batch the replay ROUTER holds from `from` on, decoded. Fails on a bad frame, once the replies pass
 * `maxBytes` (an engine's replay buffer holds thousands of batches: a join from seq 0 on a busy engine asks for
 * all of them, held here until the range is complete), or when the whole replay took longer than `timeoutMs`:
 * its rank's live batches are held meanwhile, so a ROUTER that trickles replies (each within the receive
 * timeout) must not hold them for longer than one deadline.
 */
export const fetchReplay = (endpoint: string, topic: string, from: bigint, timeoutMs: number, maxBytes: number) =>
  Effect.timeoutOrElse(receiveAll(endpoint, topic, from, timeoutMs, maxBytes), {
    duration: timeoutMs,
    orElse: () => Effect.fail(new Error(`replay from ${endpoint}: no complete replay within ${timeoutMs} ms`))
  })

const receiveAll = (endpoint: string, topic: string, from: bigint, timeoutMs: number, maxBytes: number) =>
  Effect.tryPromise({
    try: async (signal) => {
      // Loaded on use, as in rankSubscriber.ts (already loaded by then: a replay follows a subscription).
      const zmq = await import("zeromq")
      const dealer = new zmq.Dealer({ linger: 0, receiveTimeout: timeoutMs })
      // Interruption closes the dealer, which rejects the pending receive.
      const onAbort = () => dealer.close()
      signal.addEventListener("abort", onAbort, { once: true })
      try {
        dealer.connect(endpoint)
        await dealer.send([new Uint8Array(0), seqFrame(from)])
        const out: Array<KvBatch> = []
        let bytes = 0
        for (;;) {
          const frames = await dealer.receive()
          for (const f of frames) bytes += f.length
          if (bytes > maxBytes)
            throw new Error(`the replay from seq ${from} passed ${maxBytes} bytes (kv.max_queue_bytes); not replayed`)
          const r = decodeReplayReply(frames, topic)
          if (r.end) return out
          if (r.ok) out.push(r.batch)
          else if (r.seq === undefined) throw new Error(r.error)
        }
      } finally {
        signal.removeEventListener("abort", onAbort)
        if (!dealer.closed) dealer.close()
      }
    },
    catch: (err) => new Error(`replay from ${endpoint}: ${err instanceof Error ? err.message : String(err)}`)
  })
