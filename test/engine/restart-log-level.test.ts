// The level of a run's end line, decided from how the run ended (ExitRecord.endedBy), not from its words: a restart an
// operator asked for (POST /engine/restart) is an intended action, so its end is info (the engine's last lines still
// on it); it was a warning, beside the request's own warning, teaching operators to skip warnings. A fault's end (the
// stall restart, the engine exiting by itself) stays a warning. The production supervisor on a TestClock with a fake
// EngineHost (nothing spawned), as test/engine/supervisor-clock.test.ts drives it.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, Ref } from "effect"
import { TestClock } from "effect/testing"
import { testPlan } from "../../src/testing/EngineProcess.ts"
import { makeFakeHost } from "../support/fakeEngineHost.ts"
import { settle } from "../support/poll.ts"
import { freePort } from "../support/ports.ts"
import { superviseFake, testSettings } from "../support/supervisor.ts"

describe("a run's end line: its level from how it ended", () => {
  it.effect("an operator's restart: info, with the last lines; the stall restart and an exit: warn", () =>
    Effect.gen(function* () {
      const stateDir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-level-"))
      yield* Effect.addFinalizer(() => Effect.sync(() => fs.rmSync(stateDir, { recursive: true, force: true })))
      const port = yield* Effect.promise(freePort)
      const plan = testPlan({ port, probe: { kind: "http", url: `http://127.0.0.1:${port}/health` } })
      // runs come up when the test says (`up`) and end on their stop (exit code 0) or when the test ends them; each
      // keeps a last line for the end line to carry
      const fake = yield* makeFakeHost({
        stopExit: { code: 0, signal: null },
        lastLines: (run) => [`[stderr] run ${run} last words`]
      })
      const { engine, states, lines } = yield* superviseFake(
        plan,
        testSettings({ stateDir, backoff: { ...testSettings().backoff, initialMs: 1_000 } }),
        fake.host
      )
      yield* Ref.set(fake.up, true)
      const readyRun = (run: number) =>
        Effect.gen(function* () {
          yield* settle(
            `run ${run} Ready`,
            Effect.gen(function* () {
              yield* TestClock.adjust(500)
              const last = states.at(-1)
              return last?._tag === "Ready" && last.run === run
            })
          )
        })
      const endLine = (run: number) =>
        Effect.gen(function* () {
          yield* settle(
            `run ${run}'s end line`,
            Effect.sync(() => lines.some((l) => l.text.startsWith(`run ${run} `)))
          )
          return lines.find((l) => l.text.startsWith(`run ${run} `))!
        })

      yield* readyRun(0)
      assert.strictEqual(
        yield* engine.restart("admin", "asked for over the admin API (POST /engine/restart)"),
        "restarting"
      )
      const asked = yield* endLine(0)
      assert.strictEqual(asked.level, "Info", asked.text)
      assert.match(asked.text, /^run 0 \(pid \d+\) ended: restarted: asked for over the admin API/)
      assert.include(asked.text, "last lines:\n[stderr] run 0 last words", "the engine's last lines are kept")

      yield* readyRun(1)
      assert.strictEqual(yield* engine.restart("stall", "engine stalled: no progress"), "restarting")
      const stalled = yield* endLine(1)
      assert.strictEqual(stalled.level, "Warn", stalled.text)

      yield* readyRun(2)
      const exited = (yield* Ref.get(fake.runs))[2]!.exited
      yield* Deferred.succeed(exited, { code: 1, signal: null, problem: undefined })
      const crashed = yield* endLine(2)
      assert.strictEqual(crashed.level, "Warn", crashed.text)
      assert.match(crashed.text, /^run 2 \(pid \d+\) ended: exited, exit code 1/)
      yield* engine.stop
    })
  )

  it.effect("an engine that exits while the agent stops it: its end is the exit (warn), not a stop", () =>
    Effect.gen(function* () {
      const stateDir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-level-"))
      yield* Effect.addFinalizer(() => Effect.sync(() => fs.rmSync(stateDir, { recursive: true, force: true })))
      const port = yield* Effect.promise(freePort)
      const plan = testPlan({ port, probe: { kind: "http", url: `http://127.0.0.1:${port}/health` } })
      const fake = yield* makeFakeHost()
      const { engine, states, lines } = yield* superviseFake(plan, testSettings({ stateDir }), fake.host)
      yield* Ref.set(fake.up, true)
      yield* settle(
        "run 0 Ready",
        Effect.gen(function* () {
          yield* TestClock.adjust(500)
          return states.at(-1)?._tag === "Ready"
        })
      )
      // the engine exits by itself (a drain's engine crashing); the rest of its group is being stopped (held) when
      // the agent's own stop comes
      const hold = yield* Deferred.make<void>()
      yield* Ref.set(fake.holdStops, hold)
      fake.seen.observe = () => states.at(-1)?._tag
      const run0 = (yield* Ref.get(fake.runs))[0]!
      yield* Deferred.succeed(run0.exited, { code: 1, signal: null, problem: undefined })
      yield* settle(
        "the group's stop under way",
        Effect.sync(() => run0.stateAtStop() !== undefined)
      )
      const stopping = yield* Effect.forkChild(engine.stop)
      yield* settle(
        "Stopping",
        Effect.sync(() => states.at(-1)?._tag === "Stopping")
      )
      yield* Deferred.succeed(hold, undefined)
      yield* Fiber.join(stopping)
      const stopped = states.at(-1)
      if (stopped?._tag !== "Stopped") return assert.fail(`expected Stopped, got ${stopped?._tag}`)
      assert.strictEqual(stopped.lastExit?.reason, "exited")
      assert.strictEqual(stopped.lastExit?.code, 1)
      const end = lines.find((l) => l.text.startsWith("run 0 "))
      assert.strictEqual(end?.level, "Warn", end?.text)
      assert.match(
        end?.text ?? "",
        /^run 0 \(pid \d+\) ended: exited, exit code 1, .*; not restarted: its supervision is ending \(the agent stopping, or a defect said apart\)$/
      )
    })
  )
})
