// The supervisor on a TestClock: the production EngineProcess with a fake EngineHost (the one seam: runs and
// probes are scripted, nothing is spawned), driven start -> Ready -> crash -> backoff -> restart -> Ready -> stop.
// Every wait in the supervisor is Effect.sleep on the Clock, so time moves only when the test adjusts it: the
// restart happens exactly when the backoff has elapsed, never a millisecond before. The pid file and the start-up
// reclaim are the real ones, in a temporary state dir.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Clock, Context, Deferred, Effect, Layer, Logger, Ref, Stream } from "effect"
import { TestClock } from "effect/testing"
import { layerFromPlan } from "../../src/layers/engine/EngineProcess.ts"
import { pidFilePath, readPidFile } from "../../src/layers/engine/pidFile.ts"
import type { SupervisorSettings } from "../../src/layers/engine/supervisorSettings.ts"
import { EngineHost } from "../../src/services/engine/EngineHost.ts"
import { EngineProcess, type EngineState } from "../../src/services/engine/EngineProcess.ts"
import { GpuGate } from "../../src/services/engine/GpuGate.ts"
import { runEnding } from "../../src/services/grpc/EngineCut.ts"
import { Metrics } from "../../src/services/observability/Metrics.ts"
import { testPlan } from "../../src/testing/EngineProcess.ts"
import * as MetricsTest from "../../src/testing/Metrics.ts"
import { type FakeHostOptions, fakePid, makeFakeHost } from "../support/fakeEngineHost.ts"
import { settle } from "../support/poll.ts"
import { freePort } from "../support/ports.ts"

/** Lets everything runnable run (a fixed number of rounds), for asserting that nothing happened. */
const quiesce = Effect.gen(function* () {
  for (let i = 0; i < 50; i++) yield* Effect.promise(() => new Promise((resolve) => setImmediate(resolve)))
})

const settings = (stateDir: string): SupervisorSettings => ({
  startupTimeoutMs: 60_000,
  stopGraceMs: 500,
  livenessIntervalMs: 1_000,
  livenessFailures: 3,
  backoff: { initialMs: 2_000, maxMs: 30_000, stableAfterMs: 600_000, crashLoopAfter: 3 },
  stateDir,
  verifyListener: true,
  probeIntervalMs: 500,
  progressEveryMs: 5_000,
  linesKept: 50
})

const label = (s: EngineState): string =>
  s._tag === "Starting" ? `Starting(${s.run}, ${s.phase})` : s._tag === "Ready" ? `Ready(${s.run})` : s._tag

/** The production supervisor over a fake host in a temporary state dir, with every state it publishes recorded. */
const bootWith = (host: Pick<FakeHostOptions, "stopSurvives"> = {}) =>
  Effect.gen(function* () {
    const stateDir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-clock-"))
    yield* Effect.addFinalizer(() => Effect.sync(() => fs.rmSync(stateDir, { recursive: true, force: true })))
    const port = yield* Effect.promise(freePort)
    const plan = testPlan({ port, probe: { kind: "http", url: `http://127.0.0.1:${port}/health` } })
    // the test reports each run's pid (the guard's report), to see the supervisor before and after it
    const fake = yield* makeFakeHost({ pidAtSpawn: false, lastLines: (run) => [`[stderr] run ${run} output`], ...host })
    // the text of every line the supervisor logs (its message, without the fields), and each line's fields
    const logs: Array<string> = []
    const fieldsOf: Array<Record<string, unknown>> = []
    const capture = Logger.make(({ message }) => {
      const [first, fields] = [message].flat()
      if (typeof first !== "string") return
      logs.push(first)
      fieldsOf.push(typeof fields === "object" && fields !== null ? (fields as Record<string, unknown>) : {})
    })
    const context = yield* Layer.build(
      layerFromPlan(plan, settings(stateDir)).pipe(
        Layer.provideMerge(MetricsTest.layerTest),
        Layer.provide(Layer.succeed(EngineHost, fake.host)),
        Layer.provide(Logger.layer([capture]))
      )
    )
    const engine = Context.get(context, EngineProcess)
    const metrics = Context.get(context, Metrics)
    const states: Array<EngineState> = []
    yield* engine.changes.pipe(
      Stream.runForEach((s) => Effect.sync(() => states.push(s))),
      Effect.forkScoped
    )
    const last = () => states[states.length - 1]
    fake.seen.observe = () => last()?._tag
    const runAt = (i: number) => Effect.map(Ref.get(fake.runs), (xs) => xs[i])
    const stateIs = (pred: (s: EngineState) => boolean) => Effect.sync(() => last() !== undefined && pred(last()!))
    return { stateDir, fake, engine, metrics, states, last, runAt, stateIs, logs, fieldsOf }
  })
