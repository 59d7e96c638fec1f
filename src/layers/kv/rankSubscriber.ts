/**
 * The ZMQ side of one data-parallel rank's KV-event stream: a SUB socket on the rank's endpoint that
 * connects when the engine binds and binds when the engine connects, retrying a failed bind with the
 * shared jittered backoff, then hands every message to the caller. The socket is closed with the scope.
 */
import { Effect, type Scope } from "effect"
import { jitteredBackoffMs } from "../../services/retry/Backoff.ts"

/** The address to connect to for an endpoint the engine binds (`tcp://*:P` -> `tcp://127.0.0.1:P`). */
export const connectAddress = (endpoint: string): string =>
  endpoint.replace(/^tcp:\/\/(\*|\[::\]|::|0\.0\.0\.0):/, "tcp://127.0.0.1:")

export interface RankSubscription {
  readonly rank: number
  /** This rank's endpoint (already offset for the rank). */
  readonly endpoint: string
  readonly engineBinds: boolean
  readonly topic: string
  /** A bind (or connect) failed; it is retried. */
  readonly onOpenFailed: (message: string) => void
  readonly onSubscribed: () => void
  /** One message; the reader waits for it before receiving the next. */
  readonly onFrames: (frames: ReadonlyArray<Uint8Array>) => Effect.Effect<void, never, Scope.Scope>
}

/** Subscribes and reads until the socket fails or the scope closes; fails only with a receive error. */
export const readRank = (o: RankSubscription): Effect.Effect<never, unknown, Scope.Scope> =>
  Effect.gen(function* () {
    const at = o.endpoint
    // zeromq (a native addon) is loaded by the first subscription: an agent without [kv] never maps it.
    const zmq = yield* Effect.promise(() => import("zeromq"))
    const sub = yield* Effect.acquireRelease(
      Effect.sync(() => new zmq.Subscriber({ linger: 0, receiveHighWaterMark: 100_000 })),
      (s) => Effect.sync(() => s.close())
    )
    sub.subscribe(o.topic)
    const open = o.engineBinds
      ? Effect.sync(() => sub.connect(connectAddress(at)))
      : Effect.tryPromise(() => sub.bind(at))
    for (let failures = 1; ; failures++) {
      const res = yield* Effect.result(open)
      if (res._tag === "Success") break
      o.onOpenFailed(`kv events ${at}: ${String(res.failure)}`)
      if (failures === 1) yield* Effect.logError("kv events: cannot bind the endpoint; retrying", { endpoint: at })
      yield* Effect.sleep(jitteredBackoffMs(failures, 5_000, Math.random()))
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
