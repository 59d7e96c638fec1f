// The drain lever (services/node/Drain.ts): idempotent, and it tells the one call that began the drain, so two
// POST /drain at once cannot both answer `alreadyDraining: false`.
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { Drain } from "../../src/services/node/Drain.ts"

const withDrain = <A>(use: Effect.Effect<A, never, Drain>) => Effect.runPromise(Effect.provide(use, Drain.layer))

describe("Drain", () => {
  it("answers true to the one start that began the drain, however many run at once", async () => {
    const { began, draining } = await withDrain(
      Effect.gen(function* () {
        const drain = yield* Drain
        const before = yield* drain.draining
        const began = yield* Effect.all(
          Array.from({ length: 8 }, () => drain.start),
          { concurrency: "unbounded" }
        )
        return { began, draining: [before, yield* drain.draining] }
      })
    )
    expect(began.filter((b) => b)).toHaveLength(1)
    expect(draining).toEqual([false, true])
  })

  it("a start after the drain began answers false and changes nothing", async () => {
    const answers = await withDrain(
      Effect.gen(function* () {
        const drain = yield* Drain
        const first = yield* drain.start
        yield* drain.awaitStarted
        return [first, yield* drain.start, yield* drain.start]
      })
    )
    expect(answers).toEqual([true, false, false])
  })
})
