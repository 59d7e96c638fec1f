// cgn_agent_background_failures_total{fiber} (services/observability/Metrics.ts): each death of a background loop
// (src/layers/observability/backgroundFiber.ts) counted once under the loop's name, those not said again (the same
// defect in a row) too; a 0 sample from its start, so increase() sees the first death; its scope's interruption
// counted nowhere. Over the tests' bare registry (src/testing/Metrics.ts), on a TestClock.
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber, Logger } from "effect"
import { TestClock } from "effect/testing"
import { background } from "../../src/layers/observability/backgroundFiber.ts"
import { Metrics } from "../../src/services/observability/Metrics.ts"
import * as MetricsTest from "../../src/testing/Metrics.ts"
import { settle } from "../support/poll.ts"

const quiet = Effect.provide(Logger.layer([]))
const consequence = "nothing is watched any more"

/** The series' sample for `fiber` on a scrape, or undefined without one. */
const sample = (fiber: string) =>
  Effect.gen(function* () {
    const { body } = yield* (yield* Metrics).render
    const line = body.split("\n").find((l) => l.startsWith(`cgn_agent_background_failures_total{fiber="${fiber}"} `))
    return line === undefined ? undefined : Number(line.split(" ").at(-1))
  })

describe("cgn_agent_background_failures_total", () => {
  it.effect("counts each death once under the loop's name, from a 0 sample; its interruption not", () =>
    Effect.gen(function* () {
      let runs = 0
      const loop = Effect.suspend(() => {
        runs++
        if (runs === 1) return Effect.never // a first run that is not a death: the sample is there, at 0
        return runs <= 5 ? Effect.die(new Error("the same bug")) : Effect.never
      })
      const first = yield* Effect.forkChild(
        loop.pipe(background("the test loop", consequence, { restart: { baseMs: 10, capMs: 10_000 } }))
      )
      yield* settle(
        "the first run",
        Effect.sync(() => runs === 1)
      )
      assert.strictEqual(yield* sample("the test loop"), 0)
      yield* Fiber.interrupt(first)
      assert.strictEqual(yield* sample("the test loop"), 0, "an interruption by its scope is no death")
      // runs 2 to 5 die (the 3rd of them not said: the same defect in a row), the 6th waits
      const second = yield* Effect.forkChild(
        loop.pipe(background("the test loop", consequence, { restart: { baseMs: 10, capMs: 10_000 } }))
      )
      yield* settle(
        "six runs",
        Effect.andThen(
          TestClock.adjust(10),
          Effect.sync(() => runs === 6)
        )
      )
      assert.strictEqual(yield* sample("the test loop"), 4)
      // a loop that is not restarted, and an interruption from within, count as deaths too; under their own names
      yield* Effect.die(new Error("bug")).pipe(background("the test watcher", consequence))
      yield* Effect.interrupt.pipe(background("the test joiner", consequence))
      assert.strictEqual(yield* sample("the test watcher"), 1)
      assert.strictEqual(yield* sample("the test joiner"), 1)
      yield* Fiber.interrupt(second)
      assert.strictEqual(yield* sample("the test loop"), 4)
    }).pipe(quiet, Effect.provide(MetricsTest.layerTest))
  )

  it.effect("without the Metrics service a loop runs, dies and is restarted as with it", () =>
    Effect.gen(function* () {
      let runs = 0
      const loop = Effect.suspend(() => {
        runs++
        return runs === 1 ? Effect.die(new Error("bug")) : Effect.never
      })
      const fiber = yield* Effect.forkChild(
        loop.pipe(background("the test loop", consequence, { restart: { baseMs: 10, capMs: 10_000 } }))
      )
      yield* settle(
        "the second run",
        Effect.andThen(
          TestClock.adjust(10),
          Effect.sync(() => runs === 2)
        )
      )
      yield* Fiber.interrupt(fiber)
    }).pipe(quiet)
  )
})
