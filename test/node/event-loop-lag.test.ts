/** EventLoopLag: a blocked event loop shows up in the sample. */
import { Effect, Schedule } from "effect"
import { expect, it } from "vitest"
import { layer } from "../../src/layers/node/EventLoopLag.ts"
import { EventLoopLag } from "../../src/services/node/EventLoopLag.ts"

it("reports a blocked event loop as lag", async () => {
  const program = Effect.gen(function* () {
    const lag = yield* EventLoopLag
    // A few of the histogram's 10 ms ticks before blocking (not a wait for a result): Node records a delay only
    // from a tick with one before it, so a block right after enable() is not seen (tried: a setImmediate turn
    // instead fails every time).
    yield* Effect.sleep("30 millis")
    const until = Date.now() + 150
    while (Date.now() < until) {
      // block the loop on purpose
    }
    // the histogram records the delay once its timer runs again: poll, bounded
    return yield* lag.sample.pipe(
      Effect.repeat({ schedule: Schedule.spaced("10 millis"), until: (s) => s.maxMs >= 100 }),
      Effect.timeout("5 seconds")
    )
  }).pipe(Effect.provide(layer({ resolutionMs: 10, window: "10 seconds" })))
  const sample = await Effect.runPromise(program)
  expect(sample.maxMs).toBeGreaterThanOrEqual(100)
  expect(sample.windowMs).toBe(10_000)
})
