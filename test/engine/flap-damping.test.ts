// Flap damping of the engine taken as failing calls (services/engine/FlapDamping.ts): the pure penalty (a lone trip
// clears as before, repeated trips hold it, the penalty decays to the reuse level, neither calls nor the test clear it
// while held, a 100% failing engine's restart comes as before), then the live EngineStall on a TestClock: the reason,
// the counter, the clear owed at the hold's end, and a still-flapping engine held into its restart.
import { assert, describe, it } from "@effect/vitest"
import { Clock, Effect, Layer, Logger } from "effect"
import { TestClock } from "effect/testing"
import { Registry } from "prom-client"
import { layerFromObject } from "../../src/layers/config/Config.ts"
import * as EngineStallLive from "../../src/layers/engine/EngineStall.ts"
import { fromRegistry } from "../../src/layers/observability/Metrics.ts"
import {
  EngineStall,
  isStalled,
  noStall,
  onCompleted,
  onFailing,
  stallProblem,
  stallRestartAt
} from "../../src/services/engine/EngineStall.ts"
import { State } from "../../src/services/engine/EngineState.ts"
import { addFailed, failingProblem } from "../../src/services/engine/FailedCalls.ts"
import {
  aboutUntil,
  CEILING,
  type Damping,
  HALF_LIFE_MS,
  isHeld,
  onClear,
  onFailedRun,
  onRelease,
  onTrip,
  penaltyAt,
  releaseAt,
  undamped
} from "../../src/services/engine/FlapDamping.ts"
import { Metrics } from "../../src/services/observability/Metrics.ts"
import * as EngineTest from "../../src/testing/EngineProcess.ts"

/** Trips at `times` (ms) from no penalty. */
const trips = (times: ReadonlyArray<number>): Damping => times.reduce(onTrip, undamped)

