// The stall state (services/engine/EngineStall.ts) where two events share a millisecond, as they do within one
// watchdog tick (layers/engine/engineWatch.ts: the tick's stalls and completions carry the tick's `now`): a completion
// at the stall's own time clears it, and a stream that moved at the stall's own time holds its restart back.
import { assert, describe, it } from "@effect/vitest"
import { isStalled, noStall, onCompleted, onStall, stallRestartAt } from "../../src/services/engine/EngineStall.ts"

describe("the stall state within one millisecond", () => {
  it("a completion at the very time of the stall clears it: the engine completed a call, it is not wedged", () => {
    const stalled = onStall(noStall, 5_000)
    assert.isTrue(isStalled(stalled))
    const cleared = onCompleted(stalled, 5_000)
    assert.isDefined(cleared)
    assert.isFalse(isStalled(cleared!))
    assert.isUndefined(stallRestartAt(cleared!, 60_000))
  })

  it("a stream that moved at the stall's start counts as one older than the stall: the restart waits it out", () => {
    const s = onStall(noStall, 5_000)
    // moved at 5 s, the stall's start: proof that the engine generates, so not before an idle timeout after it
    assert.strictEqual(stallRestartAt(s, 1_000, 8_000, 5_000), 13_000)
    assert.strictEqual(stallRestartAt(s, 1_000, 8_000, 4_999), 6_000, "a move from before the stall")
  })
})
