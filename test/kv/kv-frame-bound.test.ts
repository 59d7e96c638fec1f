// A rank's SUB socket takes no frame over its bound (src/layers/kv/rankSubscriber.ts maxFrameBytes, ZMQ_MAXMSGSIZE):
// a publisher that sends one is disconnected before the frame is read, and the stream goes on with the next
// batches. Connected (the engine binds) libzmq never reconnects a connection it dropped for a protocol error, so the
// reader sees that and resubscribes; bound (the engine connects) the publisher reconnects by itself.
import { Effect, Exit, Fiber, Scope } from "effect"
import { describe, expect, it } from "vitest"
import * as zmq from "zeromq"
import { maxFrameBytes, readRank } from "../../src/layers/kv/rankSubscriber.ts"
import { fetchReplay } from "../../src/layers/kv/replayFetch.ts"
import { retryForever } from "../../src/layers/kv/retrying.ts"
import { END_OF_REPLAY, seqFrame } from "../../src/services/kv/KvEvents.ts"
import { pollUntil } from "../support/poll.ts"
import { freePort } from "../support/ports.ts"

const BOUND = 64 * 1024

/** One rank's reader, retried as the bridge retries it (KvBridge.ts readOneRank); what it read and what failed. */
const startReader = async (endpoint: string, engineBinds: boolean) => {
  const seen = { messages: 0, largestFrame: 0, markers: new Set<string>(), failures: [] as Array<string> }
  const dropped: Array<string> = []
  const scope = await Effect.runPromise(Scope.make())
  const fiber = await Effect.runPromise(
    Effect.forkDetach(
      Scope.provide(
        retryForever({
          capMs: 200,
          attempt: () =>
            Effect.scoped(
              readRank({
                rank: 0,
                endpoint,
                engineBinds,
                topic: "kv",
                receiveHighWaterMark: 1_000,
                maxFrameBytes: BOUND,
                onDropped: (why) => void dropped.push(why),
                onSubscribed: () => {},
                onFrames: (frames) =>
                  Effect.sync(() => {
                    seen.messages++
                    for (const f of frames) seen.largestFrame = Math.max(seen.largestFrame, f.byteLength)
                    seen.markers.add(new TextDecoder().decode(frames[2]))
                  })
              })
            ),
          onFailure: (error) => Effect.sync(() => void seen.failures.push(error))
        }),
        scope
      )
    )
  )
  const stop = async () => {
    await Effect.runPromise(Fiber.interrupt(fiber))
    await Effect.runPromise(Scope.close(scope, Exit.void))
  }
  return { seen, dropped, stop }
}

/** Sends `marker` until the reader has it: ZMQ drops what a subscription (or a reconnect) not yet joined misses. */
const deliver = (pub: zmq.Publisher, seen: { markers: Set<string> }, marker: string) =>
  pollUntil(`"${marker}" read`, async () => {
    await pub.send(["kv", new Uint8Array(8), marker])
    return seen.markers.has(marker) ? true : undefined
  })

describe("a rank's SUB socket's frame bound", () => {
  it("is kv.max_queue_bytes, at least 1 MiB and at most 64 MiB", () => {
    expect(maxFrameBytes(32 * 1024 * 1024)).toBe(32 * 1024 * 1024)
    expect(maxFrameBytes(1)).toBe(1024 * 1024)
    expect(maxFrameBytes(2 ** 40)).toBe(64 * 1024 * 1024)
  })

  it("connected (the engine binds): a frame over it is never read; the reader resubscribes and reads on", async () => {
    const port = await freePort()
    const pub = new zmq.Publisher({ linger: 0 })
    await pub.bind(`tcp://127.0.0.1:${port}`)
    const r = await startReader(`tcp://127.0.0.1:${port}`, true)
    try {
      await deliver(pub, r.seen, "before")
      await pub.send(["kv", new Uint8Array(8), new Uint8Array(8 * BOUND)])
      // libzmq gave the connection up (no reconnect of its own): the reader says so, resubscribes, and reads on.
      await deliver(pub, r.seen, "after")
      expect(r.seen.largestFrame).toBeLessThanOrEqual(BOUND)
      expect(r.dropped).toHaveLength(1)
      expect(r.dropped[0]).toContain(`a frame over ${BOUND} bytes`)
      expect(r.seen.failures).toEqual([expect.stringContaining(`a frame over ${BOUND} bytes`)])
    } finally {
      await r.stop()
      pub.close()
    }
  })

  it("bound (the engine connects): a frame over it is never read; the publisher reconnects and is read on", async () => {
    const port = await freePort()
    const r = await startReader(`tcp://127.0.0.1:${port}`, false)
    const pub = new zmq.Publisher({ linger: 0 })
    pub.connect(`tcp://127.0.0.1:${port}`)
    try {
      await deliver(pub, r.seen, "before")
      await pub.send(["kv", new Uint8Array(8), new Uint8Array(8 * BOUND)])
      await deliver(pub, r.seen, "after")
      expect(r.seen.largestFrame).toBeLessThanOrEqual(BOUND)
      // Only that connection went: the bound socket itself stayed up.
      expect(r.seen.failures).toEqual([])
    } finally {
      await r.stop()
      pub.close()
    }
  })

  it("a replay DEALER takes no reply frame over it either: the replay fails instead", async () => {
    const port = await freePort()
    const router = new zmq.Router({ linger: 0 })
    await router.bind(`tcp://127.0.0.1:${port}`)
    // A ROUTER that answers every request with one batch larger than the bound (64 MiB with this budget), then the end.
    const serving = (async () => {
      for await (const [id] of router) {
        await router.send([id as Buffer, "", seqFrame(0n), new Uint8Array(64 * 1024 * 1024 + 1)])
        await router.send([id as Buffer, "", seqFrame(END_OF_REPLAY), ""])
      }
    })().catch(() => {})
    const budget = { maxBytes: 256 * 1024 * 1024, take: () => true }
    try {
      expect(maxFrameBytes(budget.maxBytes)).toBe(64 * 1024 * 1024)
      const exit = await Effect.runPromiseExit(
        fetchReplay(`tcp://127.0.0.1:${port}`, "kv", { from: 0n, until: 1n }, 1_000, budget)
      )
      expect(Exit.isFailure(exit)).toBe(true)
    } finally {
      router.close()
      await serving
    }
  })
})
