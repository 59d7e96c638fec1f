// The liveness probe's cadence on a TestClock (src/layers/engine/watch.ts): a ready engine is probed every
// engine.liveness_interval, start to start, as the kubelet probes (periodSeconds), so an engine that hangs
// (every probe running into its min(interval, 5 s) timeout) is unhealthy after liveness_failures intervals plus
// one timeout: with the defaults (5 s, 3) 20 s after Ready here, probes starting at 5, 10 and 15 s; the wait
// used to follow each probe, so the probes of a hung engine came every 10 s and took 30 s.
import { assert, describe, it } from "@effect/vitest"
import { Clock, Deferred, Effect, Fiber, Logger, Ref } from "effect"
import { TestClock } from "effect/testing"
import { watchRun } from "../../src/layers/engine/watch.ts"
import type { EngineHostService, ProbeResult } from "../../src/services/engine/EngineHost.ts"
import { type RestartRequest, RunEndWords } from "../../src/services/engine/EngineProcess.ts"
import type { SupervisorEvent } from "../../src/services/engine/EngineState.ts"
import { testPlan } from "../../src/testing/EngineProcess.ts"
import { settle } from "../support/poll.ts"
import { testSettings } from "../support/supervisor.ts"

const settings = testSettings()

describe("liveness cadence", () => {
  it.effect("a hung engine: probes start every interval, unhealthy after 3 intervals and one timeout", () =>
    Effect.gen(function* () {
      const starts: Array<{ at: number; timeoutMs: number }> = []
      const events: Array<SupervisorEvent> = []
      let calls = 0
      // The first probe (readiness) answers; then the engine hangs: each probe runs into its bound, as probeOnce's.
      const probe = (_p: unknown, timeoutMs: number): Effect.Effect<ProbeResult> =>
        Effect.gen(function* () {
          if (calls++ === 0) return { ok: true }
          starts.push({ at: yield* Clock.currentTimeMillis, timeoutMs })
          yield* Effect.sleep(timeoutMs)
          return { ok: false, reason: `no answer within ${timeoutMs} ms`, phase: "probe timeout" }
        })
      const host = { probe } as unknown as EngineHostService
      const supervision = {
        plan: testPlan(),
        settings,
        host,
        publish: (e: SupervisorEvent) => Effect.sync(() => void events.push(e)),
        memory: undefined,
        endReadyRun: yield* Ref.make<Deferred.Deferred<RestartRequest> | undefined>(undefined),
        shortage: undefined
      }
      const readyAt = yield* Deferred.make<number>()
      const watch = yield* Effect.forkChild(
        watchRun(supervision, { run: 0, since: 0, readyAt, holder: Effect.succeed("engine") })
      )
      yield* settle(
        "Ready",
        Effect.sync(() => events.some((e) => e._tag === "ProbeOk"))
      )
      yield* TestClock.adjust(19_999)
      yield* settle(
        "three probes started",
        Effect.sync(() => starts.length === 3)
      )
      assert.deepStrictEqual(
        starts.map((s) => s.at),
        [5_000, 10_000, 15_000]
      )
      assert.deepStrictEqual(
        starts.map((s) => s.timeoutMs),
        [5_000, 5_000, 5_000]
      )
      assert.isUndefined(watch.pollUnsafe(), "still live 1 ms before the third probe's timeout")
      yield* TestClock.adjust(1)
      const end = yield* Fiber.join(watch)
      assert.deepStrictEqual(end, {
        kind: "unhealthy",
        reason: "3 liveness probes failed in a row, last: no answer within 5000 ms"
      })
      assert.strictEqual(
        RunEndWords.record(end),
        "unhealthy: 3 liveness probes failed in a row, last: no answer within 5000 ms"
      )
      assert.strictEqual(yield* Clock.currentTimeMillis, 20_000)
    }).pipe(Effect.provide(Logger.layer([])))
  )

  it.effect("an interval above 5 s: each probe still abandoned at 5 s (README: min(liveness_interval, 5 s))", () =>
    Effect.gen(function* () {
      const starts: Array<{ at: number; timeoutMs: number }> = []
      const events: Array<SupervisorEvent> = []
      let calls = 0
      const probe = (_p: unknown, timeoutMs: number): Effect.Effect<ProbeResult> =>
        Effect.gen(function* () {
          if (calls++ === 0) return { ok: true }
          starts.push({ at: yield* Clock.currentTimeMillis, timeoutMs })
          yield* Effect.sleep(timeoutMs)
          return { ok: false, reason: `no answer within ${timeoutMs} ms`, phase: "probe timeout" }
        })
      const supervision = {
        plan: testPlan(),
        settings: testSettings({ livenessIntervalMs: 8_000 }),
        host: { probe } as unknown as EngineHostService,
        publish: (e: SupervisorEvent) => Effect.sync(() => void events.push(e)),
        memory: undefined,
        endReadyRun: yield* Ref.make<Deferred.Deferred<RestartRequest> | undefined>(undefined),
        shortage: undefined
      }
      const readyAt = yield* Deferred.make<number>()
      const watch = yield* Effect.forkChild(
        watchRun(supervision, { run: 0, since: 0, readyAt, holder: Effect.succeed("engine") })
      )
      yield* settle(
        "Ready",
        Effect.sync(() => events.some((e) => e._tag === "ProbeOk"))
      )
      // probes start at 8, 16 and 24 s; the third is given up at 29 s
      yield* TestClock.adjust(28_999)
      yield* settle(
        "three probes started",
        Effect.sync(() => starts.length === 3)
      )
      assert.deepStrictEqual(starts, [
        { at: 8_000, timeoutMs: 5_000 },
        { at: 16_000, timeoutMs: 5_000 },
        { at: 24_000, timeoutMs: 5_000 }
      ])
      assert.isUndefined(watch.pollUnsafe(), "still live 1 ms before the third probe's timeout")
      yield* TestClock.adjust(1)
      assert.strictEqual((yield* Fiber.join(watch)).kind, "unhealthy")
    }).pipe(Effect.provide(Logger.layer([])))
  )
})
