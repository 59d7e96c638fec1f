/** EventLoopLag: a blocked event loop shows up in the sample. */
import { Effect } from "effect"
import { expect, it } from "vitest"
import { layer } from "../src/layers/EventLoopLag.ts"
import { EventLoopLag } from "../src/services/EventLoopLag.ts"

it("reports a blocked event loop as lag", async () => {
  const program = Effect.gen(function* () {
    const lag = yield* EventLoopLag
    // let the histogram take a few samples first
    yield* Effect.sleep("60 millis")
    const until = Date.now() + 150
    while (Date.now() < until) {
      // block the loop on purpose
    }
    yield* Effect.sleep("60 millis")
    return yield* lag.sample
  }).pipe(Effect.provide(layer({ resolutionMs: 10, window: "10 seconds" })))
  const sample = await Effect.runPromise(program)
  expect(sample.maxMs).toBeGreaterThanOrEqual(100)
  expect(sample.windowMs).toBe(10_000)
})
