// The shared jittered retry delay (services/retry/Backoff.ts) at its edges, which the callers' own tests
// (test/tls, test/kv, test/registry) do not reach: a count of 0 failures, and the rounding to whole milliseconds.
import { describe, expect, it } from "vitest"
import { jitteredBackoffMs } from "../../src/services/retry/Backoff.ts"

describe("jitteredBackoffMs edges", () => {
  it("0 failures waits as long as 1: the doubling starts at the base, never below it", () => {
    // A caller that counts from 0 (no failure recorded yet) must not get a half-length first delay.
    expect(jitteredBackoffMs(0, 60_000, 1)).toBe(100)
    expect(jitteredBackoffMs(0, 60_000, 0)).toBe(jitteredBackoffMs(1, 60_000, 0))
    expect(jitteredBackoffMs(-3, 60_000, 1, 1000)).toBe(1000)
  })

  it("the jittered delay is rounded to the nearest whole millisecond, not truncated", () => {
    // 100 ms · (0.5 + 0.013 / 2) = 50.65 ms
    expect(jitteredBackoffMs(1, 60_000, 0.013)).toBe(51)
    // 100 ms · (0.5 + 0.009 / 2) = 50.45 ms
    expect(jitteredBackoffMs(1, 60_000, 0.009)).toBe(50)
  })
})
