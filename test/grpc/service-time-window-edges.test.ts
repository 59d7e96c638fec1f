// Edges of the service-time window (services/grpc/ServiceTimes.ts ServiceTimeWindow) that the estimate tests in
// service-times.test.ts leave open: a 0 ms measurement, the count once the ring wraps, and a window that needs all
// of its samples. Pure.
import { describe, expect, it } from "vitest"
import { MIN_SAMPLES, ServiceTimeWindow, WINDOW } from "../../src/services/grpc/ServiceTimes.ts"

describe("ServiceTimeWindow edges", () => {
  it("a call answered in the millisecond its slot was taken (0 ms) is a measurement, not an invalid value", () => {
    // ServiceTimes.ts record: "a negative or non-finite value is ignored": 0 is neither (Clock ms have 1 ms steps).
    const w = new ServiceTimeWindow()
    for (let i = 0; i < MIN_SAMPLES; i++) w.record(0)
    expect([w.count, w.estimate()]).toEqual([MIN_SAMPLES, 0])
  })

  it("counts the measurements it holds, never more than the window's size once the ring wraps", () => {
    const w = new ServiceTimeWindow(8, 2)
    for (let i = 0; i < 8 + 5; i++) w.record(100 + i)
    expect(w.count).toBe(8)
    const full = new ServiceTimeWindow()
    for (let i = 0; i < WINDOW * 2 + 1; i++) full.record(10)
    expect(full.count).toBe(WINDOW)
  })

  it("accepts a minimum equal to the window's size (an estimate only from a full window), refuses one above it", () => {
    const w = new ServiceTimeWindow(4, 4)
    for (const v of [40, 30, 20]) w.record(v)
    expect(w.estimate()).toBeUndefined()
    w.record(10)
    expect(w.estimate()).toBe(10)
    expect(() => new ServiceTimeWindow(4, 5)).toThrow(RangeError)
  })
})
