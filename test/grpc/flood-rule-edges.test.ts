// Edges of the flood rules (services/grpc/FloodRule.ts) that connection-guard-rules.test.ts leaves open: a sample
// whose acks exceed the agent's writes, and the reset mirror's refill, capped at its burst before a stream costs one.
// Pure.
import { describe, expect, it } from "vitest"
import { resetMirror, resetStep, wasted } from "../../src/services/grpc/FloodRule.ts"

describe("flood rule edges", () => {
  it("acks counted beyond the bytes written (written in the next sample) cancel writes only: they add no waste", () => {
    // wasted: the agent's writes less its answers, never below 0, are what the client may send back.
    expect(wasted({ read: 1_000, accounted: 100, written: 50, answered: 200 })).toBe(900)
    expect(wasted({ read: 1_000, accounted: 100, written: 0, answered: 17 })).toBe(900)
  })

  it("a stream costs one from a full mirror however long the connection was quiet (the refill stops at the burst)", () => {
    const burst = 10
    const idle = resetStep(resetMirror(burst, 0), 60_000, burst, 1)
    expect(idle.left).toBe(burst - 1)
    // burst + 1 streams at once after the quiet minute: the mirror is spent (closedReason's reset_flood).
    let m = resetMirror(burst, 0)
    for (let i = 0; i <= burst; i++) m = resetStep(m, 60_000, burst, 1)
    expect(m.left).toBe(-1)
  })
})
