/**
 * The ZMQ side of one data-parallel rank's KV-event stream: a SUB socket on the rank's endpoint that
 * connects when the engine binds and binds when the engine connects, then hands every message to the caller.
 * The socket is closed with the scope. A failed bind fails the attempt like a failed receive: the caller's
 * retry loop (retrying.ts) tries again with the bridge's backoff and its cap, and shows the failure meanwhile.
 */
import { Effect, Option, type Scope } from "effect"
import { background } from "../observability/backgroundFiber.ts"

/**
 * The largest frame a rank's SUB socket (and a replay DEALER) takes: ZMQ_MAXMSGSIZE, which libzmq checks per frame
 * before it allocates it (zeromq/libzmq src/v2_decoder.cpp, size_ready) and answers by dropping the connection. A batch is one engine
 * step's events (vllm-project/vllm vllm/distributed/kv_events.py, one `send_multipart` per EventBatch): the largest
 * real ones, an unchunked prefill of 1M tokens (token ids at <= 5 bytes, a 9-byte hash per block) or a BlockRemoved
 * of a whole GPU cache, are a few MiB. `kv.max_queue_bytes` bounds it (a batch past it cannot be held: services/kv/KvQueue.ts drops
 * it alone), under 64 MiB, and over 1 MiB: a small queue must not make the socket drop what the queue drops more
 * cheaply (its own overflow Resync, where a dropped connection costs a reconnect).
 */
export const maxFrameBytes = (maxQueueBytes: number): number =>
  Math.min(64 * 1024 * 1024, Math.max(1024 * 1024, maxQueueBytes))

/**
 * After a lost connection libzmq, connecting, reports its reconnect ("connect:retry") within a millisecond; after a
 * protocol error (a frame over maxFrameBytes) it gives the connection up and reports nothing more.
 */
const RECONNECT_GRACE_MS = 1_000

/** The address to connect to for an endpoint the engine binds (`tcp://*:P` -> `tcp://127.0.0.1:P`). */
export const connectAddress = (endpoint: string): string =>
  endpoint.replace(/^tcp:\/\/(\*|\[::\]|::|0\.0\.0\.0):/, "tcp://127.0.0.1:")

export interface RankSubscription {
  readonly rank: number
  /** This rank's endpoint (already offset for the rank). */
  readonly endpoint: string
  readonly engineBinds: boolean
  readonly topic: string
  /** ZMQ's receive high-water mark, in messages (KvEvents.ts subscriberHighWaterMark). */
  readonly receiveHighWaterMark: number
  /** ZMQ_MAXMSGSIZE (`maxFrameBytes`): a publisher that sends a larger frame is disconnected. */
  readonly maxFrameBytes: number
  /** The publisher's connection was dropped for good (a frame over `maxFrameBytes`): the attempt fails with `why`. */
  readonly onDropped?: (why: string) => void
  readonly onSubscribed: () => void
  /**
   * The connection to the publisher was lost and is up again: the publisher may be a new process (a rank that
   * restarted by itself, which the supervisor does not see), whose seq starts over at 0.
   */
  readonly onReconnected?: Effect.Effect<void>
  /** One message; the reader waits for it before receiving the next. */
  readonly onFrames: (frames: ReadonlyArray<Uint8Array>) => Effect.Effect<void, never, Scope.Scope>
}

/** Subscribes and reads until the socket fails or the scope closes; fails with a bind (or connect) or receive error. */
export const readRank = (o: RankSubscription): Effect.Effect<never, unknown, Scope.Scope> =>
  Effect.gen(function* () {
    const at = o.endpoint
    // zeromq (a native addon) is loaded by the first subscription: an agent without [kv] never maps it.
    const zmq = yield* Effect.promise(() => import("zeromq"))
    // A socket the host cannot make (EMFILE: libzmq's context and socket take descriptors) fails the attempt, which
    // is retried with the bridge's backoff and shown meanwhile, in words rather than as a defect.
    const sub = yield* Effect.acquireRelease(
      Effect.try({
        try: () =>
          new zmq.Subscriber({
            linger: 0,
            receiveHighWaterMark: o.receiveHighWaterMark,
            maxMessageSize: o.maxFrameBytes
          }),
        catch: (err) =>
          new Error(`cannot open a ZMQ socket for ${at}: ${err instanceof Error ? err.message : String(err)}`)
      }),
      (s) => Effect.sync(() => s.close())
    )
    sub.subscribe(o.topic)
    yield* o.engineBinds
      ? Effect.try({
          try: () => sub.connect(connectAddress(at)),
          catch: (err) => new Error(`cannot connect to ${at}: ${String(err)}`)
        })
      : Effect.tryPromise({ try: () => sub.bind(at), catch: (err) => new Error(`cannot bind ${at}: ${String(err)}`) })
    const reconnected = o.onReconnected
    // Set when the connection was given up: the reader's receive, rejected by the close, fails the attempt with it.
    let dropped: string | undefined
    // The socket's monitor (ZMQ's events): "connect" (or, bound, "accept") after the last connection's "disconnect" is
    // a reconnect. Ended by the socket's close ("end", or a rejected receive).
    const events = sub.events
    const next = Effect.tryPromise(() => events.receive())
    yield* Effect.forkScoped(
      Effect.gen(function* () {
        // Bound, every process that connects is a peer ("accept" ... "disconnect", paired): only the last one gone,
        // then one back, is the publisher's reconnect. Another local process's connect and close, while the engine's
        // connection stays up, is none (each one took this rank's blocks with a restart Resync).
        let peers = 0
        let lost = false
        // The event right after a disconnect, connected: libzmq's reconnect, or nothing.
        let justLost = false
        for (;;) {
          // Connected, a disconnect not followed by libzmq's own reconnect is one it will never make: a frame over
          // maxFrameBytes (or another ZMTP protocol error) ends the session for good (libzmq session_base.cpp,
          // engine_error). Bound, the publisher is the side that reconnects, and does (a reconnect, as any other).
          const ev = justLost ? yield* Effect.timeoutOption(next, RECONNECT_GRACE_MS) : Option.some(yield* next)
          if (Option.isNone(ev)) {
            dropped = `${at}: the publisher's connection was dropped and is not reconnected: a frame over ${o.maxFrameBytes} bytes (the frame bound from kv.max_queue_bytes) or another ZMQ protocol error`
            o.onDropped?.(dropped)
            sub.close()
            return
          }
          justLost = false
          const type = ev.value.type
          if (type === "end") return
          if (type === "disconnect") {
            peers = Math.max(0, peers - 1)
            lost ||= peers === 0
            justLost = o.engineBinds
          } else if (type === "connect" || type === "accept") {
            peers++
            if (lost && peers === 1) {
              lost = false
              if (reconnected !== undefined) yield* reconnected
            }
          }
        }
      }).pipe(
        Effect.ignore, // the receive the socket's close rejects: its end
        background(
          `the kv events connection monitor of DP rank ${o.rank}`,
          "a publisher's reconnect (a restarted rank) is no longer taken as its stream starting over"
        )
      )
    )
    o.onSubscribed()
    yield* Effect.logInfo("kv events: subscribed", {
      endpoint: at,
      mode: o.engineBinds ? "connect" : "bind",
      topic: o.topic,
      dpRank: o.rank
    })
    for (;;) {
      const frames = yield* Effect.tryPromise({
        try: () => sub.receive(),
        catch: (err) => (dropped !== undefined ? new Error(dropped) : err)
      })
      yield* o.onFrames(frames)
    }
  })