const boot = bootWith()

describe("EngineProcess on a TestClock", () => {
  it.effect("start -> Ready -> crash -> backoff -> restart -> Ready -> stop", () =>
    Effect.gen(function* () {
      const { stateDir, fake, engine, states, last, runAt, stateIs } = yield* boot

      // run 0: spawned at t=0; the guard reports its pid; the engine loads
      yield* settle(
        "run 0 spawned",
        Effect.map(runAt(0), (r) => r !== undefined)
      )
      const run0 = (yield* runAt(0))!
      assert.strictEqual(run0.spawnedAt, 0)
      yield* Deferred.succeed(run0.pid, fakePid(0))
      yield* settle(
        "probing run 0",
        stateIs((s) => s._tag === "Starting" && s.phase === "waiting for port")
      )
      assert.strictEqual((yield* readPidFile(pidFilePath(stateDir)))?.pgid, fakePid(0), "pid file while running")
      yield* Ref.set(fake.up, true)
      yield* TestClock.adjust(500)
      yield* settle(
        "run 0 Ready",
        stateIs((s) => s._tag === "Ready")
      )
      assert.strictEqual(yield* engine.pid, fakePid(0))

      // the engine crashes at t=500: Restarting with the first backoff (2 s) and the run's exit
      yield* Ref.set(fake.up, false)
      yield* Deferred.succeed(run0.exited, { code: 1, signal: null, problem: undefined })
      yield* settle(
        "Restarting",
        stateIs((s) => s._tag === "Restarting")
      )
      const restarting = last()
      if (restarting?._tag !== "Restarting") return assert.fail("expected Restarting")
      assert.deepStrictEqual(
        { attempt: restarting.attempt, nextAt: restarting.nextAt, code: restarting.lastExit.code },
        { attempt: 1, nextAt: 2_500, code: 1 }
      )
      assert.strictEqual(restarting.lastExit.runtimeMs, 500)
      // a call cut while the run was ending and one cut once it ended are told the same (services/grpc/EngineCut.ts)
      const ending = states.find((s) => s._tag === "Unhealthy")
      assert.deepStrictEqual(ending && runEnding(ending, []), { by: "exit", why: "the engine exited (exit code 1)" })
      assert.deepStrictEqual(runEnding(restarting, []), ending && runEnding(ending, []))
      assert.deepStrictEqual(restarting.lastExit.lastLines, ["[stderr] run 0 output"])
      assert.strictEqual(yield* Ref.get(run0.stops), 1, "the crashed run was torn down once")
      assert.strictEqual(run0.stateAtStop(), "Unhealthy", "not Ready when the crashed run's teardown began")
      assert.isFalse(fs.existsSync(pidFilePath(stateDir)), "pid file removed with the run")

      // 1 ms short of the backoff nothing happens; at the backoff run 1 is spawned
      yield* TestClock.adjust(1_999)
      yield* quiesce
      assert.strictEqual((yield* Ref.get(fake.runs)).length, 1, "no restart before the backoff elapsed")
      assert.strictEqual(last()?._tag, "Restarting")
      yield* TestClock.adjust(1)
      yield* settle(
        "run 1 spawned",
        Effect.map(runAt(1), (r) => r !== undefined)
      )
      const run1 = (yield* runAt(1))!
      assert.strictEqual(run1.spawnedAt, 2_500)
      assert.strictEqual(yield* engine.restarts, 1)
      yield* Deferred.succeed(run1.pid, fakePid(1))
      yield* settle(
        "probing run 1",
        stateIs((s) => s._tag === "Starting" && s.phase === "waiting for port")
      )
      yield* Ref.set(fake.up, true)
      yield* TestClock.adjust(500)
      yield* settle(
        "run 1 Ready",
        stateIs((s) => s._tag === "Ready" && s.run === 1)
      )

      // stop: the run is torn down through its release and recorded as stopped; the pid file goes with it
      yield* engine.stop
      const stopped = last()
      if (stopped?._tag !== "Stopped") return assert.fail(`expected Stopped, got ${stopped?._tag}`)
      assert.strictEqual(stopped.lastExit?.run, 1)
      assert.strictEqual(stopped.lastExit?.reason, "stopped")
      assert.strictEqual(stopped.lastExit?.signal, "SIGTERM")
      assert.strictEqual(yield* Ref.get(run1.stops), 1)
      assert.isFalse(fs.existsSync(pidFilePath(stateDir)), "pid file removed after stop")
      assert.strictEqual(yield* engine.pid, undefined)
      assert.deepStrictEqual(states.map(label), [
        "Starting(0, spawning)",
        "Starting(0, loading)",
        "Starting(0, waiting for port)",
        "Ready(0)",
        // not Ready from the moment the engine exited, while its group was still being stopped
        "Unhealthy",
        "Restarting",
        "Starting(1, spawning)",
        "Starting(1, loading)",
        "Starting(1, waiting for port)",
        "Ready(1)",
        "Stopping",
        "Stopped"
      ])
      assert.deepStrictEqual(
        (yield* engine.exits).map((x) => [x.run, x.reason]),
        [
          [1, "stopped"],
          [0, "exited"]
        ]
      )
    })
  )

  it.effect(
    "restart(): refused until Ready, then ends the Ready run with the reason, once; the next run follows the backoff",
    () =>
      Effect.gen(function* () {
        const { fake, engine, metrics, states, last, runAt, stateIs } = yield* boot
        yield* settle(
          "run 0 spawned",
          Effect.map(runAt(0), (r) => r !== undefined)
        )
        const run0 = (yield* runAt(0))!
        yield* Deferred.succeed(run0.pid, fakePid(0))
        // starting: the run has its startup budget; a restart now would only start it again
        assert.strictEqual(yield* engine.restart("stall", "wedged"), "not-ready")
        yield* Ref.set(fake.up, true)
        yield* TestClock.adjust(500)
        yield* settle(
          "run 0 Ready",
          stateIs((s) => s._tag === "Ready")
        )
        const hold = yield* Deferred.make<void>()
        yield* Ref.set(fake.holdStops, hold)
        // released first on a failure too: the layer's release would wait for the held teardown
        yield* Effect.addFinalizer(() => Deferred.succeed(hold, undefined))
        assert.strictEqual(yield* engine.restart("stall", "engine stalled"), "restarting")
        yield* settle(
          "Unhealthy while the run is torn down",
          stateIs((s) => s._tag === "Unhealthy")
        )
        assert.strictEqual(yield* engine.restart("admin", "again"), "not-ready", "a request while the run ends")
        yield* Ref.set(fake.holdStops, undefined)
        yield* Deferred.succeed(hold, undefined)
        yield* settle(
          "Restarting",
          stateIs((s) => s._tag === "Restarting")
        )
        assert.strictEqual(yield* Ref.get(run0.stops), 1, "the run was stopped as any run is")
        assert.strictEqual(run0.stateAtStop(), "Unhealthy", "not Ready while its teardown ran")
        const restarting = last()
        if (restarting?._tag !== "Restarting") return assert.fail("expected Restarting")
        assert.strictEqual(restarting.lastExit.reason, "restarted: engine stalled")
        assert.strictEqual(restarting.nextAt, 2_500, "the first backoff after a run Ready for 0.5 s")
        // a stall restart never ends a backoff (an operator's does: the crash-loop test below)
        assert.strictEqual(yield* engine.restart("stall", "in the backoff"), "not-ready")
        yield* TestClock.adjust(2_000)
        yield* settle(
          "run 1 spawned",
          Effect.map(runAt(1), (r) => r !== undefined)
        )
        yield* Deferred.succeed((yield* runAt(1))!.pid, fakePid(1))
        yield* TestClock.adjust(500)
        yield* settle(
          "run 1 Ready",
          stateIs((s) => s._tag === "Ready" && s.run === 1)
        )
        // long past any backoff: nothing left of the refused requests
        yield* TestClock.adjust(60_000)
        yield* quiesce
        assert.strictEqual((yield* Ref.get(fake.runs)).length, 2, "one restart for the requests")
        assert.strictEqual(yield* engine.restarts, 1)
        const unhealthy = states.find((s) => s._tag === "Unhealthy")
        assert.deepStrictEqual(
          unhealthy?._tag === "Unhealthy" ? [unhealthy.reason, unhealthy.ending] : undefined,
          ["restart requested: engine stalled", { kind: "requested", source: "stall", reason: "engine stalled" }],
          "a run being torn down for certain, not a probe's verdict"
        )
        const requested = yield* Effect.promise(() => metrics.engineRestartRequests.get())
        assert.deepStrictEqual(
          requested.values.map((v) => [v.labels.source, v.value]),
          [
            ["stall", 1],
            ["admin", 0]
          ],
          "counted once, by the request that ended the run, from 0"
        )
      })
  )

  it.effect("an operator's restarts never count toward the crash loop; the stall restarts of a young run do", () =>
    Effect.gen(function* () {
      const { fake, engine, last, runAt, stateIs, logs } = yield* boot
      yield* Ref.set(fake.up, true)
      const readyRun = (i: number) =>
        Effect.gen(function* () {
          yield* settle(
            `run ${i} spawned`,
            Effect.map(runAt(i), (r) => r !== undefined)
          )
          yield* Deferred.succeed((yield* runAt(i))!.pid, fakePid(i))
          yield* TestClock.adjust(500)
          yield* settle(
            `run ${i} Ready`,
            stateIs((s) => s._tag === "Ready" && s.run === i)
          )
        })
      /** Ends the Ready run on a request a minute after Ready; the Restarting state that follows (then waited out). */
      const endBy = (source: "stall" | "admin") =>
        Effect.gen(function* () {
          yield* TestClock.adjust(60_000)
          assert.strictEqual(yield* engine.restart(source, `by ${source}`), "restarting")
          yield* settle(
            "Restarting",
            stateIs((s) => s._tag === "Restarting")
          )
          const r = last()
          if (r?._tag !== "Restarting") return assert.fail("expected Restarting")
          yield* TestClock.adjust(r.nextAt - (yield* Clock.currentTimeMillis))
          return { attempt: r.attempt, failing: r.failing }
        })
      const seen: Array<{ attempt: number; failing: string | undefined }> = []
      for (let i = 0; i < 3; i++) {
        yield* readyRun(i)
        seen.push(yield* endBy("admin"))
      }
      assert.deepStrictEqual(seen, [
        { attempt: 1, failing: undefined },
        { attempt: 1, failing: undefined },
        { attempt: 1, failing: undefined }
      ])
      // the log says why the Ready run ends (not a bare "Ready -> Unhealthy", read as a fault), and a new start-up
      // phase names the phases (not "Starting -> Starting")
      const changes = logs.filter((l) => l.startsWith("engine "))
      assert.include(changes, "engine Ready -> Unhealthy: restart requested: by admin")
      assert.include(changes, "engine Starting: phase spawning -> loading")
      assert.notInclude(changes, "engine Ready -> Unhealthy")
      assert.isFalse(
        changes.some((l) => l.startsWith("engine Starting -> Starting")),
        changes.join("\n")
      )
      assert.include(changes, "engine Starting -> Ready")
      seen.length = 0
      for (let i = 3; i < 6; i++) {
        yield* readyRun(i)
        seen.push(yield* endBy("stall"))
      }
      assert.deepStrictEqual(
        seen.map((x) => x.attempt),
        [2, 3, 4]
      )
      // three stall restarts after the admin ones: three runs that failed, not four
      assert.deepStrictEqual(
        seen.map((x) => x.failing !== undefined),
        [false, false, true]
      )
      assert.match(seen[2]?.failing ?? "", /^engine failing: 3 runs in a row ended before being stable/)
    })
  )
  it.effect(
    "an operator's restart in a crash loop's backoff starts the next run now, the backoff's count kept; its end is logged once",
    () =>
      Effect.gen(function* () {
        const { fake, engine, metrics, states, last, runAt, stateIs, logs, fieldsOf } = yield* boot
        /** Runs run `i` until it exits at start (code 1, never Ready): the Restarting state that follows. */
        const failAtStart = (i: number) =>
          Effect.gen(function* () {
            yield* settle(
              `run ${i} spawned`,
              Effect.map(runAt(i), (r) => r !== undefined)
            )
            const r = (yield* runAt(i))!
            yield* Deferred.succeed(r.pid, fakePid(i))
            yield* settle(
              `probing run ${i}`,
              stateIs((s) => s._tag === "Starting" && s.run === i && s.phase === "waiting for port")
            )
            yield* Deferred.succeed(r.exited, { code: 1, signal: null, problem: undefined })
            yield* settle(
              `run ${i} Restarting`,
              stateIs((s) => s._tag === "Restarting" && s.lastExit.run === i)
            )
            const restarting = last()
            if (restarting?._tag !== "Restarting") return assert.fail("expected Restarting")
            return restarting
          })
        const seen: Array<{ attempt: number; wait: number; failing: boolean }> = []
        for (let i = 0; i < 3; i++) {
          const r = yield* failAtStart(i)
          seen.push({ attempt: r.attempt, wait: r.nextAt - (yield* Clock.currentTimeMillis), failing: !!r.failing })
          // only an operator's request ends the wait
          assert.strictEqual(yield* engine.restart("stall", "wedged"), "not-ready")
          assert.strictEqual(yield* engine.restart("admin", "the model file is in place"), "backoff-ended")
          const at = yield* Clock.currentTimeMillis
          // the next run starts at once: the clock never moves
          yield* settle(
            `run ${i + 1} spawned at once`,
            Effect.map(runAt(i + 1), (x) => x !== undefined)
          )
          assert.strictEqual((yield* runAt(i + 1))!.spawnedAt, at)
        }
        // the backoff's count went on: a manual retry of a still-broken engine keeps backing off and stays failing
        assert.deepStrictEqual(seen, [
          { attempt: 1, wait: 2_000, failing: false },
          { attempt: 2, wait: 4_000, failing: false },
          { attempt: 3, wait: 8_000, failing: true }
        ])
        assert.include(logs, "restart backoff ended 8000 ms early: the model file is in place; run 3 starts now")
        // run 3 (the fix in place) becomes Ready: one line ends the failing state, and says when the backoff starts over
        yield* Deferred.succeed((yield* runAt(3))!.pid, fakePid(3))
        yield* Ref.set(fake.up, true)
        yield* TestClock.adjust(500)
        yield* settle(
          "run 3 Ready",
          stateIs((s) => s._tag === "Ready" && s.run === 3)
        )
        yield* quiesce
        assert.deepStrictEqual(
          logs.filter((l) => l.includes("ready after")),
          [
            "engine run 3 ready after 3 failed runs in a row; no longer failing; the restart backoff starts over once it has been ready 10m (engine.restart_stable_after)"
          ]
        )
        // `failing` is still the state's while run 3 starts (/readyz, /status), but not repeated on its log lines
        assert.isTrue(states.some((s) => s._tag === "Starting" && s.run === 3 && s.failing !== undefined))
        const lines = logs.map((l, i) => ({ l, fields: fieldsOf[i]! }))
        const starting = lines.filter(
          ({ l }) => l.startsWith("engine Restarting -> Starting") || l.startsWith("engine Starting:")
        )
        assert.isAtLeast(starting.length, 6)
        assert.isTrue(
          starting.every(({ fields }) => !("failing" in fields)),
          "no Starting line carries failing"
        )
        // where it is the news, the change to Restarting after the third failed run, it is
        assert.match(
          String(lines.filter(({ l }) => l.endsWith("-> Restarting")).at(-1)?.fields.failing),
          /^engine failing: 3 runs in a row/
        )
        // no Ready run was ended: not a restart request; the restarts are counted as any
        const requested = yield* Effect.promise(() => metrics.engineRestartRequests.get())
        assert.deepStrictEqual(
          requested.values.map((v) => [v.labels.source, v.value]),
          [
            ["stall", 0],
            ["admin", 0]
          ]
        )
        assert.strictEqual(yield* engine.restarts, 3)
        // a second Ready (after a stable end) says nothing more
        assert.strictEqual(yield* engine.restart("admin", "again"), "restarting")
        yield* settle(
          "Restarting after the operator's restart",
          stateIs((s) => s._tag === "Restarting" && s.lastExit.run === 3)
        )
        assert.strictEqual(yield* engine.restart("admin", "now"), "backoff-ended")
        yield* settle(
          "run 4 spawned",
          Effect.map(runAt(4), (x) => x !== undefined)
        )
        yield* Deferred.succeed((yield* runAt(4))!.pid, fakePid(4))
        yield* TestClock.adjust(500)
        yield* settle(
          "run 4 Ready",
          stateIs((s) => s._tag === "Ready" && s.run === 4)
        )
        yield* quiesce
        assert.isFalse(logs.some((l) => l.startsWith("engine run 4 ready after")))
      })
  )
})

