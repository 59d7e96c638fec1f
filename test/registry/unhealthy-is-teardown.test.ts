// Why the etcd record damps no engine `unhealthy` (layers/registry/registrationStep.ts buildRecord): the engine's
// Unhealthy is always a run being torn down, never a verdict the engine may recover from in place. The transition
// table's only ways in are a liveness loss (from Ready) and a startup timeout (from Starting); and the production
// supervisor, over a fake EngineHost on a TestClock, follows every one of them with Restarting, a spawned engine's run
// (stopped once) as a proxied server's (openai_compat: nothing spawned, the same loop), even when the engine answers
// its probe again at once.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Layer, Logger, Ref, Result, Stream } from "effect"
import { TestClock } from "effect/testing"
import { engineFor } from "../../src/layers/engine/backends/index.ts"
import { layerFromPlan } from "../../src/layers/engine/EngineProcess.ts"
import { EngineHost } from "../../src/services/engine/EngineHost.ts"
import { EngineProcess, type EngineState } from "../../src/services/engine/EngineProcess.ts"
import { Event, State, type SupervisorEvent, transition } from "../../src/services/engine/EngineState.ts"
import { testExit, testPlan } from "../../src/testing/EngineProcess.ts"
import { makeFakeHost } from "../support/fakeEngineHost.ts"
import { settle } from "../support/poll.ts"
import { testSettings } from "../support/supervisor.ts"

/** A state dir of the test's own (a spawned engine's supervisor holds one), removed after it. */
const tempDir = Effect.acquireRelease(
  Effect.sync(() => fs.mkdtempSync(path.join(os.tmpdir(), "cgn-teardown-"))),
  (dir) => Effect.sync(() => fs.rmSync(dir, { recursive: true, force: true }))
)

const states: ReadonlyArray<EngineState> = [
  State.Starting({ phase: "loading", since: 0, run: 0 }),
  State.Ready({ since: 0, run: 0 }),
  State.Unhealthy({ reason: "x", since: 0, run: 0 }),
  State.Restarting({ attempt: 1, nextAt: 1, lastExit: testExit(0) }),
  State.Stopping({ since: 0 }),
  State.Stopped({ lastExit: undefined })
]
const events: ReadonlyArray<SupervisorEvent> = [
  Event.Spawned({ run: 0, pid: 1, at: 0 }),
  Event.Phase({ phase: "p", at: 0 }),
  Event.ProbeOk({ at: 0 }),
  Event.LivenessLost({ reason: "x", at: 0 }),
  Event.LivenessLost({ reason: "x", at: 0, ending: { kind: "exited", status: "exit code 1" } }),
  Event.StartupTimedOut({ budgetMs: 1, at: 0 }),
  Event.Exited({ exit: testExit(0), attempt: 1, nextAt: 1 }),
  Event.RestartDue({ run: 1, phase: "spawning", at: 0 }),
  Event.StopRequested({ at: 0 }),
  Event.StopCompleted({ lastExit: undefined })
]

