// How the background combinator (src/layers/observability/backgroundFiber.ts) counts a restarting loop's deaths: a
// run that lasted the cap starts the backoff (and its count) over; only the same death in a row is said less often,
// "the same" being the error's first line, not its stack, and counted apart from the backoff (a defect back after
// every cap-long run is said at its 2nd, 4th, 8th... time, not at each); a loop that ends by success is over, not
// restarted; an interruption that met a defect on the way says the defect (a one-shot fiber's without "not
// restarted") and still ends as the interruption it is. On a TestClock.
import { assert, describe, it } from "@effect/vitest"
import { Cause, Effect, Fiber } from "effect"
import { TestClock } from "effect/testing"
import { background, RESTART } from "../../src/layers/observability/backgroundFiber.ts"
import { captureMessages } from "../support/logCapture.ts"
import { settle } from "../support/poll.ts"

const capture = captureMessages

const consequence = "nothing is watched any more"
const retryIn = (line: string | undefined): number => Number(/restarting it in (\d+) ms/.exec(line ?? "")?.[1])
const count = (line: string | undefined): string => / \((\d+) times in a row\)$/.exec(line ?? "")?.[1] ?? "1"

/** Dies at once, then (run 2) after `secondMs`, then waits for ever; the same error each time. */
const dyingAfter = (secondMs: number) => {
  let runs = 0
  const loop = Effect.suspend(() => {
    runs++
    if (runs === 1) return Effect.die(new Error("the same bug"))
    if (runs === 2) return Effect.andThen(Effect.sleep(secondMs), Effect.die(new Error("the same bug")))
    return Effect.never
  })
  return { loop, runs: () => runs }
}

/** Runs `dyingAfter(secondMs)` under a 100 ms base, 1 s cap; the two lines its two deaths were said in. */
const twoDeaths = (secondMs: number) => {
  const { lines, provide } = capture()
  return Effect.gen(function* () {
    const { loop, runs } = dyingAfter(secondMs)
    const fiber = yield* Effect.forkChild(
      loop.pipe(background("the test loop", consequence, { restart: { baseMs: 100, capMs: 1_000 } }))
    )
    yield* settle(
      "the first death said",
      Effect.sync(() => lines.length === 1)
    )
    // to the clock's millisecond: run 2 starts at the end of the first delay and dies `secondMs` later
    yield* TestClock.adjust(retryIn(lines[0]))
    yield* settle(
      "run 2 started",
      Effect.sync(() => runs() === 2)
    )
    yield* TestClock.adjust(secondMs)
    yield* settle(
      "the second death said",
      Effect.sync(() => lines.length === 2)
    )
    yield* Fiber.interrupt(fiber)
    return lines
  }).pipe(provide)
}

