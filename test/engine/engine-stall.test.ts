// EngineStall: the pure state (when a stall began, what clears it, when a restart is due) and the live layer on a
// TestClock over the test supervisor: an engine still stalled engine.stall_restart_after after it was taken as
// stalled is restarted, once; a completion, a new run or "0s" means no restart; a proxied server is never restarted.
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Logger } from "effect"
import { TestClock } from "effect/testing"
import { layerFromObject } from "../../src/layers/config/Config.ts"
import * as EngineStallLive from "../../src/layers/engine/EngineStall.ts"
import type { ProgressReading } from "../../src/services/engine/EngineProgress.ts"
import {
  EngineStall,
  isStalled,
  noStall,
  onCompleted,
  onFailing,
  onlyFailing,
  onNoProgress,
  onStall,
  onTestFailed,
  stallProblem,
  stallRestartAt,
  stallStart
} from "../../src/services/engine/EngineStall.ts"
import { State } from "../../src/services/engine/EngineState.ts"
import { Drain } from "../../src/services/node/Drain.ts"
import * as EngineTest from "../../src/testing/EngineProcess.ts"

describe("the stall state", () => {
  it("a stall begins at the first stalled stream since a completion and ends at the next completion", () => {
    const a = onStall(noStall, 1_000)
    const b = onStall(a, 4_000)
    assert.deepStrictEqual(b, {
      lastStallAt: 4_000,
      lastCompletedAt: undefined,
      stalledStreams: 2,
      stalledSince: 1_000
    })
    const cleared = onCompleted(b, 5_000)
    assert.isDefined(cleared)
    assert.isFalse(isStalled(cleared!))
    assert.strictEqual(stallRestartAt(cleared!, 60_000), undefined)
    // a completion that clears nothing changes nothing
    assert.strictEqual(onCompleted(cleared!, 6_000), undefined)
    // the next stall starts its own clock
    assert.strictEqual(onStall(cleared!, 9_000).stalledSince, 9_000)
  })

  it("a restart is due stall_restart_after past the stall's start; 0 means never", () => {
    const s = onStall(onStall(noStall, 1_000), 30_000)
    assert.strictEqual(stallRestartAt(s, 60_000), 61_000)
    assert.strictEqual(stallRestartAt(s, 0), undefined)
    assert.strictEqual(stallRestartAt(noStall, 60_000), undefined)
    // a stream older than the stall moved at 70 s: not before a whole idle timeout (5 s here) after that
    assert.strictEqual(stallRestartAt(s, 60_000, 5_000, 70_000), 75_000)
    assert.strictEqual(stallRestartAt(s, 60_000, 5_000, 30_000), 61_000, "moved long before the deadline")
    assert.strictEqual(stallRestartAt(s, 60_000, 5_000, 500), 61_000, "a move from before this stall")
  })

  it("the test completion that got no answer: a stall of its own, with its reason, cleared by a completion", () => {
    const idle = { since: 7_000, sentAfter: "after 2m without calls (engine.idle_probe_after)" }
    const s = onTestFailed(noStall, idle)
    assert.isDefined(s)
    assert.isTrue(isStalled(s!))
    assert.strictEqual(stallStart(s!), 7_000)
    assert.strictEqual(stallRestartAt(s!, 60_000), 67_000)
    assert.strictEqual(
      stallProblem(s!, "5m"),
      "engine stalled: a test completion sent after 2m without calls (engine.idle_probe_after) got no answer within 5m (engine.stream_idle_timeout)"
    )
    assert.strictEqual(onTestFailed(s!, { ...idle, since: 9_000 }), undefined, "already so taken")
    // the earliest source starts the stall; a stream's reason comes first
    const both = onStall(s!, 3_000)
    assert.strictEqual(stallStart(both), 3_000)
    assert.match(stallProblem(both, "5m")!, /stream\(s\) sent nothing/)
    const counters = onNoProgress(s!, { since: 8_000, held: 2, counters: ["c"] })!
    assert.match(stallProblem(counters, "5m")!, /made no progress/)
    const cleared = onCompleted(s!, 10_000)
    assert.isDefined(cleared)
    assert.isFalse(isStalled(cleared!))
  })

  it("failing calls are the only stall until a stream stalls, the counters stand still or the test gets no answer", () => {
    const failing = onFailing(noStall, { since: 1_000, calls: 5, last: "engine answered HTTP 500" })!
    assert.isTrue(onlyFailing(failing))
    assert.isFalse(onlyFailing(noStall))
    assert.isFalse(onlyFailing(onStall(failing, 2_000)), "a stream stalled since")
    assert.isFalse(onlyFailing(onNoProgress(failing, { since: 2_000, held: 1, counters: ["c"] })!), "counters")
    assert.isFalse(onlyFailing(onTestFailed(failing, { since: 2_000, sentAfter: "after a stream stalled" })!), "test")
    // a call completed after the stalled stream (the failing run not yet cleared): failing alone again
    const completed = onCompleted(onStall(failing, 2_000), 3_000, false, true)!
    assert.isDefined(completed.failing)
    assert.isTrue(onlyFailing(completed))
  })

  it("a data-parallel rank's test that got no answer: calls other ranks complete do not clear it, a test of all does", () => {
    const s = onTestFailed(onStall(noStall, 1_000), { since: 5_000, sentAfter: "after a stream stalled", ranks: [1] })!
    assert.match(stallProblem(s, "5m")!, /from data-parallel rank 1/, "a hung rank's reason before the streams'")
    assert.strictEqual(
      stallProblem(onCompleted(s, 6_000)!, "5m"),
      "engine stalled: a test completion sent after a stream stalled got no answer from data-parallel rank 1 within 5m (engine.stream_idle_timeout)",
      "the stream's stall cleared, the rank's kept"
    )
    const kept = onCompleted(s, 6_000)!
    assert.isTrue(isStalled(kept))
    assert.strictEqual(onCompleted(kept, 7_000), undefined, "nothing more a call can clear")
    assert.isFalse(isStalled(onCompleted(kept, 8_000, true)!))
  })
})