describe("the engine's Unhealthy is a run's teardown", () => {
  it("the transition table enters Unhealthy only on a liveness loss (or a run's end) from Ready and a startup timeout", () => {
    const into = states.flatMap((from) =>
      events.flatMap((event) => {
        const to = transition(from, event)
        return Result.isSuccess(to) && to.success._tag === "Unhealthy" && from._tag !== "Unhealthy"
          ? [`${from._tag} ${event._tag}`]
          : []
      })
    )
    assert.deepStrictEqual(into, ["Starting StartupTimedOut", "Ready LivenessLost", "Ready LivenessLost"])
  })

  it("openai_compat spawns nothing: it runs the supervisor's loop with plan.spawns false", () => {
    assert.isFalse(engineFor("openai_compat").capabilities.spawns)
  })

  const supervise = (spawns: boolean) =>
    Effect.gen(function* () {
      // a run's stop ends it (counted: a spawned run is stopped once); up when the test says (`up`)
      const { host, runs, up } = yield* makeFakeHost()
      const plan = spawns ? testPlan() : testPlan({ kind: "openai_compat", spawns: false })
      const settings = testSettings({ stateDir: "/nonexistent", startupTimeoutMs: 10_000 })
      const context = yield* Layer.build(
        layerFromPlan(plan, spawns ? { ...settings, stateDir: yield* tempDir } : settings).pipe(
          Layer.provide(Layer.succeed(EngineHost, host)),
          Layer.provide(Logger.layer([]))
        )
      )
      const engine = Context.get(context, EngineProcess)
      const seen: Array<EngineState> = []
      yield* engine.changes.pipe(
        Stream.runForEach((s) => Effect.sync(() => seen.push(s))),
        Effect.forkScoped
      )
      const now = (tag: EngineState["_tag"]) => Effect.sync(() => seen.at(-1)?._tag === tag)
      // the first probe answered "refused": spawned (the startup budget runs from the spawn) and probing
      yield* settle(
        "probing",
        Effect.sync(() => seen.some((s) => s._tag === "Starting" && s.phase === "waiting for port"))
      )
      // what followed the first Unhealthy, up to the next run's start
      const afterUnhealthy = () => {
        const i = seen.findIndex((s) => s._tag === "Unhealthy")
        return seen.slice(i, i + 3).map((s) => (s._tag === "Starting" ? `Starting(${s.run})` : s._tag))
      }
      const reason = () => {
        const u = seen.find((s) => s._tag === "Unhealthy")
        return u?._tag === "Unhealthy" ? u.reason : undefined
      }
      const stops = Effect.flatMap(Ref.get(runs), (xs) => Effect.forEach(xs, (x) => Ref.get(x.stops)))
      return { up, now, afterUnhealthy, reason, stops, settings }
    })

  describe.each([
    ["a spawned engine", true],
    ["openai_compat (nothing spawned)", false]
  ] as const)("%s", (_name, spawns) => {
    it.effect("a liveness loss ends the run, though the engine answers again at once", () =>
      Effect.gen(function* () {
        const { up, now, afterUnhealthy, reason, stops, settings } = yield* supervise(spawns)
        yield* Ref.set(up, true)
        yield* TestClock.adjust(settings.probeIntervalMs)
        yield* settle("Ready", now("Ready"))
        yield* Ref.set(up, false)
        yield* TestClock.adjust(settings.livenessFailures * settings.livenessIntervalMs)
        yield* settle("Unhealthy, then Restarting", now("Restarting"))
        yield* Ref.set(up, true)
        yield* TestClock.adjust(settings.backoff.initialMs)
        yield* settle("run 1 Ready", now("Ready"))
        assert.deepStrictEqual(afterUnhealthy(), ["Unhealthy", "Restarting", "Starting(1)"])
        assert.match(reason() ?? "", /^3 liveness probes failed in a row/)
        assert.deepStrictEqual(yield* stops, spawns ? [1, 0] : [])
      }).pipe(Effect.scoped)
    )

    it.effect("a startup timeout ends the run", () =>
      Effect.gen(function* () {
        const { now, afterUnhealthy, reason, stops, settings } = yield* supervise(spawns)
        yield* TestClock.adjust(settings.startupTimeoutMs)
        yield* settle("Restarting", now("Restarting"))
        yield* TestClock.adjust(settings.backoff.initialMs)
        yield* settle("run 1", now("Starting"))
        assert.deepStrictEqual(afterUnhealthy(), ["Unhealthy", "Restarting", "Starting(1)"])
        assert.strictEqual(reason(), `not ready within ${settings.startupTimeoutMs} ms`)
        assert.deepStrictEqual((yield* stops).slice(0, 1), spawns ? [1] : [])
      }).pipe(Effect.scoped)
    )
  })
})
