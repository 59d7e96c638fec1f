// Flap damping (services/engine/FlapDamping.ts) at two edges flap-damping.test.ts does not reach: a wall clock that
// steps back, the reason's "held until about" minute, and a clear that arrives once the hold has decayed but before the hold's end was applied (onRelease).
import { assert, describe, it } from "@effect/vitest"
import {
  aboutUntil,
  type Damping,
  HALF_LIFE_MS,
  isHeld,
  onClear,
  onTrip,
  penaltyAt,
  releaseAt,
  undamped
} from "../../src/services/engine/FlapDamping.ts"

/** Trips at `times` (ms) from no penalty. */
const trips = (times: ReadonlyArray<number>): Damping => times.reduce(onTrip, undamped)

describe("flap damping edges (pure)", () => {
  it("a clock stepped back does not grow the penalty: it only ever decays (RFC 2439's figure of merit)", () => {
    // `now` is the wall clock (epoch ms), which NTP may step back; a negative age must count as 0, not as growth
    const d = onTrip(undamped, 600_000)
    assert.strictEqual(penaltyAt(d, 600_000 - HALF_LIFE_MS), 1)
    // a trip "before" the last one adds its 1 to the penalty as it stands, not to a doubled one
    assert.strictEqual(onTrip(d, 600_000 - HALF_LIFE_MS).penalty, 2)
    // a third trip with the clock stepped back 4 minutes: 2 + 1, not the ceiling (2 doubled twice, plus 1, capped)
    const two = trips([600_000, 600_000])
    const third = onTrip(two, 600_000 - 2 * HALF_LIFE_MS)
    assert.strictEqual(third.penalty, 3)
  })

  it("once the penalty has decayed to the reuse level, a clear clears at once, even before the hold's end was applied", () => {
    const d = trips([0, 30_000, 60_000, 90_000])
    const end = releaseAt(d)!
    assert.isTrue(d.suppressed)
    assert.isFalse(isHeld(d, end))
    // the clear (calls completed in a row, or the test) after the end: given, not owed for a release already past
    assert.isTrue(onClear(d, end))
    assert.isTrue(onClear(d, end + 60_000))
    // before the end it is owed
    assert.notStrictEqual(onClear(d, end - 1), true)
  })

  it("the reason's \"held until about\" is the hold's end rounded up to the minute, never a minute before it", () => {
    // four trips at 0:10: the penalty at its ceiling of 4, held to 0:10 + 2 min · log2(4) = 4:10, shown as 5:00
    const d = trips([10_000, 10_000, 10_000, 10_000])
    assert.strictEqual(releaseAt(d), 10_000 + 2 * HALF_LIFE_MS)
    assert.strictEqual(aboutUntil(d), 300_000)
    assert.isAtLeast(aboutUntil(d)!, releaseAt(d)!)
  })
})