const AFTER_MS = 60_000

const IDLE_MS = 10_000

const setup = (options: { readonly after?: string; readonly spawns?: boolean } = {}) => {
  const config = layerFromObject({
    models: { m: { hf_repo: "org/m" } },
    engine: { stall_restart_after: options.after ?? `${AFTER_MS}ms`, stream_idle_timeout: `${IDLE_MS}ms` }
  })
  const engine = EngineTest.layerTest({
    initial: State.Ready({ since: 0, run: 0 }),
    plan: EngineTest.testPlan({ spawns: options.spawns ?? true })
  })
  return Layer.mergeAll(
    engine,
    Drain.layer,
    EngineStallLive.layer.pipe(Layer.provide(engine), Layer.provide(config), Layer.provide(Drain.layer))
  )
}

/** Lets the layer's fibers see the changes made so far. */
const yieldMany = Effect.gen(function* () {
  for (let i = 0; i < 20; i++) yield* Effect.yieldNow
})

const requests = Effect.flatMap(EngineTest.EngineProcessControl, (c) => c.restartRequests)

describe("the stall restart", () => {
  it.effect("an engine still stalled stall_restart_after after the stall began is restarted, once", () =>
    Effect.gen(function* () {
      const stall = yield* EngineStall
      yield* stall.stalled(0)
      yield* yieldMany
      yield* TestClock.adjust(30_000)
      // more stalled streams do not move the deadline
      yield* stall.stalled(30_000)
      yield* TestClock.adjust(AFTER_MS - 30_000 - 1)
      yield* yieldMany
      assert.deepStrictEqual(yield* requests, [], "not a millisecond early")
      yield* TestClock.adjust(1)
      yield* yieldMany
      const [request, ...more] = yield* requests
      assert.deepStrictEqual(more, [])
      assert.strictEqual(request?.source, "stall")
      assert.match(
        request?.reason ?? "",
        /^engine stalled: 2 stream\(s\) sent nothing for 10s .*, for 1m \(engine.stall_restart_after\)$/
      )
      yield* TestClock.adjust(10 * AFTER_MS)
      yield* yieldMany
      assert.strictEqual((yield* requests).length, 1, "one request per stall")
    }).pipe(Effect.provide(setup()))
  )

  it.effect("a call that completes before the deadline cancels the restart", () =>
    Effect.gen(function* () {
      const stall = yield* EngineStall
      yield* stall.stalled(0)
      yield* yieldMany
      yield* TestClock.adjust(AFTER_MS - 1)
      yield* stall.completed(AFTER_MS - 1)
      yield* yieldMany
      yield* TestClock.adjust(10 * AFTER_MS)
      yield* yieldMany
      assert.deepStrictEqual(yield* requests, [])
    }).pipe(Effect.provide(setup()))
  )

  it.effect("a new engine run cancels the restart", () =>
    Effect.gen(function* () {
      const stall = yield* EngineStall
      const control = yield* EngineTest.EngineProcessControl
      yield* stall.stalled(0)
      yield* yieldMany
      yield* control.set(State.Starting({ phase: "spawning", since: 1_000, run: 1 }))
      yield* yieldMany
      yield* control.set(State.Ready({ since: 2_000, run: 1 }))
      yield* TestClock.adjust(10 * AFTER_MS)
      yield* yieldMany
      assert.deepStrictEqual(yield* requests, [])
      assert.isFalse(isStalled(yield* stall.state))
    }).pipe(Effect.provide(setup()))
  )

  it.effect('"0s" never restarts, nor is a proxied server restarted', () =>
    Effect.gen(function* () {
      for (const layer of [setup({ after: "0s" }), setup({ spawns: false })]) {
        yield* Effect.gen(function* () {
          const stall = yield* EngineStall
          yield* stall.stalled(0)
          yield* yieldMany
          yield* TestClock.adjust(10 * AFTER_MS)
          yield* yieldMany
          assert.deepStrictEqual(yield* requests, [])
          assert.isTrue(isStalled(yield* stall.state), "still shown as stalled")
        }).pipe(Effect.provide(layer))
      }
    })
  )

  it.effect("a stream older than the stall that still reads waits the restart out; newer streams do not", () =>
    Effect.gen(function* () {
      const stall = yield* EngineStall
      yield* stall.stalled(0)
      yield* yieldMany
      // a stream begun after the stall (an engine that stalls every stream after a few tokens moves each new one)
      yield* stall.moved(AFTER_MS - 100, 1_000)
      // one begun before it, still generating
      yield* stall.moved(AFTER_MS - 50, -5_000)
      yield* TestClock.adjust(AFTER_MS)
      yield* yieldMany
      assert.deepStrictEqual(yield* requests, [], "a long generation from before the stall still moves")
      yield* TestClock.adjust(IDLE_MS - 51)
      yield* yieldMany
      assert.deepStrictEqual(yield* requests, [])
      yield* TestClock.adjust(1)
      yield* yieldMany
      assert.strictEqual((yield* requests).length, 1, "an idle timeout after it last moved")
    }).pipe(Effect.provide(setup()))
  )

  it.effect("no stall restart during a drain", () =>
    Effect.gen(function* () {
      const stall = yield* EngineStall
      yield* stall.stalled(0)
      yield* Effect.flatMap(Drain, (d) => d.start)
      yield* TestClock.adjust(10 * AFTER_MS)
      yield* yieldMany
      assert.deepStrictEqual(yield* requests, [])
    }).pipe(Effect.provide(setup()))
  )
})

