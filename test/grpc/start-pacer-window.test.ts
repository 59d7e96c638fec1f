// StartPacer (services/grpc/StartPacer.ts): where the first window begins, and what `queued` counts while the
// deferred drain works through the queue a budget at a time. Pure: a hand-driven clock and turn queue.
import { describe, expect, it } from "vitest"
import { StartPacer } from "../../src/services/grpc/StartPacer.ts"

const harness = (budgetMs: number, cost: number, clockAt: number) => {
  let clock = clockAt
  const turns: Array<() => void> = []
  const ran: Array<number> = []
  const pacer = new StartPacer({ budgetMs, now: () => clock, defer: (f) => turns.push(f) })
  const start = (id: number) => () => {
    ran.push(id)
    clock += cost
  }
  return { pacer, start, ran, turns }
}

describe("StartPacer windows", () => {
  it("the first window begins at the first start, whatever the clock read before (a monotonic clock's origin is arbitrary)", () => {
    // Budget 10 ms, the clock at 5 ms, a start of 6 ms: 6 ms spent in the window, within its budget.
    const h = harness(10, 6, 5)
    h.pacer.start(h.start(0))
    expect(h.turns).toHaveLength(0)
    h.pacer.start(h.start(1)) // 12 ms in this window now: over budget, later starts wait
    expect(h.ran).toEqual([0, 1])
    expect(h.turns).toHaveLength(1)
  })

  it("`queued` counts the starts still waiting, not those a drain already ran", () => {
    // Budget 1 ms, each start 1 ms: the first window runs two, each drain turn two (the second puts it over).
    const h = harness(1, 1, 0)
    for (let i = 0; i < 7; i++) h.pacer.start(h.start(i))
    expect([h.ran, h.pacer.queued]).toEqual([[0, 1], 5])
    h.turns.shift()!()
    expect([h.ran, h.pacer.queued]).toEqual([[0, 1, 2, 3], 3])
    h.turns.shift()!()
    expect(h.pacer.queued).toBe(1)
    h.turns.shift()!()
    expect([h.ran.length, h.pacer.queued, h.turns.length]).toEqual([7, 0, 0])
  })
})
