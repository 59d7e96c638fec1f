/** EventLoopLag: a blocked event loop shows up in the sample. */
import { Effect, Schedule } from "effect"
import { expect, it } from "vitest"
import { layer } from "../../src/layers/node/EventLoopLag.ts"
import { EventLoopLag } from "../../src/services/node/EventLoopLag.ts"

it("reports a blocked event loop as lag", async () => {
  const program = Effect.gen(function* () {
    const lag = yield* EventLoopLag
    // one turn of the loop so the histogram's timer is armed before we block (not a wait for a result)
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