/** A scrape of an engine holding 2 requests (the agent's 1 in flight) with its counters at `tokens`. */
const scrape = (at: number, tokens: number): ProgressReading => ({
  at,
  counters: { "vllm:prompt_tokens_total": tokens, "vllm:generation_tokens_total": tokens },
  held: 2,
  inflight: 1
})

/** setup() with its log lines (level and message) recorded, and each line's fields. */
const logged = (options: Parameters<typeof setup>[0] = {}) => {
  const lines: Array<string> = []
  const fields: Array<Record<string, unknown> | undefined> = []
  const logger = Logger.make(({ logLevel, message }) => {
    const [first, more] = [message].flat()
    lines.push(`${logLevel} ${first}`)
    fields.push(more as Record<string, unknown> | undefined)
  })
  return { lines, fields, layer: setup(options).pipe(Layer.provide(Logger.layer([logger]))) }
}

describe("the progress counters as a stall source", () => {
  const stallLines = (lines: ReadonlyArray<string>) => lines.filter((l) => /stalled|unhealthy/.test(l))

  it.effect(
    "work held and no counter moved for the idle timeout: stalled, logged, restarted after the deadline",
    () => {
      const { lines, layer } = logged()
      return Effect.gen(function* () {
        const stall = yield* EngineStall
        for (const at of [0, 5_000, IDLE_MS]) yield* stall.scraped(scrape(at, 7))
        yield* yieldMany
        assert.isFalse(isStalled(yield* stall.state), "still for 5 s of the 10 s window")
        yield* stall.scraped(undefined) // a failed scrape says nothing
        yield* stall.scraped(scrape(IDLE_MS + 5_000, 7))
        yield* yieldMany
        const s = yield* stall.state
        assert.deepStrictEqual(s.noProgress, {
          since: IDLE_MS + 5_000,
          held: 2,
          counters: ["vllm:prompt_tokens_total", "vllm:generation_tokens_total"]
        })
        assert.deepStrictEqual(stallLines(lines), [
          "Warn the node is unhealthy: engine stalled: it made no progress for 10s (engine.stream_idle_timeout) " +
            "with 2 request(s) held (vllm:prompt_tokens_total and vllm:generation_tokens_total unchanged)"
        ])
        yield* TestClock.adjust(IDLE_MS + 5_000 + AFTER_MS)
        yield* yieldMany
        const [request, ...more] = yield* requests
        assert.deepStrictEqual(more, [])
        assert.strictEqual(request?.source, "stall")
        assert.match(
          request?.reason ?? "",
          /^engine stalled: it made no progress .* unchanged\), for 1m \(engine.stall_restart_after\)$/
        )
      }).pipe(Effect.provide(layer))
    }
  )

  it.effect("a counter that moves clears it (logged once) and cancels the restart", () => {
    const { lines, layer } = logged()
    return Effect.gen(function* () {
      const stall = yield* EngineStall
      for (const at of [0, 5_000, 15_000]) yield* stall.scraped(scrape(at, 7))
      yield* yieldMany
      assert.isTrue(isStalled(yield* stall.state))
      yield* TestClock.adjust(30_000)
      yield* stall.scraped(scrape(30_000, 8))
      yield* yieldMany
      assert.isFalse(isStalled(yield* stall.state))
      yield* TestClock.adjust(10 * AFTER_MS)
      yield* yieldMany
      assert.deepStrictEqual(yield* requests, [])
      assert.deepStrictEqual(
        stallLines(lines).map((l) => l.slice(0, 40)),
        ["Warn the node is unhealthy: engine stall", "Info the engine is no longer stalled: th"]
      )
      assert.include(lines.at(-1) ?? "", "the engine's progress counters moved")
    }).pipe(Effect.provide(layer))
  })

  // Without it the node flaps: a completion clears the counters' stall, and the next scrape, its counters the same
  // as the baseline, would find the old stillness and take the engine as stuck again at once (a review's case).
  it.effect("a completion clears it and starts the stillness over, its cause in the log line", () => {
    const { lines, layer } = logged()
    return Effect.gen(function* () {
      const stall = yield* EngineStall
      for (const at of [0, 5_000, 15_000]) yield* stall.scraped(scrape(at, 7))
      yield* yieldMany
      assert.isTrue(isStalled(yield* stall.state))
      yield* stall.completed(16_000, "the engine completed a test request")
      yield* yieldMany
      assert.isFalse(isStalled(yield* stall.state))
      assert.include(lines.at(-1) ?? "", "the engine is no longer stalled: the engine completed a test request")
      yield* stall.scraped(scrape(17_000, 7))
      yield* stall.scraped(scrape(26_000, 7))
      yield* yieldMany
      assert.isFalse(isStalled(yield* stall.state), "still for 9 s since the completion, of the 10 s window")
      yield* stall.scraped(scrape(27_000, 7))
      yield* yieldMany
      assert.isTrue(isStalled(yield* stall.state))
    }).pipe(Effect.provide(layer))
  })

  it.effect("a new engine run starts the counters' watch over", () =>
    Effect.gen(function* () {
      const stall = yield* EngineStall
      const control = yield* EngineTest.EngineProcessControl
      for (const at of [0, 5_000]) yield* stall.scraped(scrape(at, 7))
      yield* control.set(State.Starting({ phase: "spawning", since: 6_000, run: 1 }))
      yield* yieldMany
      yield* control.set(State.Ready({ since: 7_000, run: 1 }))
      yield* yieldMany
      // the new run's counters happen to read the same: the first reading of a run only sets the baseline
      for (const at of [8_000, 15_000, 17_999]) yield* stall.scraped(scrape(at, 7))
      yield* yieldMany
      assert.isFalse(isStalled(yield* stall.state))
      yield* stall.scraped(scrape(25_000, 7))
      yield* yieldMany
      assert.isTrue(isStalled(yield* stall.state))
    }).pipe(Effect.provide(setup()))
  )
})