describe("the penalty (pure)", () => {
  it("a lone trip, or two, is never held: the clear comes as before", () => {
    const one = onTrip(undamped, 5_000)
    assert.strictEqual(one.penalty, 1)
    assert.isFalse(isHeld(one, 5_000))
    assert.isUndefined(releaseAt(one))
    assert.isTrue(onClear(one, 6_000))
    const two = trips([0, 0])
    assert.strictEqual(two.penalty, 2)
    assert.isTrue(onClear(two, 1_000), "two at once: not held")
  })

  it("repeated trips add up, decaying by half every half-life; held from the one that reaches 3", () => {
    // trips 30 s apart, as at 50% errors (about 2 a minute): held at the 4th
    const table: ReadonlyArray<readonly [at: number, penalty: number, held: boolean]> = [
      [0, 1, false],
      [30_000, 1 + 2 ** -0.25, false],
      [60_000, 1 + (1 + 2 ** -0.25) * 2 ** -0.25, false],
      [90_000, 1 + (1 + (1 + 2 ** -0.25) * 2 ** -0.25) * 2 ** -0.25, true]
    ]
    let d = undamped
    for (const [at, penalty, held] of table) {
      d = onTrip(d, at)
      assert.closeTo(d.penalty, penalty, 1e-9, `at ${at}`)
      assert.strictEqual(isHeld(d, at), held, `held at ${at}`)
    }
    assert.isAbove(d.penalty, 3)
    // the same four spread over 4 minutes (one a minute and more): never held
    assert.isFalse(isHeld(trips([0, 80_000, 160_000, 240_000]), 240_000))
    // at most CEILING however many: the hold ends at most 2 half-lives after the last
    const many = trips(Array.from({ length: 20 }, (_, i) => i * 1_000))
    assert.strictEqual(many.penalty, CEILING)
    assert.strictEqual(releaseAt(many), 19_000 + 2 * HALF_LIFE_MS)
  })

  it("the penalty decays to the reuse level: the hold ends then, and a trip after it starts from what is left", () => {
    const d = trips([0, 30_000, 60_000, 90_000])
    const end = releaseAt(d)!
    assert.strictEqual(end, 90_000 + Math.ceil(HALF_LIFE_MS * Math.log2(d.penalty)))
    assert.closeTo(penaltyAt(d, end), 1, 1e-3)
    assert.isTrue(isHeld(d, end - 1))
    assert.isFalse(isHeld(d, end))
    assert.deepStrictEqual(onRelease(d, end - 1), [false, d], "not yet")
    const [clear, after] = onRelease(d, end)
    assert.isFalse(clear, "nothing owed: still failing, no longer held")
    assert.isFalse(after.suppressed)
    // the next trip: under 1 left + 1, not held again
    assert.isFalse(isHeld(onTrip(after, end + 1_000), end + 1_000))
    assert.strictEqual(aboutUntil(d), Math.ceil(end / 60_000) * 60_000)
    assert.isUndefined(aboutUntil(undamped))
  })

  it("neither calls completed in a row nor the test clear it while held: the clear is owed, given at the end", () => {
    const d = trips([0, 30_000, 60_000, 90_000])
    const owed = onClear(d, 100_000)
    assert.notStrictEqual(owed, true)
    if (owed === true) return
    assert.isTrue(owed.owed)
    assert.strictEqual(onClear(owed, 110_000), owed, "owed once")
    // in the stall state: the completion (everyRank: the agent's test) keeps the failing calls
    const failing = { since: 90_000, calls: 5, last: "boom", heldUntil: aboutUntil(d) }
    const s = onFailing(noStall, failing)!
    assert.isUndefined(onCompleted(s, 100_000, true, true), "kept: nothing changes")
    const [clear, after] = onRelease(owed, releaseAt(owed)!)
    assert.isTrue(clear)
    assert.isFalse(after.owed)
  })

  it("while held, a run failed after an owed clear is a re-trip (the hold goes on); without one it is not", () => {
    const d = trips([0, 30_000, 60_000, 90_000])
    assert.isUndefined(onFailedRun(d, 100_000), "failing on, no clear between: nothing new")
    const owed = onClear(d, 100_000) as Damping
    const retrip = onFailedRun(owed, 110_000)!
    assert.isFalse(retrip.owed)
    assert.isAbove(releaseAt(retrip)!, releaseAt(d)!)
    assert.isUndefined(onFailedRun(onTrip(undamped, 0), 2_000), "not held: a failing state goes on as before")
    // late in a hold, the penalty decayed so far that one more (1.68 + 1) is under 3: README "neither completed calls
    // nor the test clear it until the penalty has decayed below 1 ... (a run of failed calls after a clear it held back
    // counts as a time too)": still held, and longer, not let back to traffic
    const late = trips([0, 0, 0, 0])
    const lateOwed = onClear(late, 150_000) as Damping
    const lateRetrip = onFailedRun(lateOwed, 150_001)!
    assert.isBelow(lateRetrip.penalty, 3)
    assert.isTrue(isHeld(lateRetrip, 150_002), "held on after the re-trip")
    assert.isAbove(releaseAt(lateRetrip)!, releaseAt(late)!)
  })

  it("an engine failing every call trips once: never held, restarted stall_restart_after from its trip as before", () => {
    const [run, failing] = addFailed(undefined, 5, "boom", 5, 5_000)
    let d = onTrip(undamped, 5_000)
    let s = onFailing(noStall, failing!)!
    // more runs, no completion: no re-trip, no new state
    let r = run
    for (let t = 6_000; t < 400_000; t += 1_000) {
      const [next, again] = addFailed(r, 100, "boom", 5, t)
      r = next
      assert.isDefined(again)
      assert.isUndefined(onFailedRun(d, t))
      assert.isUndefined(onFailing(s, again!))
    }
    assert.isFalse(isHeld(d, 5_000))
    assert.strictEqual(stallRestartAt(s, 300_000), 305_000)
    // and held (it flapped before failing every call): the restart still counts from the trip
    d = trips([0, 30_000, 60_000, 90_000])
    s = onFailing(noStall, { since: 90_000, calls: 5, last: "boom", heldUntil: aboutUntil(d) })!
    assert.strictEqual(stallRestartAt(s, 300_000), 390_000)
  })

  it("the reason says it is held for flapping, and until about when", () => {
    const f = { since: 0, calls: 6, last: "engine answered HTTP 500: boom" }
    assert.strictEqual(
      failingProblem(f),
      "engine failing calls: the last 6 calls failed in the engine with none completed (engine.failed_calls_unhealthy), the last with: engine answered HTTP 500: boom"
    )
    assert.strictEqual(
      failingProblem({ ...f, heldUntil: Date.UTC(2026, 11, 5, 14, 5) }),
      "engine failing calls, held for flapping until about 14:05 UTC (taken as failing again and again: neither completed calls nor the test clear it before then): the last 6 calls failed in the engine with none completed (engine.failed_calls_unhealthy), the last with: engine answered HTTP 500: boom"
    )
  })
})

const AFTER_MS = 300_000

/** The live EngineStall over the test supervisor (Ready), with metrics and its log lines recorded. */
const setup = (afterMs = AFTER_MS) => {
  const config = layerFromObject({
    models: { m: { hf_repo: "org/m" } },
    engine: { stall_restart_after: `${afterMs}ms`, stream_idle_timeout: "5m" }
  })
  const engine = EngineTest.layerTest({ initial: State.Ready({ since: 0, run: 0 }) })
  const registry = new Registry()
  const metrics = Layer.effect(Metrics, fromRegistry(registry))
  const lines: Array<string> = []
  const logger = Logger.make(({ logLevel, message }) => {
    lines.push(`${logLevel} ${[message].flat()[0]}`)
  })
  const layer = Layer.mergeAll(
    engine,
    metrics,
    EngineStallLive.layer.pipe(Layer.provide(engine), Layer.provide(config), Layer.provide(metrics))
  ).pipe(Layer.provide(Logger.layer([logger])))
  return { registry, lines, layer }
}

