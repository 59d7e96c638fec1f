import { describe, expect, it } from "vitest"
import { type Start, StartPacer } from "../../src/services/grpc/StartPacer.ts"

/** A pacer over a hand-driven clock and turn queue; each start takes `cost` ms of the clock. */
const harness = (budgetMs: number, cost: number) => {
  let clock = 0
  const turns: Array<() => void> = []
  const ran: Array<number> = []
  const pacer = new StartPacer({ budgetMs, now: () => clock, defer: (f) => turns.push(f) })
  const start =
    (id: number): Start =>
    () => {
      ran.push(id)
      clock += cost
    }
  /** Runs the next deferred turn; false when none is pending. */
  const nextTurn = (): boolean => {
    const f = turns.shift()
    if (f === undefined) return false
    f()
    return true
  }
  return {
    pacer,
    start,
    ran,
    turns,
    nextTurn,
    advance: (ms: number) => {
      clock += ms
    }
  }
}

describe("StartPacer", () => {
  it("starts calls at once while a turn's starts stay within the budget, deferring nothing", () => {
    const h = harness(0.5, 0.125)
    for (let i = 0; i < 4; i++) h.pacer.start(h.start(i))
    expect(h.ran).toEqual([0, 1, 2, 3])
    expect(h.pacer.queued).toBe(0)
    expect(h.turns).toHaveLength(0)
  })

  it("queues the rest of a burst once the budget is spent and runs it a budget per later turn, in order", () => {
    // Costs that binary fractions hold exactly: 0.625 ms is spent after the fifth start.
    const h = harness(0.5, 0.125)
    for (let i = 0; i < 20; i++) h.pacer.start(h.start(i))
    expect(h.ran).toEqual([0, 1, 2, 3, 4])
    expect(h.pacer.queued).toBe(15)
    expect(h.turns).toHaveLength(1)
    expect(h.nextTurn()).toBe(true)
    expect(h.ran).toEqual([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    // A call arriving while others wait goes behind them, not ahead.
    h.pacer.start(h.start(100))
    expect(h.ran).not.toContain(100)
    while (h.nextTurn()) {
      // each turn runs five starts (0.625 ms) of the queue
    }
    expect(h.ran).toEqual([...Array.from({ length: 20 }, (_, i) => i), 100])
    expect(h.pacer.queued).toBe(0)
  })

  it("runs at least one queued start per turn, even one that alone exceeds the budget", () => {
    const h = harness(0.5, 2)
    for (let i = 0; i < 3; i++) h.pacer.start(h.start(i))
    expect(h.ran).toEqual([0])
    expect(h.nextTurn()).toBe(true)
    expect(h.ran).toEqual([0, 1])
    expect(h.nextTurn()).toBe(true)
    expect(h.ran).toEqual([0, 1, 2])
    expect(h.nextTurn()).toBe(false)
  })

  it("starts at once again after the queue has drained", () => {
    const h = harness(0.5, 0.2)
    for (let i = 0; i < 6; i++) h.pacer.start(h.start(i))
    while (h.nextTurn()) {
      // drain
    }
    expect(h.ran).toEqual([0, 1, 2, 3, 4, 5])
    h.advance(10)
    h.pacer.start(h.start(6))
    expect(h.ran.at(-1)).toBe(6)
    expect(h.turns).toHaveLength(0)
  })

  it("gives a later turn a fresh budget: sparse calls are never deferred", () => {
    const h = harness(0.5, 0.3)
    for (let i = 0; i < 10; i++) {
      h.pacer.start(h.start(i))
      h.advance(1)
    }
    expect(h.ran).toEqual([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    expect(h.turns).toHaveLength(0)
  })
})