describe("the stall's per-run reset and its log lines", () => {
  it.effect(
    "calls the last run failed do not count toward failed_calls_unhealthy in a new run (no penalty carried)",
    () =>
      Effect.gen(function* () {
        const stall = yield* EngineStall
        const control = yield* EngineTest.EngineProcessControl
        yield* stall.callsFailed(1_000, 4, "engine answered HTTP 500: boom")
        yield* control.set(State.Starting({ phase: "spawning", since: 2_000, run: 1 }))
        yield* yieldMany
        yield* control.set(State.Ready({ since: 3_000, run: 1 }))
        yield* yieldMany
        yield* stall.callsFailed(4_000, 4, "engine answered HTTP 500: boom")
        yield* yieldMany
        assert.isUndefined((yield* stall.state).failing, "4 of the default 5 in this run")
        yield* stall.callsFailed(5_000, 1, "engine answered HTTP 500: boom")
        yield* yieldMany
        assert.isDefined((yield* stall.state).failing, "the 5th of this run")
      }).pipe(Effect.provide(setup()))
  )

  it.effect("failing calls that begin while the engine is already stalled get their own line", () => {
    const { lines, layer } = logged()
    return Effect.gen(function* () {
      const stall = yield* EngineStall
      yield* stall.stalled(1_000)
      yield* yieldMany
      yield* stall.callsFailed(2_000, 5, "engine answered HTTP 500: boom")
      yield* yieldMany
      assert.deepStrictEqual(
        lines.filter((l) => l.startsWith("Warn the node is unhealthy")).map((l) => l.slice(0, 48)),
        ["Warn the node is unhealthy: engine stalled: 1 st", "Warn the node is unhealthy: engine failing calls"]
      )
    }).pipe(Effect.provide(layer))
  })

  it.effect('a proxied server (never restarted): the warning\'s restart_after says "never"', () => {
    const proxied = logged({ spawns: false })
    const spawned = logged()
    const restartAfter = (log: typeof proxied) =>
      log.fields[log.lines.findIndex((l) => l.startsWith("Warn the node is unhealthy"))]?.restart_after
    return Effect.gen(function* () {
      for (const log of [proxied, spawned])
        yield* Effect.gen(function* () {
          yield* (yield* EngineStall).stalled(1_000)
          yield* yieldMany
        }).pipe(Effect.provide(log.layer))
      assert.strictEqual(restartAfter(proxied), "never")
      assert.strictEqual(restartAfter(spawned), "1m")
    })
  })

  it.effect("a rank first seen after a test began has not moved since it began: its first figure is a baseline", () =>
    Effect.gen(function* () {
      const stall = yield* EngineStall
      yield* stall.scraped({ ...scrape(1_000, 7), ranks: { "0": 1 } })
      // the test began at 2_000; rank 1 first appears after it, rank 0 moved after it
      yield* stall.scraped({ ...scrape(3_000, 8), ranks: { "0": 2, "1": 5 } })
      assert.isTrue(yield* stall.rankMoved(0, 2_000))
      assert.isFalse(yield* stall.rankMoved(1, 2_000))
      yield* stall.scraped({ ...scrape(4_000, 9), ranks: { "0": 2, "1": 6 } })
      assert.isTrue(yield* stall.rankMoved(1, 2_000), "then a change counts")
    }).pipe(Effect.provide(setup()))
  )
})