const yieldMany = Effect.gen(function* () {
  for (let i = 0; i < 20; i++) yield* Effect.yieldNow
})

const requests = Effect.flatMap(EngineTest.EngineProcessControl, (c) => c.restartRequests)
const failingNow = Effect.map(
  Effect.flatMap(EngineStall, (s) => s.state),
  (s) => s.failing
)
const counter = async (registry: Registry, name: string) =>
  (await registry.getSingleMetric(name)?.get())?.values[0]?.value

/** To `t` (ms) on the TestClock, the layer's fibers run. */
const to = (t: number) =>
  Effect.gen(function* () {
    const now = yield* Clock.currentTimeMillis
    if (t > now) yield* TestClock.adjust(t - now)
    yield* yieldMany
  })

/** A run of 5 failed calls at `t`, as the watchdog reports it. */
const failed = (t: number) =>
  Effect.gen(function* () {
    yield* to(t)
    yield* Effect.flatMap(EngineStall, (s) => s.callsFailed(t, 5, "engine answered HTTP 500: boom"))
    yield* yieldMany
  })

/** 5 calls completed in a row at `t`, as the watchdog reports them (or the agent's test with `cause`). */
const completed = (t: number, cause?: string) =>
  Effect.gen(function* () {
    yield* to(t)
    yield* Effect.flatMap(EngineStall, (s) =>
      cause === undefined ? s.completed(t, undefined, false, 5) : s.completed(t, cause, true)
    )
    yield* yieldMany
  })

/** Trips at 0, 30, 60 s, each cleared 1 s later by 5 calls completed in a row, and a 4th at 90 s (held). */
const flapUntilHeld = Effect.gen(function* () {
  for (const t of [0, 30_000, 60_000]) {
    yield* failed(t)
    assert.isUndefined((yield* failingNow)?.heldUntil, `not held at ${t}`)
    yield* completed(t + 1_000)
    assert.isUndefined(yield* failingNow, `cleared at ${t + 1_000}`)
  }
  yield* failed(90_000)
})

