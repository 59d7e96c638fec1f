/**
 * The ZMQ side of one data-parallel rank's KV-event stream: a SUB socket on the rank's endpoint that
 * connects when the engine binds and binds when the engine connects, then hands every message to the caller.
 * The socket is closed with the scope. A failed bind fails the attempt like a failed receive: the caller's
 * retry loop (retrying.ts) tries again with the bridge's backoff and its cap, and shows the failure meanwhile.
 */
import { Effect, type Scope } from "effect"

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
    const sub = yield* Effect.acquireRelease(
      Effect.sync(() => new zmq.Subscriber({ linger: 0, receiveHighWaterMark: o.receiveHighWaterMark })),
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
    if (reconnected !== undefined) {
      // The socket's monitor (ZMQ's events): "connect" (or, bound, "accept") after a "disconnect". Ended by the
      // socket's close ("end", or a rejected receive).
      const events = sub.events
      yield* Effect.forkScoped(
        Effect.gen(function* () {
          let lost = false
          for (;;) {
            const ev = yield* Effect.tryPromise(() => events.receive())
            if (ev.type === "end") return
            if (ev.type === "disconnect") lost = true
            else if (lost && (ev.type === "connect" || ev.type === "accept")) {
              lost = false
              yield* reconnected
            }
          }
        }).pipe(Effect.ignore)
      )
    }
    o.onSubscribed()
    yield* Effect.logInfo("kv events: subscribed", {
      endpoint: at,
      mode: o.engineBinds ? "connect" : "bind",
      topic: o.topic,
      dpRank: o.rank
    })
    for (;;) {
      const frames = yield* Effect.tryPromise(() => sub.receive())
      yield* o.onFrames(frames)
    }
  })
