// A rank's SUB socket (src/layers/kv/rankSubscriber.ts) holds at most about its high-water mark of messages the
// reader has not taken, derived from kv.max_queue_bytes (KvEvents.ts subscriberHighWaterMark): a reader behind its
// engine costs dropped messages (a gap the sequencer replays or resyncs), not memory outside the bridge's bound.
import * as fs from "node:fs"
import { Deferred, Effect, Exit, Fiber, Scope } from "effect"
import { describe, expect, it } from "vitest"
import * as zmq from "zeromq"
import { maxFrameBytes, readRank } from "../../src/layers/kv/rankSubscriber.ts"
import { subscriberHighWaterMark } from "../../src/services/kv/KvEvents.ts"
import { pollUntil } from "../support/poll.ts"
import { freePort } from "../support/ports.ts"

/** The agent's connections on `port` still held (ESTABLISHED or CLOSE_WAIT, /proc/net/tcp). */
const connectionsOn = (port: number) =>
  fs
    .readFileSync("/proc/net/tcp", "utf8")
    .split("\n")
    .slice(1)
    .filter((line) => {
      const [, local, , state] = line.trim().split(/\s+/)
      return Number.parseInt(local?.split(":")[1] ?? "", 16) === port && (state === "01" || state === "08")
    }).length