describe("the live EngineStall's flap damping", () => {
  it.effect("a lone trip clears at 5 calls in a row as before, not counted as a hold", () => {
    const t = setup()
    return Effect.gen(function* () {
      yield* failed(0)
      assert.isDefined(yield* failingNow)
      yield* completed(1_000)
      assert.isUndefined(yield* failingNow)
      assert.strictEqual(yield* Effect.promise(() => counter(t.registry, "cgn_agent_engine_failing_holds_total")), 0)
    }).pipe(Effect.provide(t.layer))
  })

  it.effect(
    "held at the 4th trip in 90 s: neither calls nor the test clear it; the clear owed comes at its end",
    () => {
      const t = setup()
      return Effect.gen(function* () {
        yield* flapUntilHeld
        const held = (yield* failingNow)!
        const d = trips([0, 30_000, 60_000, 90_000])
        assert.strictEqual(held.heldUntil, aboutUntil(d))
        const problem = stallProblem(yield* Effect.flatMap(EngineStall, (s) => s.state), "5m")
        assert.match(problem ?? "", /^engine failing calls, held for flapping until about 00:0\d UTC \(/)
        assert.strictEqual(yield* Effect.promise(() => counter(t.registry, "cgn_agent_engine_failing_holds_total")), 1)
        assert.strictEqual(
          yield* Effect.promise(() => counter(t.registry, "cgn_agent_engine_call_failure_streaks_total")),
          4
        )
        yield* completed(91_000)
        yield* completed(92_000, "the agent's test completion completed")
        assert.deepStrictEqual(yield* failingNow, held, "not cleared, not changed")
        const end = releaseAt(d)!
        yield* to(end - 1)
        assert.isDefined(yield* failingNow, "not a millisecond early")
        yield* to(end)
        assert.isUndefined(yield* failingNow, "the owed clear, at the end")
        assert.isFalse(isStalled(yield* Effect.flatMap(EngineStall, (s) => s.state)))
        assert.include(
          t.lines,
          "Info the engine is no longer failing calls: its hold for flapping ended, calls or the test having completed meanwhile"
        )
        assert.deepStrictEqual(yield* requests, [], "held less than stall_restart_after: not restarted")
      }).pipe(Effect.provide(t.layer))
    }
  )

  it.effect("with nothing owed at its end it stays failing, no longer held, and clears as usual", () => {
    const t = setup()
    return Effect.gen(function* () {
      yield* flapUntilHeld
      const end = releaseAt(trips([0, 30_000, 60_000, 90_000]))!
      yield* to(end)
      const f = yield* failingNow
      assert.isDefined(f)
      assert.isUndefined(f?.heldUntil)
      assert.include(
        t.lines,
        "Info the engine's hold for flapping ended: still failing calls until calls or the test complete"
      )
      yield* completed(end + 1_000)
      assert.isUndefined(yield* failingNow)
    }).pipe(Effect.provide(t.layer))
  })

  it.effect(
    "still flapping while held: re-trips keep it held; restarted stall_restart_after from the held trip",
    () => {
      const t = setup()
      return Effect.gen(function* () {
        yield* flapUntilHeld
        // every 30 s: 5 completed in a row (a clear owed), then 5 failed (a re-trip)
        for (let at = 120_000; at < 90_000 + AFTER_MS; at += 30_000) {
          yield* completed(at - 15_000)
          yield* failed(at)
          assert.isDefined((yield* failingNow)?.heldUntil, `held at ${at}`)
        }
        yield* to(90_000 + AFTER_MS - 1)
        assert.deepStrictEqual(yield* requests, [], "not a millisecond early")
        yield* to(90_000 + AFTER_MS)
        const [request, ...more] = yield* requests
        assert.deepStrictEqual(more, [])
        assert.strictEqual(request?.source, "stall")
        assert.match(
          request?.reason ?? "",
          /^engine failing calls, held for flapping until about .* \(engine\.stall_restart_after\)$/
        )
      }).pipe(Effect.provide(t.layer))
    }
  )

  /** A hold that outlasts a stall_restart_after of 2 min (the default, 5 min, ends before any hold does). */
  const SHORT_AFTER_MS = 120_000
  const END = releaseAt(trips([0, 30_000, 60_000, 90_000]))!

  it.effect(
    "held past stall_restart_after: an engine whose calls complete meanwhile is not restarted, cleared at the hold's end",
    () => {
      const t = setup(SHORT_AFTER_MS)
      return Effect.gen(function* () {
        assert.isAbove(END, 90_000 + SHORT_AFTER_MS, "the hold outlasts stall_restart_after")
        yield* flapUntilHeld
        yield* completed(91_000)
        yield* to(90_000 + SHORT_AFTER_MS + 10_000)
        assert.deepStrictEqual(yield* requests, [], "recovered while held: not restarted")
        yield* to(END)
        assert.isUndefined(yield* failingNow, "the owed clear, at the end")
        yield* to(END + SHORT_AFTER_MS)
        assert.deepStrictEqual(yield* requests, [])
      }).pipe(Effect.provide(t.layer))
    }
  )

  it.effect(
    "held past stall_restart_after: one that fails a run of calls again after its calls completed is restarted within a second",
    () => {
      const t = setup(SHORT_AFTER_MS)
      return Effect.gen(function* () {
        yield* flapUntilHeld
        yield* completed(91_000)
        yield* to(90_000 + SHORT_AFTER_MS + 10_000)
        assert.deepStrictEqual(yield* requests, [])
        yield* failed(90_000 + SHORT_AFTER_MS + 20_000)
        yield* to(90_000 + SHORT_AFTER_MS + 21_000)
        const [request, ...more] = yield* requests
        assert.deepStrictEqual(more, [])
        assert.strictEqual(request?.source, "stall")
      }).pipe(Effect.provide(t.layer))
    }
  )

  it.effect("failing every call: restarted stall_restart_after after its trip, as before", () => {
    const t = setup()
    return Effect.gen(function* () {
      for (let at = 5_000; at < 5_000 + AFTER_MS; at += 1_000) yield* failed(at)
      assert.isUndefined((yield* failingNow)?.heldUntil)
      assert.deepStrictEqual(yield* requests, [])
      yield* to(5_000 + AFTER_MS)
      assert.strictEqual((yield* requests).length, 1)
    }).pipe(Effect.provide(t.layer))
  })

  it.effect("a new engine run starts without a penalty", () => {
    const t = setup()
    return Effect.gen(function* () {
      yield* flapUntilHeld
      const control = yield* EngineTest.EngineProcessControl
      yield* control.set(State.Starting({ phase: "spawning", since: 95_000, run: 1 }))
      yield* control.set(State.Ready({ since: 96_000, run: 1 }))
      yield* yieldMany
      assert.isUndefined(yield* failingNow)
      yield* failed(100_000)
      assert.isUndefined((yield* failingNow)?.heldUntil, "a lone trip of the new run")
      yield* completed(101_000)
      assert.isUndefined(yield* failingNow)
    }).pipe(Effect.provide(t.layer))
  })
})
