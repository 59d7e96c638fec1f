// Relay (layers/grpc/Relay.ts) on its own: the per-stream backpressure and what a call's end counts as.
// README "Backpressure": "At most 64 Ki characters wait per stream; beyond that the agent stops reading the engine
// (TCP backpressure), so memory per stream stays bounded."
import { assert, describe, it } from "@effect/vitest"
import { Exit } from "effect"
import { Relay } from "../../src/layers/grpc/Relay.ts"
import { EngineStalled } from "../../src/services/grpc/CallErrors.ts"

const KiB = "y".repeat(1024)
const chunk = (text: string) => [{ choices: [{ index: 0, text }] }]

describe("Relay", () => {
  it("stops reading the engine once 64 Ki characters wait, and reads on when the caller takes them", () => {
    const relay = new Relay(64 * 1024)
    let resumed = 0
    let accepted = 0
    // a producer reads on while told to; nobody takes
    while (relay.onChunks(chunk(KiB), () => resumed++)) {
      accepted++
      assert.isBelow(accepted, 1000, "the producer is never told to wait")
    }
    assert.strictEqual(accepted, 63, "the 64th KiB fills the stream's 64 Ki characters")
    assert.isTrue(relay.paused, "the engine socket is no longer read")
    assert.strictEqual(resumed, 0)
    const taken = relay.take()
    assert.strictEqual(taken?.text.length, 64 * 1024, "at most 64 Ki characters waited")
    assert.strictEqual(resumed, 1, "taking the text resumes the producer")
    assert.isFalse(relay.paused)
  })

  // Relay.completed: "The engine stream ended as the engine ends one (not failed, not cancelled): the engine is not
  // wedged" (a completion clears a stall). A call the watchdog aborted did not end so, even when its run's end
  // (an OK exit) reaches it after the abort.
  it("a call aborted before its run ended OK is not counted as completed", () => {
    const relay = new Relay(1024)
    relay.abort(new EngineStalled({ idleTimeout: "800ms" }))
    relay.finish(Exit.void)
    assert.isTrue(relay.done)
    assert.isFalse(relay.completed)
    assert.instanceOf(relay.failure, EngineStalled)
  })
})