describe("a rank's SUB socket", () => {
  it("holds a share of kv.max_queue_bytes at 32 KiB a batch, between 256 and 100,000 messages", () => {
    expect(subscriberHighWaterMark(32 * 1024 * 1024)).toBe(1_024)
    expect(subscriberHighWaterMark(1)).toBe(256)
    expect(subscriberHighWaterMark(2 ** 40)).toBe(100_000)
  })

  it("with a reader stalled, keeps about its high-water mark of what the engine sent, not all of it", async () => {
    const port = await freePort()
    // A publisher that queues little itself (vLLM's queues up to 100,000 per subscriber, in the engine's memory), so
    // that what is read after the stall is what the agent's SUB kept.
    const pub = new zmq.Publisher({ linger: 0, sendHighWaterMark: 16 })
    await pub.bind(`tcp://127.0.0.1:${port}`)
    const subscribed = await Effect.runPromise(Deferred.make<void>())
    const release = await Effect.runPromise(Deferred.make<void>())
    let received = 0
    let marker = false
    const scope = await Effect.runPromise(Scope.make())
    const reader = await Effect.runPromise(
      Effect.forkDetach(
        Scope.provide(
          readRank({
            rank: 0,
            endpoint: `tcp://*:${port}`,
            engineBinds: true,
            topic: "kv",
            receiveHighWaterMark: subscriberHighWaterMark(1),
            maxFrameBytes: maxFrameBytes(1),
            onSubscribed: () => Effect.runSync(Deferred.succeed(subscribed, undefined)),
            // The first message stalls the reader until the publisher has sent everything.
            onFrames: (frames) =>
              Effect.suspend(() => {
                if (frames[2]?.byteLength === 3) marker = true
                else received++
                return received === 1 ? Deferred.await(release) : Effect.void
              })
          }),
          scope
        )
      )
    )
    try {
      await Effect.runPromise(Deferred.await(subscribed))
      const payload = new Uint8Array(16 * 1024)
      // ZMQ drops what a subscription not yet joined misses: send until the reader has its first message.
      await pollUntil("the first message read", async () => {
        await pub.send(["kv", new Uint8Array(8), payload])
        return received > 0 ? true : undefined
      })
      // Paced (a millisecond each, 16 MB/s), so that the publisher's own queue drops only once the SUB and the
      // kernel's buffers are full and TCP holds it back, not because it sends faster than its I/O thread writes.
      for (let i = 0; i < 2_000; i++) {
        await pub.send(["kv", new Uint8Array(8), payload])
        await new Promise((r) => setTimeout(r, 1))
      }
      await Effect.runPromise(Deferred.succeed(release, undefined))
      // Then a marker, read once everything the socket kept was read.
      await pollUntil("the reader drained", async () => {
        await pub.send(["kv", new Uint8Array(8), "end"])
        return marker ? true : undefined
      })
      // 2,000 sent while it stalled: the SUB's 256 and what the kernel's socket buffers held (472 here), far from
      // all (with the 100,000 it had before, all 2,000, in the agent's memory).
      expect(received).toBeLessThan(1_500)
      expect(received).toBeGreaterThan(1)
    } finally {
      await Effect.runPromise(Fiber.interrupt(reader))
      await Effect.runPromise(Scope.close(scope, Exit.void))
      pub.close()
    }
  })

  it("bound (the engine connects): tells a publisher's reconnect through `accept`, never its first connection", async () => {
    const port = await freePort()
    let reconnected = 0
    let received = 0
    const subscribed = await Effect.runPromise(Deferred.make<void>())
    const scope = await Effect.runPromise(Scope.make())
    const reader = await Effect.runPromise(
      Effect.forkDetach(
        Scope.provide(
          readRank({
            rank: 0,
            endpoint: `tcp://127.0.0.1:${port}`,
            engineBinds: false,
            topic: "kv",
            receiveHighWaterMark: 1_000,
            maxFrameBytes: maxFrameBytes(1),
            onSubscribed: () => Effect.runSync(Deferred.succeed(subscribed, undefined)),
            onReconnected: Effect.sync(() => void reconnected++),
            onFrames: () => Effect.sync(() => void received++)
          }),
          scope
        )
      )
    )
    /** A publisher connected to the agent's socket, once a message of its own was read (its connection is up). */
    const publisher = async () => {
      const pub = new zmq.Publisher({ linger: 0 })
      pub.connect(`tcp://127.0.0.1:${port}`)
      const before = received
      await pollUntil("a message read", async () => {
        await pub.send(["kv", new Uint8Array(8), "x"])
        return received > before ? true : undefined
      })
      return pub
    }
    /** Whether the agent's socket still holds a connection on its port (ESTABLISHED or CLOSE_WAIT, /proc/net/tcp). */
    const connectionHeld = () =>
      fs
        .readFileSync("/proc/net/tcp", "utf8")
        .split("\n")
        .slice(1)
        .some((line) => {
          const [, local, , state] = line.trim().split(/\s+/)
          return Number.parseInt(local?.split(":")[1] ?? "", 16) === port && (state === "01" || state === "08")
        })
    try {
      await Effect.runPromise(Deferred.await(subscribed))
      const first = await publisher()
      first.close()
      // the agent's socket closed its end: its "disconnect" is in the monitor's queue before the next "accept"
      await pollUntil("the first connection's close", () => !connectionHeld())
      expect(reconnected).toBe(0) // a first connection is no reconnect
      const second = await publisher()
      await pollUntil("the reconnect told", () => reconnected > 0)
      second.close()
      expect(reconnected).toBe(1)
    } finally {
      await Effect.runPromise(Fiber.interrupt(reader))
      await Effect.runPromise(Scope.close(scope, Exit.void))
    }
  })
  it("bound: another process's connects and closes, while the engine's connection stays up, are no reconnect", async () => {
    const port = await freePort()
    // Which publisher's connection was up when each reconnect was told.
    const told: Array<string> = []
    let phase = "foreign"
    const markers = new Set<string>()
    const subscribed = await Effect.runPromise(Deferred.make<void>())
    const scope = await Effect.runPromise(Scope.make())
    const reader = await Effect.runPromise(
      Effect.forkDetach(
        Scope.provide(
          readRank({
            rank: 0,
            endpoint: `tcp://127.0.0.1:${port}`,
            engineBinds: false,
            topic: "kv",
            receiveHighWaterMark: 1_000,
            maxFrameBytes: maxFrameBytes(1),
            onSubscribed: () => Effect.runSync(Deferred.succeed(subscribed, undefined)),
            onReconnected: Effect.sync(() => void told.push(phase)),
            onFrames: (frames) => Effect.sync(() => void markers.add(new TextDecoder().decode(frames[2])))
          }),
          scope
        )
      )
    )
    /** A publisher connected to the agent's socket, once its `marker` was read (its connection is up). */
    const publisher = async (marker: string) => {
      const pub = new zmq.Publisher({ linger: 0 })
      pub.connect(`tcp://127.0.0.1:${port}`)
      await pollUntil(`"${marker}" read`, async () => {
        await pub.send(["kv", new Uint8Array(8), marker])
        return markers.has(marker) ? true : undefined
      })
      return pub
    }
    let engine: zmq.Publisher | undefined
    try {
      await Effect.runPromise(Deferred.await(subscribed))
      engine = await publisher("engine")
      for (const name of ["a", "b", "c"]) {
        const foreign = await publisher(name)
        foreign.close()
        await pollUntil(`${name}'s close`, () => connectionsOn(port) === 1)
      }
      // Then the engine's own reconnect: told once, with the engine's new connection.
      engine.close()
      await pollUntil("the engine's close", () => connectionsOn(port) === 0)
      phase = "engine"
      engine = await publisher("engine again")
      await pollUntil("the engine's reconnect told", () => told.includes("engine"))
      expect(told).toEqual(["engine"])
    } finally {
      engine?.close()
      await Effect.runPromise(Fiber.interrupt(reader))
      await Effect.runPromise(Scope.close(scope, Exit.void))
    }
  })
})
