// The background-fiber combinator (src/layers/observability/backgroundFiber.ts): a long-lived fiber's end by a defect
// or by a failure it does not handle is one error line naming it, what stops and that it is the agent's defect, with
// the cause; an interruption (a scope ending it) is said nowhere; with `restart`, the loop runs again after its
// backoff, and is still ended quietly by an interruption. On a TestClock: no real waits.
import { assert, describe, it } from "@effect/vitest"
import { Cause, Effect, Fiber, Logger } from "effect"
import { TestClock } from "effect/testing"
import { background } from "../../src/layers/observability/backgroundFiber.ts"
import { settle } from "../support/poll.ts"

interface Line {
  readonly level: string
  readonly text: string
  readonly fields: Record<string, unknown> | undefined
  readonly cause: string
}

const capture = () => {
  const lines: Array<Line> = []
  const logger = Logger.make(({ logLevel, message, cause }) => {
    const [text, fields] = [message].flat() as [string, Record<string, unknown> | undefined]
    lines.push({ level: logLevel, text, fields, cause: cause.reasons.length > 0 ? Cause.pretty(cause) : "" })
  })
  return { lines, provide: Effect.provide(Logger.layer([logger])) }
}

const consequence = "nothing is watched any more"

/** Moves the TestClock on by `stepMs` at a time until `done`: a sleep begun after a step is woken by a later one. */
const advanceUntil = (what: string, stepMs: number, done: () => boolean) =>
  settle(what, Effect.andThen(TestClock.adjust(stepMs), Effect.sync(done)))

describe("background", () => {
  it.effect("a defect: one error line with the fiber's name, what stops and the cause", () => {
    const { lines, provide } = capture()
    return Effect.gen(function* () {
      yield* Effect.die(new TypeError("x is not a function")).pipe(background("the test watcher", consequence))
      assert.strictEqual(lines.length, 1, JSON.stringify(lines))
      const [line] = lines
      assert.strictEqual(line?.level, "Error")
      assert.strictEqual(
        line?.text,
        `the test watcher stopped on a defect of the agent's: ${consequence}; not restarted (restart the agent)`
      )
      assert.deepStrictEqual(line?.fields, { fiber: "the test watcher" })
      assert.include(line?.cause, "TypeError: x is not a function")
    }).pipe(provide)
  })

  it.effect("a one-shot fiber (one test, one write) says what follows, not to restart the agent", () => {
    const { lines, provide } = capture()
    return Effect.gen(function* () {
      yield* Effect.die(new TypeError("boom")).pipe(
        background("the test request", "this test concluded nothing; the next one is sent as due", { oneShot: true })
      )
      assert.deepStrictEqual(
        lines.map((l) => l.text),
        [
          "the test request stopped on a defect of the agent's: this test concluded nothing; the next one is sent as due"
        ]
      )
    }).pipe(provide)
  })

  it.effect("a typed failure the loop leaves unhandled is said too, as the agent's defect", () => {
    const { lines, provide } = capture()
    return Effect.gen(function* () {
      yield* Effect.fail(new Error("EMFILE: too many open files")).pipe(background("the test reader", consequence))
      assert.deepStrictEqual(
        lines.map((l) => [l.level, l.text]),
        [
          [
            "Error",
            `the test reader stopped on a failure it does not handle (a defect of the agent's): ${consequence}; not restarted (restart the agent)`
          ]
        ]
      )
      assert.include(lines[0]?.cause, "EMFILE: too many open files")
    }).pipe(provide)
  })

  it.effect("an interruption (the scope ending the fiber) is said nowhere, restarting or not", () => {
    const { lines, provide } = capture()
    return Effect.gen(function* () {
      let started = 0
      const loop = Effect.andThen(
        Effect.sync(() => started++),
        Effect.never
      )
      const plain = yield* Effect.forkChild(loop.pipe(background("the plain loop", consequence)))
      const restarting = yield* Effect.forkChild(
        loop.pipe(background("the restarting loop", consequence, { restart: { baseMs: 100, capMs: 1_000 } }))
      )
      yield* settle(
        "both loops started",
        Effect.sync(() => started === 2)
      )
      yield* Fiber.interrupt(plain)
      yield* Fiber.interrupt(restarting)
      for (const fiber of [plain, restarting]) {
        const exit = yield* Fiber.await(fiber)
        assert.isTrue(exit._tag === "Failure" && Cause.hasInterruptsOnly(exit.cause), "still an interruption")
      }
      assert.deepStrictEqual(lines, [])
      assert.strictEqual(started, 2, "an interrupted loop is not run again")
    }).pipe(provide)
  })

  it.effect("with restart: each death said once, the loop run again after its backoff; interrupted then, quiet", () => {
    const { lines, provide } = capture()
    return Effect.gen(function* () {
      let runs = 0
      const loop = Effect.suspend(() => {
        runs++
        return runs <= 2 ? Effect.die(new Error(`boom ${runs}`)) : Effect.never
      })
      const fiber = yield* Effect.forkChild(
        loop.pipe(background("the test reporter", consequence, { restart: { baseMs: 1_000, capMs: 10_000 } }))
      )
      yield* settle(
        "the first death said",
        Effect.sync(() => lines.length === 1)
      )
      assert.strictEqual(runs, 1, "not run again before its backoff")
      assert.strictEqual(lines[0]?.level, "Error")
      assert.match(
        lines[0]?.text ?? "",
        /^the test reporter stopped on a defect of the agent's: nothing is watched any more; restarting it in (\d+) ms$/
      )
      assert.include(lines[0]?.cause, "boom 1")
      // the first delay is the base's, jittered to 50-100 %: within 1 s it runs again, and dies again
      yield* advanceUntil("the second run and its death", 10, () => runs === 2 && lines.length === 2)
      const second = Number(/restarting it in (\d+) ms/.exec(lines[1]?.text ?? "")?.[1])
      assert.isAtLeast(second, 1_000, "the backoff doubles")
      assert.isAtMost(second, 2_000)
      yield* advanceUntil("the third run", 10, () => runs === 3)
      yield* Fiber.interrupt(fiber)
      assert.strictEqual(lines.length, 2, "each death said once, the interruption not at all")
    }).pipe(provide)
  })

  it.effect("the same defect every run: said at its 1st, 2nd, 4th and 8th death in a row, with the count", () => {
    const { lines, provide } = capture()
    return Effect.gen(function* () {
      let runs = 0
      const loop = Effect.suspend(() => {
        runs++
        return runs <= 9 ? Effect.die(new Error("the same bug")) : Effect.never
      })
      // each run far shorter than the cap: the deaths count on
      const fiber = yield* Effect.forkChild(
        loop.pipe(background("the test heartbeat", consequence, { restart: { baseMs: 10, capMs: 10_000 } }))
      )
      yield* advanceUntil("ten runs", 10, () => runs === 10)
      yield* Fiber.interrupt(fiber)
      assert.deepStrictEqual(
        lines.map((l) => [l.level, / \((\d+) times in a row\)$/.exec(l.text)?.[1] ?? "1"]),
        [
          ["Error", "1"],
          ["Error", "2"],
          ["Error", "4"],
          ["Error", "8"]
        ]
      )
    }).pipe(provide)
  })
})