describe("background's restart count", () => {
  it.effect("a run that lasted the cap starts the backoff over: the next death waits the base's delay", () =>
    Effect.gen(function* () {
      const lines = yield* twoDeaths(1_000)
      assert.isAtMost(retryIn(lines[1]), 100, "the base's delay, jittered down")
      // the same death's count is not the backoff's: it goes on (the next test)
      assert.strictEqual(count(lines[1]), "2", lines[1])
    })
  )

  it.effect(
    "a defect back after every cap-long run: said at its 1st, 2nd, 4th and 8th time, the backoff over each time",
    () => {
      const { lines, provide } = capture()
      return Effect.gen(function* () {
        let runs = 0
        const loop = Effect.suspend(() => {
          runs++
          return runs <= 9 ? Effect.andThen(Effect.sleep(1_000), Effect.die(new Error("the same bug"))) : Effect.never
        })
        const fiber = yield* Effect.forkChild(
          loop.pipe(background("the test loop", consequence, { restart: { baseMs: 100, capMs: 1_000 } }))
        )
        yield* settle(
          "ten runs",
          Effect.andThen(
            TestClock.adjust(50),
            Effect.sync(() => runs === 10)
          )
        )
        yield* Fiber.interrupt(fiber)
        assert.deepStrictEqual(lines.map(count), ["1", "2", "4", "8"], JSON.stringify(lines))
        for (const line of lines) assert.isAtMost(retryIn(line), 100, `each from the base's delay: ${line}`)
      }).pipe(provide)
    }
  )

  it.effect("a run a millisecond short of the cap counts on: the second death in a row, the delay doubled", () =>
    Effect.gen(function* () {
      const lines = yield* twoDeaths(999)
      assert.strictEqual(count(lines[1]), "2", lines[1])
      assert.isAtLeast(retryIn(lines[1]), 100)
    })
  )

  /** A loop that dies with `death(run)` on its first three runs and then waits, restarted 10 ms on: run to the 4th. */
  const threeDeaths = (death: (run: number) => unknown) =>
    Effect.gen(function* () {
      let runs = 0
      const loop = Effect.suspend(() => {
        runs++
        return runs <= 3 ? Effect.die(death(runs)) : Effect.never
      })
      const fiber = yield* Effect.forkChild(
        loop.pipe(background("the test loop", consequence, { restart: { baseMs: 10, capMs: 10_000 } }))
      )
      yield* settle(
        "four runs",
        Effect.andThen(
          TestClock.adjust(10),
          Effect.sync(() => runs === 4)
        )
      )
      yield* Fiber.interrupt(fiber)
    })

  it.effect("different deaths in a row are each said, with the count", () => {
    const { lines, provide } = capture()
    return Effect.gen(function* () {
      yield* threeDeaths((run) => new Error(`bug ${run}`))
      assert.deepStrictEqual(lines.map(count), ["1", "2", "3"], JSON.stringify(lines))
    }).pipe(provide)
  })

  it.effect("the same error thrown from different places is the same death: its stack is not what tells them", () => {
    const { lines, provide } = capture()
    return Effect.gen(function* () {
      yield* threeDeaths((run) =>
        Object.assign(new Error("the same bug"), { stack: `Error: the same bug\n    at site${run} (/x.ts:1:1)` })
      )
      // the 3rd in a row is not a power of two: not said
      assert.deepStrictEqual(lines.map(count), ["1", "2"], JSON.stringify(lines))
    }).pipe(provide)
  })

  it.effect("a loop that ends by success is over: not restarted, nothing said", () => {
    const { lines, provide } = capture()
    return Effect.gen(function* () {
      let runs = 0
      let over = false
      const loop = Effect.suspend(() => {
        runs++
        return runs === 1 ? Effect.void : Effect.die(new Error("run again"))
      })
      yield* Effect.forkChild(
        loop.pipe(
          background("the test stream", consequence, { restart: { baseMs: 10, capMs: 10_000 } }),
          Effect.andThen(Effect.sync(() => (over = true)))
        )
      )
      yield* settle(
        "the loop over",
        Effect.sync(() => over)
      )
      assert.strictEqual(runs, 1)
      assert.deepStrictEqual(lines, [])
    }).pipe(provide)
  })

  it.effect("an interruption that met a defect says the defect, is not restarted and stays an interruption", () => {
    const { lines, provide } = capture()
    return Effect.gen(function* () {
      // its scope ends it, and a finalizer of its own dies on the way out: the cause holds both
      let runs = 0
      const dying = Effect.suspend(() => {
        runs++
        return Effect.never.pipe(Effect.ensuring(Effect.die(new Error("met on the way out"))))
      })
      const cases = [
        ["the test loop", {}],
        ["the test loop", { restart: { baseMs: 10, capMs: 10_000 } }],
        // a one-shot fiber (one test, one write) is no loop to restart: its consequence alone says what follows
        ["the test write", { oneShot: true as const }]
      ] as const
      for (const [name, options] of cases) {
        const fiber = yield* Effect.forkChild(dying.pipe(background(name, consequence, options)))
        const before = runs
        yield* settle(
          "the loop running",
          Effect.sync(() => runs === before + 1)
        )
        yield* Fiber.interrupt(fiber)
        const exit = yield* Fiber.await(fiber)
        assert.isTrue(exit._tag === "Failure" && Cause.hasInterrupts(exit.cause), "still an interruption")
      }
      yield* TestClock.adjust(10_000)
      assert.strictEqual(runs, 3, "none run again")
      const said = `the test loop stopped on a defect of the agent's: ${consequence}; not restarted (restart the agent)`
      assert.deepStrictEqual(lines, [said, said, `the test write stopped on a defect of the agent's: ${consequence}`])
    }).pipe(provide)
  })

  it("restarts by default from 1 s, doubling to a minute (the agent's reconnect pace)", () => {
    assert.deepStrictEqual(RESTART, { baseMs: 1_000, capMs: 60_000 })
  })
})