describe("EngineProcess on a TestClock, a run whose group survives SIGKILL", () => {
  it.effect(
    "the next run waits for the group to exit, in its phase and the log, not spawned on its port and GPUs",
    () =>
      Effect.gen(function* () {
        const { fake, states, last, runAt, stateIs, logs } = yield* bootWith({ stopSurvives: (run) => run === 0 })
        yield* settle(
          "run 0 spawned",
          Effect.map(runAt(0), (r) => r !== undefined)
        )
        const run0 = (yield* runAt(0))!
        yield* Deferred.succeed(run0.pid, fakePid(0))
        yield* Ref.set(fake.up, true)
        yield* TestClock.adjust(500)
        yield* settle(
          "run 0 Ready",
          stateIs((s) => s._tag === "Ready")
        )
        // the engine's leader dies; a process of its group, stuck in the kernel, outlives the teardown's SIGKILL
        yield* Deferred.succeed(run0.exited, { code: null, signal: "SIGSEGV", problem: undefined })
        yield* settle(
          "Restarting",
          stateIs((s) => s._tag === "Restarting")
        )
        yield* TestClock.adjust(2_000)
        const waiting = `waiting for run 0's engine group ${fakePid(0)} to exit (it survived SIGKILL)`
        yield* settle(
          "run 1 waits for run 0's group",
          stateIs((s) => s._tag === "Starting" && s.phase === waiting)
        )
        assert.include(logs.join("\n"), `engine group ${fakePid(0)} of run 0 survived SIGKILL and is still alive`)
        // a minute on, still waiting, said again; nothing spawned
        yield* TestClock.adjust(60_000)
        yield* quiesce
        assert.strictEqual((yield* Ref.get(fake.runs)).length, 1, "no run spawned while the group lives")
        assert.strictEqual(logs.filter((l) => l.includes("survived SIGKILL and is still alive")).length, 2)
        // the group goes: run 1 is spawned within the poll
        yield* Ref.set(run0.alive, false)
        yield* TestClock.adjust(1_000)
        yield* settle(
          "run 1 spawned",
          Effect.map(runAt(1), (r) => r !== undefined)
        )
        assert.include(logs.join("\n"), `engine group ${fakePid(0)} of run 0 is gone; starting the next run`)
        assert.strictEqual(last()?._tag, "Starting")
        assert.deepStrictEqual(states.map(label).slice(-4), [
          "Restarting",
          "Starting(1, spawning)",
          `Starting(1, ${waiting})`,
          "Starting(1, spawning)"
        ])
      })
  )
})

describe("EngineProcess on a TestClock, with a GPU gate", () => {
  it.effect("each run's process group is told to the gate at its spawn (a leftover of it holds the next start)", () =>
    Effect.gen(function* () {
      const told: Array<number> = []
      const gate = GpuGate.of({
        awaitFree: Effect.void,
        runEnv: Effect.succeed({}),
        spawned: (pgid) => Effect.sync(() => void told.push(pgid)),
        status: Effect.succeed({ gpus: [0], waiting: undefined, fault: undefined }),
        problems: Stream.empty
      })
      // the supervisor takes the gate from where it is built, as the daemon gives it one for a CUDA engine
      const { runAt, stateIs } = yield* Effect.provideService(boot, GpuGate, gate)
      yield* settle(
        "run 0 spawned",
        Effect.map(runAt(0), (r) => r !== undefined)
      )
      yield* Deferred.succeed((yield* runAt(0))!.pid, fakePid(0))
      // probing comes after the spawn is recorded (pid file, gate)
      yield* settle(
        "probing run 0",
        stateIs((s) => s._tag === "Starting" && s.phase === "waiting for port")
      )
      assert.deepStrictEqual(told, [fakePid(0)])
    })
  )
})
