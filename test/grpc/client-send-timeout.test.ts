// agent.client_send_timeout on a TestClock, over relays of the test's own making (as GenerateCall marks them): a call
// its caller holds back (Relay.held: its HTTP/2 buffer full, no 'drain' since) for the timeout is ended with
// ClientNotReading (its engine request aborted), counted once; one the caller reads again in time is not; a done call
// still held has its waiting output dropped; "0s" never ends one. The stall watchdog (stall-watchdog.test.ts) runs the
// same tick.
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Layer } from "effect"
import { TestClock } from "effect/testing"
import { layerFromObject } from "../../src/layers/config/Config.ts"
import { ActiveCalls } from "../../src/layers/grpc/ActiveCalls.ts"
import { Relay } from "../../src/layers/grpc/Relay.ts"
import * as StallWatchdog from "../../src/layers/grpc/StallWatchdog.ts"
import { ClientNotReading } from "../../src/services/grpc/CallErrors.ts"
import { toGrpcFailure } from "../../src/services/grpc/GrpcStatus.ts"
import { Metrics } from "../../src/services/observability/Metrics.ts"
import * as MetricsTest from "../../src/testing/Metrics.ts"

const SEND_MS = 800 // the watchdog ticks every 800 / 8 = 100 ms (the stall timeout is longer)

const layerWith = (sendTimeout: string) =>
  Layer.mergeAll(
    layerFromObject({
      models: { m: { hf_repo: "org/m" } },
      agent: { client_send_timeout: sendTimeout },
      engine: { stream_idle_timeout: "1h" }
    }),
    MetricsTest.layerTest
  )

/** A relay streaming from the engine; `aborted` says whether its engine request was interrupted. */
const streaming = (active: ActiveCalls) => {
  const relay = new Relay(1024)
  relay.streamRequested(0)
  relay.requestId = `r${active.size}`
  const state = { aborted: false, woken: 0 }
  relay.interrupt = () => {
    state.aborted = true
  }
  relay.consumer = () => {
    state.woken++
  }
  active.add(relay)
  return { relay, state }
}

/** The call's write found its buffer full (GenerateCall's pump), and the caller's 'drain'. */
const hold = (relay: Relay) => relay.hold()
const drain = (relay: Relay) => relay.release()

const cuts = Effect.flatMap(Metrics, (m) =>
  Effect.promise(async () => (await m.clientSendTimeouts.get()).values.reduce((n, v) => n + v.value, 0))
)

describe("agent.client_send_timeout", () => {
  it.effect("a call held back past the timeout is ended (engine request aborted); one read again in time is not", () =>
    Effect.gen(function* () {
      const active = new ActiveCalls()
      yield* StallWatchdog.fork(active)
      const stuck = streaming(active)
      const reader = streaming(active)
      const free = streaming(active)
      hold(stuck.relay)
      hold(reader.relay)
      // the reader reads (a 'drain') and is held again before each timeout ends: each wait is a new one
      for (let i = 0; i < 3; i++) {
        yield* TestClock.adjust(SEND_MS - 200)
        drain(reader.relay)
        hold(reader.relay)
      }
      assert.isTrue(stuck.state.aborted, "held for the whole timeout")
      assert.instanceOf(stuck.relay.failure, ClientNotReading)
      assert.strictEqual(stuck.relay.failure?.message.includes("800ms (agent.client_send_timeout)"), true)
      assert.isTrue(toGrpcFailure(stuck.relay.failure!).reset, "sent as a reset, not trailers")
      assert.isFalse(reader.state.aborted, "read again within each timeout")
      assert.isFalse(free.state.aborted, "never held")
      assert.strictEqual(yield* cuts, 1)
      // counted once, though it stays in the active set until the call settles; the reader, held from its last
      // write with no read since, goes the same way
      yield* TestClock.adjust(SEND_MS * 2)
      assert.isTrue(reader.state.aborted)
      assert.strictEqual(yield* cuts, 2)
    }).pipe(Effect.scoped, Effect.provide(layerWith(`${SEND_MS}ms`)))
  )

  it.effect("a done call whose output still waits for its caller is ended too (its output dropped)", () =>
    Effect.gen(function* () {
      const active = new ActiveCalls()
      yield* StallWatchdog.fork(active)
      const done = streaming(active)
      hold(done.relay)
      done.relay.finish(Exit.succeed(undefined))
      const woken = done.state.woken
      yield* TestClock.adjust(SEND_MS + 200)
      assert.instanceOf(done.relay.failure, ClientNotReading)
      assert.isAbove(done.state.woken, woken, "the call is told, to reset its stream")
      assert.isFalse(done.state.aborted, "no engine request left to abort")
    }).pipe(Effect.scoped, Effect.provide(layerWith(`${SEND_MS}ms`)))
  )

  it.effect('"0s" never ends a call for it', () =>
    Effect.gen(function* () {
      const active = new ActiveCalls()
      yield* StallWatchdog.fork(active)
      const stuck = streaming(active)
      hold(stuck.relay)
      yield* TestClock.adjust(10 * 60_000)
      assert.isFalse(stuck.state.aborted)
      assert.isUndefined(stuck.relay.failure)
      assert.strictEqual(yield* cuts, 0)
    }).pipe(Effect.scoped, Effect.provide(layerWith("0s")))
  )
})
