// The KV-event queue's overflow in the log (src/layers/kv/overflowLog.ts, on a real KvQueue, on a TestClock): a
// warning at the first drop, at most one more a minute while drops go on, with the batches dropped since the last
// line, and an info line once kvcached has taken the queue down to half its bound. Before, only the metric
// cgn_agent_kv_events_dropped_total and /status kv.dropped showed that batches were dropped.
import { assert, describe, it } from "@effect/vitest"
import { Effect, Logger } from "effect"
import { TestClock } from "effect/testing"
import * as OverflowLog from "../../src/layers/kv/overflowLog.ts"
import { KvQueue } from "../../src/services/kv/KvQueue.ts"
import type { QueuedRecord } from "../../src/services/kv/QueueRecords.ts"

type Rec = { readonly seq: bigint }

const batch = (seq: bigint, bytes = 100): QueuedRecord<Rec> => ({
  record: { seq },
  batch: true,
  dpRank: 0,
  fromSeq: seq,
  nextSeq: seq + 1n,
  bytes
})
const resync = (): QueuedRecord<Rec> => ({
  record: { seq: -1n },
  batch: false,
  dpRank: 0,
  fromSeq: 0n,
  nextSeq: 0n,
  bytes: 10
})

interface Line {
  readonly level: string
  readonly message: string
  readonly fields: Record<string, unknown>
}

/** A queue of 5 batches' room with its overflow log, and the lines logged. */
const setup = Effect.gen(function* () {
  const lines: Array<Line> = []
  const logger = Logger.make(({ logLevel, message }) => {
    const [text, fields] = [message].flat() as [string, Record<string, unknown> | undefined]
    lines.push({ level: logLevel, message: text, fields: fields ?? {} })
  })
  const queue = new KvQueue<Rec>(500)
  const log = yield* OverflowLog.make(queue, () => ({ uds: "/run/k.sock" })).pipe(
    Effect.provide(Logger.layer([logger]))
  )
  queue.onOverflow = log.dropped
  let seq = 0n
  const push = (n: number) => {
    for (let i = 0; i < n; i++) queue.push(batch(seq++))
  }
  /** kvcached takes and acknowledges everything queued. */
  const drain = () => {
    const sent = queue.take(1000, 1_000_000, resync)
    queue.ack(sent.at(-1)?.n ?? -1)
    log.acked()
  }
  return { lines, queue, log, push, drain }
})

describe("the KV queue's overflow log", () => {
  it.effect("warns at the first drop, then at most once a minute with the count since the last line", () =>
    Effect.gen(function* () {
      const { lines, push } = yield* setup
      push(5)
      assert.deepStrictEqual(lines, [])

      push(2)
      assert.strictEqual(lines.length, 1)
      assert.strictEqual(lines[0]?.level, "Warn")
      assert.match(lines[0]?.message ?? "", /queue for cgn-kvcached is full \(kv\.max_queue_bytes\)/)
      assert.deepStrictEqual(lines[0]?.fields, { uds: "/run/k.sock", maxQueueBytes: 500, droppedBatches: 1 })

      // within the minute: counted, not logged
      yield* TestClock.adjust("30 seconds")
      push(3)
      yield* TestClock.adjust("29 seconds")
      push(1)
      assert.strictEqual(lines.length, 1)

      yield* TestClock.adjust("2 seconds")
      push(1)
      assert.strictEqual(lines.length, 2)
      assert.strictEqual(lines[1]?.level, "Warn")
      assert.match(lines[1]?.message ?? "", /still full/)
      assert.deepStrictEqual(lines[1]?.fields, {
        uds: "/run/k.sock",
        maxQueueBytes: 500,
        droppingFor: "1m 1s",
        // the second of the first two, then 3, 1 and this one
        droppedSinceLastWarning: 1 + 3 + 1 + 1
      })

      // drops that go on go on being logged once a minute, not once per drop
      for (let i = 0; i < 12; i++) {
        yield* TestClock.adjust("10 seconds")
        push(1)
      }
      assert.deepStrictEqual(
        lines.map((l) => l.fields.droppedSinceLastWarning),
        [undefined, 6, 6, 6]
      )
    })
  )

  it.effect("says when kvcached took the queue down to half its bound, and the next drop starts over", () =>
    Effect.gen(function* () {
      const { lines, queue, log, push, drain } = yield* setup
      push(8)
      yield* TestClock.adjust("90 seconds")
      push(1)
      assert.strictEqual(lines.length, 2)

      // an acknowledgement that leaves the queue above half its bound is no recovery
      const sent = queue.take(2, 1_000_000, resync)
      queue.ack(sent.at(-1)?.n ?? -1)
      log.acked()
      assert.strictEqual(lines.length, 2)

      yield* TestClock.adjust("5 seconds")
      drain()
      assert.strictEqual(lines.length, 3)
      assert.strictEqual(lines[2]?.level, "Info")
      assert.match(lines[2]?.message ?? "", /below half of kv\.max_queue_bytes again/)
      assert.deepStrictEqual(lines[2]?.fields, {
        uds: "/run/k.sock",
        maxQueueBytes: 500,
        droppedFor: "1m 35s",
        droppedBatches: 4
      })
      drain()
      assert.strictEqual(lines.length, 3)

      yield* TestClock.adjust("1 hour")
      push(6)
      assert.strictEqual(lines.length, 4)
      assert.match(lines[3]?.message ?? "", /is full/)
      assert.deepStrictEqual(lines[3]?.fields.droppedBatches, 1)
    })
  )
})
