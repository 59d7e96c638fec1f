// An interruption a background loop (src/layers/observability/backgroundFiber.ts) meets in its own work while its
// fiber is not being interrupted (an Effect.interrupt inside, an inner fiber it joined that something else
// interrupted) is a death like a defect: said, and with `restart` run again. Its scope closing is not, even where the
// scope ends a fiber the loop joins before the loop itself. On a TestClock.
import { assert, describe, it } from "@effect/vitest"
import { Cause, Effect, Exit, Fiber, Scope } from "effect"
import { TestClock } from "effect/testing"
import { background } from "../../src/layers/observability/backgroundFiber.ts"
import { captureMessages } from "../support/logCapture.ts"
import { settle } from "../support/poll.ts"

const capture = captureMessages

const consequence = "nothing is watched any more"
const fromWithin = "on an interruption from within, not its scope's end (a defect of the agent's)"

describe("background and an interruption from within", () => {
  it.effect("an Effect.interrupt in the loop's own work ends it said, as a defect, and the fiber ends", () => {
    const { lines, provide } = capture()
    return Effect.gen(function* () {
      const exit = yield* Effect.exit(Effect.interrupt.pipe(background("the test watcher", consequence)))
      assert.isTrue(Exit.isSuccess(exit), "ended as a death is (said), not as an interruption")
      assert.deepStrictEqual(lines, [
        `the test watcher stopped ${fromWithin}: ${consequence}; not restarted (restart the agent)`
      ])
    }).pipe(provide)
  })

  it.effect("with restart: said and run again after its backoff, then ended quietly by its own interruption", () => {
    const { lines, provide } = capture()
    return Effect.gen(function* () {
      let runs = 0
      const loop = Effect.suspend(() => {
        runs++
        return runs === 1 ? Effect.interrupt : Effect.never
      })
      const fiber = yield* Effect.forkChild(
        loop.pipe(background("the test reader", consequence, { restart: { baseMs: 100, capMs: 1_000 } }))
      )
      yield* settle(
        "the interruption said",
        Effect.sync(() => lines.length === 1)
      )
      assert.strictEqual(
        lines[0]?.replace(/ \d+ ms$/, " N ms"),
        `the test reader stopped ${fromWithin}: ${consequence}; restarting it in N ms`
      )
      yield* settle(
        "the second run",
        Effect.andThen(
          TestClock.adjust(10),
          Effect.sync(() => runs === 2)
        )
      )
      yield* Fiber.interrupt(fiber)
      assert.strictEqual(lines.length, 1, "its own interruption said nowhere")
    }).pipe(provide)
  })

  it.effect("an inner fiber it joined, interrupted by another fiber: a death, restarted", () => {
    const { lines, provide } = capture()
    return Effect.gen(function* () {
      const inner = yield* Effect.forkChild(Effect.never)
      let runs = 0
      const loop = Effect.suspend(() => {
        runs++
        return runs === 1 ? Fiber.join(inner) : Effect.never
      })
      const fiber = yield* Effect.forkChild(
        loop.pipe(background("the test follower", consequence, { restart: { baseMs: 100, capMs: 1_000 } }))
      )
      yield* settle(
        "the loop joining",
        Effect.sync(() => runs === 1)
      )
      yield* Fiber.interrupt(inner)
      yield* settle(
        "the second run",
        Effect.andThen(
          TestClock.adjust(10),
          Effect.sync(() => runs === 2)
        )
      )
      yield* Fiber.interrupt(fiber)
      assert.strictEqual(lines.length, 1, JSON.stringify(lines))
      assert.include(lines[0], `the test follower stopped ${fromWithin}`)
    }).pipe(provide)
  })

  it.effect(
    "its scope closing while it joins a sibling forked after it (ended first): said nowhere, not run again",
    () => {
      const { lines, provide } = capture()
      return Effect.gen(function* () {
        for (const options of [{}, { restart: { baseMs: 100, capMs: 1_000 } }]) {
          const scope = yield* Scope.make()
          let runs = 0
          let sibling: Fiber.Fiber<never> | undefined
          const loop = Effect.suspend(() => {
            runs++
            return Effect.flatMap(
              Effect.sync(() => sibling),
              (f) => (f === undefined ? Effect.die(new Error("no sibling yet")) : Fiber.join(f))
            )
          })
          const fiber = yield* Effect.forkIn(loop.pipe(background("the test joiner", consequence, options)), scope)
          // forked after the loop: the scope, ending its fibers latest first, interrupts it before the loop
          sibling = yield* Effect.forkIn(Effect.never, scope)
          yield* settle(
            "the loop joining",
            Effect.sync(() => runs === 1)
          )
          yield* Scope.close(scope, Exit.void)
          const exit = yield* Fiber.await(fiber)
          assert.isTrue(exit._tag === "Failure" && Cause.hasInterruptsOnly(exit.cause), "ended as an interruption")
          yield* TestClock.adjust(1_000)
          assert.strictEqual(runs, 1, "not run again")
        }
        assert.deepStrictEqual(lines, [])
      }).pipe(provide)
    }
  )
  it.effect(
    "its scope closing with an asynchronous finalizer between it and the sibling it joins: said nowhere",
    () => {
      // a review: the yield alone let the sibling's interruption be read as the loop's own death when a finalizer that
      // waits ran between the two (Effect closes a scope's finalizers one after another)
      const { lines, provide } = capture()
      return Effect.gen(function* () {
        const scope = yield* Scope.make()
        let runs = 0
        let sibling: Fiber.Fiber<never> | undefined
        const loop = Effect.suspend(() => {
          runs++
          // forked after the loop, the sibling exists by the time the loop runs
          return sibling === undefined ? Effect.die(new Error("no sibling yet")) : Fiber.join(sibling)
        })
        const fiber = yield* Effect.gen(function* () {
          const f = yield* Effect.forkScoped(
            loop.pipe(background("the test joiner", consequence, { restart: { baseMs: 100, capMs: 1_000 } }))
          )
          yield* Effect.addFinalizer(() => Effect.promise(() => new Promise((r) => setTimeout(r, 5))))
          sibling = yield* Effect.forkScoped(Effect.never)
          return f
        }).pipe(Effect.provideService(Scope.Scope, scope))
        yield* settle(
          "the loop joining",
          Effect.sync(() => runs === 1)
        )
        yield* Scope.close(scope, Exit.void)
        const exit = yield* Fiber.await(fiber)
        assert.isTrue(exit._tag === "Failure" && Cause.hasInterruptsOnly(exit.cause), "ended as an interruption")
        yield* TestClock.adjust(1_000)
        assert.strictEqual(runs, 1, "not run again")
        assert.deepStrictEqual(lines, [])
      }).pipe(provide)
    }
  )
})
