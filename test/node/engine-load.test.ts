// The engine-load sampler (src/layers/node/engineLoad.ts) under the live NodeStatus, on a TestClock: the engine's
// metrics endpoint hangs and NodeHealth (what the etcd heartbeat writes, /status and GetNodeHealth return) and
// the admin /metrics render still answer at once; the last sample is shown for three heartbeats, then left out;
// a hung scrape is cut at 0.9 of a heartbeat (its request interrupted), a slow one that ends before that is
// shown; a new Ready period is sampled at once; a flapping engine or a varying error text logs O(1) lines.
import { assert, describe, it } from "@effect/vitest"
import { Effect, type Fiber, Layer, Logger } from "effect"
import { TestClock } from "effect/testing"
import * as ConfigLayer from "../../src/layers/config/Config.ts"
import { failureKind, maxAgeMs, RECOVERED_AFTER, scrapeTimeoutMs } from "../../src/layers/node/engineLoad.ts"
import * as NodeStatusLayer from "../../src/layers/node/NodeStatus.ts"
import { EngineClient, EngineError, type LoadSignals } from "../../src/services/engine/EngineClient.ts"
import { State } from "../../src/services/engine/EngineState.ts"
import { NodeStatus } from "../../src/services/node/NodeStatus.ts"
import { Metrics } from "../../src/services/observability/Metrics.ts"
import { EngineProcessControl } from "../../src/testing/EngineProcess.ts"
import { nodeStatusDeps } from "../support/nodeStatus.ts"
import { settle } from "../support/poll.ts"

const HEARTBEAT_MS = 1_000
const signals: LoadSignals = { running: 3, waiting: 1, kvUsage: 0.25 }

/**
 * The engine's /metrics as the test sets it: answering, answering after `slowMs` (on the Clock), hanging (until
 * interrupted), refusing, or answering HTTP 503 with a body that differs per scrape (a request id).
 */
const makeEngine = () => {
  const engine = {
    mode: "ok" as "ok" | "slow" | "hang" | "fail" | "503" | "status-per-scrape",
    slowMs: 0,
    scrapes: 0,
    interrupted: 0
  }
  const load = Effect.suspend(() => {
    engine.scrapes++
    if (engine.mode === "ok") return Effect.succeed(signals)
    if (engine.mode === "slow") return Effect.as(Effect.sleep(engine.slowMs), signals)
    if (engine.mode === "fail")
      return Effect.fail(new EngineError({ reason: "Connect", message: "connect ECONNREFUSED 127.0.0.1:8000" }))
    if (engine.mode === "503")
      return Effect.fail(
        new EngineError({ reason: "Http", status: 503, message: `HTTP 503: {"request_id":"r${engine.scrapes}"}` })
      )
    if (engine.mode === "status-per-scrape") {
      const status = 500 + engine.scrapes
      return Effect.fail(new EngineError({ reason: "Http", status, message: `HTTP ${status}` }))
    }
    return Effect.never.pipe(Effect.onInterrupt(() => Effect.sync(() => engine.interrupted++)))
  })
  const client = Layer.succeed(EngineClient, { streamTo: () => Effect.void, load })
  const config = ConfigLayer.layerFromObject({
    models: { m: { hf_repo: "org/m" } },
    agent: { node_id: "n1", heartbeat: `${HEARTBEAT_MS}ms`, advertise_addr: "10.1.2.3:7071" }
  })
  const deps = nodeStatusDeps(config, client)
  const layer = NodeStatusLayer.layer({ agentVersion: "9.9.9" }).pipe(Layer.provideMerge(deps))
  const logs: Array<string> = []
  const logger = Logger.make(({ logLevel, message }) => {
    const [msg, fields] = [message].flat() as [string, { reason?: string } | undefined]
    logs.push(`${logLevel} ${msg}${fields?.reason === undefined ? "" : ` (${fields.reason})`}`)
  })
  return { engine, logs, layer: layer.pipe(Layer.provide(Logger.layer([logger]))) }
}

describe("failureKind", () => {
  it("one kind per HTTP status (README: once per kind of scrape failure), its message aside", () => {
    const http = (status: number, message: string) => failureKind(new EngineError({ reason: "Http", status, message }))
    assert.strictEqual(http(503, "HTTP 503: a"), "HTTP 503")
    assert.strictEqual(http(503, "HTTP 503: b"), "HTTP 503")
    assert.strictEqual(http(500, "HTTP 500"), "HTTP 500")
    assert.strictEqual(failureKind(new EngineError({ reason: "Connect", message: "ECONNREFUSED" })), "connect")
  })
})

/** The sampler's log lines, the warning's tail (how long samples are kept) left out. */
const scrapeLines = (logs: ReadonlyArray<string>) =>
  logs.filter((l) => l.includes("engine metrics scrape")).map((l) => l.replace(/;.*\(/, " ("))

/** Runs `effect` in a fiber and lets everything runnable run, the clock standing still: it must be done by then. */
const atOnce = <A>(what: string, effect: Effect.Effect<A>) =>
  Effect.gen(function* () {
    const fiber: Fiber.Fiber<A> = yield* Effect.forkChild(effect)
    yield* settle(
      `${what} answers with the clock standing still`,
      Effect.sync(() => fiber.pollUnsafe() !== undefined)
    )
    const exit = fiber.pollUnsafe()!
    if (exit._tag === "Failure") return yield* Effect.die(new Error(`${what} failed`))
    return exit.value
  })

describe("engine load sampler", () => {
  it("bounds: 0.9 of a heartbeat per scrape (at most 10 s), three heartbeats of age", () => {
    assert.strictEqual(scrapeTimeoutMs(1_000), 900)
    assert.strictEqual(scrapeTimeoutMs(100), 90)
    assert.strictEqual(scrapeTimeoutMs(5_000), 4_500)
    assert.strictEqual(scrapeTimeoutMs(60_000), 10_000)
    assert.strictEqual(maxAgeMs(5_000), 15_000)
  })

  it.effect("NodeHealth and /metrics answer at once while the engine's /metrics hangs; a sample ages out", () => {
    const { engine, logs, layer } = makeEngine()
    return Effect.gen(function* () {
      const status = yield* NodeStatus
      const metrics = yield* Metrics
      const control = yield* EngineProcessControl
      const load = Effect.map(status.snapshot, (h) => h.load!)

      // Ready at t=0: sampled at once (a new Ready period), not a heartbeat later
      yield* control.set(State.Ready({ since: 0, run: 0 }))
      yield* settle(
        "the first sample shown",
        Effect.map(load, (l) => l.kvUsage === 0.25)
      )
      assert.deepInclude(yield* atOnce("snapshot", load), { engineRunning: 3, engineWaiting: 1, kvUsage: 0.25 })
      assert.strictEqual(engine.scrapes, 1)

      // the engine hangs: the scrape of t=1000 never answers, and readers do not wait for it
      engine.mode = "hang"
      yield* TestClock.adjust(HEARTBEAT_MS)
      const during = yield* atOnce("snapshot during a hung scrape", load)
      assert.deepInclude(during, { engineRunning: 3, kvUsage: 0.25 }, "the last sample (1 s old) is still shown")
      const body = (yield* atOnce("/metrics during a hung scrape", metrics.render)).body
      assert.include(body, "cgn_agent_engine_kv_cache_usage_ratio 0.25")
      // the engine's own running count (3), not the agent's in-flight count (no call here)
      assert.match(body, /^cgn_agent_engine_running_requests 3$/m)
      assert.strictEqual(engine.scrapes, 2, "the scrape at t=1000, made by the sampler")

      // 0.9 of a heartbeat later the scrape is given up: its request interrupted, nothing piles up
      yield* TestClock.adjust(scrapeTimeoutMs(HEARTBEAT_MS))
      yield* settle(
        "the hung scrape interrupted",
        Effect.sync(() => engine.interrupted === 1)
      )

      // t=3000: the sample (t=0) is three heartbeats old, still shown; 1 ms later it is not
      yield* TestClock.adjust(3 * HEARTBEAT_MS - scrapeTimeoutMs(HEARTBEAT_MS) - HEARTBEAT_MS)
      yield* settle(
        "the scrape at t=3000",
        Effect.sync(() => engine.scrapes === 4)
      )
      assert.strictEqual(engine.interrupted, 2, "one scrape in flight at a time")
      assert.strictEqual((yield* atOnce("snapshot", load)).kvUsage, 0.25)
      yield* TestClock.adjust(1)
      // no sample: as for an engine that reports none (running falls back to the agent's in-flight count)
      assert.deepInclude(yield* atOnce("snapshot", load), { engineRunning: 0, engineWaiting: 0, kvUsage: -1 })
      const stale = (yield* atOnce("/metrics", metrics.render)).body
      assert.notMatch(stale, /^cgn_agent_engine_kv_cache_usage_ratio /m)
      // unknown is not 0: no waiting sample either (it read 0 before, like an idle engine)
      assert.notMatch(stale, /^cgn_agent_engine_waiting_requests /m)
      assert.match(stale, /^cgn_agent_engine_running_requests 0$/m, "the agent's in-flight count, as the proto says")

      // the engine refuses, then answers again: shown again from the next heartbeat's sample
      engine.mode = "fail"
      yield* TestClock.adjust(HEARTBEAT_MS - 1)
      yield* settle(
        "the refused scrape",
        Effect.sync(() => engine.scrapes === 5)
      )
      assert.strictEqual((yield* atOnce("snapshot", load)).kvUsage, -1)
      engine.mode = "ok"
      yield* TestClock.adjust(HEARTBEAT_MS)
      yield* settle(
        "the scrape at t=5000",
        Effect.sync(() => engine.scrapes === 6)
      )
      assert.strictEqual((yield* atOnce("snapshot", load)).kvUsage, 0.25)

      // a restarted engine's Ready period shows none of the last run's sample, and is sampled at once
      engine.mode = "hang"
      yield* control.set(State.Ready({ since: 5_000, run: 1 }))
      assert.strictEqual((yield* atOnce("snapshot", load)).kvUsage, -1)
      yield* settle(
        "the new Ready period sampled",
        Effect.sync(() => engine.scrapes === 7)
      )

      // each kind once per failing spell (three timeouts, one line); one good scrape does not end the spell
      assert.deepStrictEqual(scrapeLines(logs), [
        "Warn engine metrics scrape failed (no answer within 900 ms)",
        "Warn engine metrics scrape failed (connect ECONNREFUSED 127.0.0.1:8000)"
      ])
    }).pipe(Effect.provide(layer))
  })

  it.effect("a /metrics slower than half a heartbeat, under 0.9 of one, is shown, not cut off", () => {
    const { engine, layer } = makeEngine()
    return Effect.gen(function* () {
      const status = yield* NodeStatus
      engine.mode = "slow"
      engine.slowMs = 800
      yield* (yield* EngineProcessControl).set(State.Ready({ since: 0, run: 0 }))
      yield* settle(
        "the slow scrape started",
        Effect.sync(() => engine.scrapes === 1)
      )
      yield* TestClock.adjust(engine.slowMs)
      yield* settle(
        "the slow scrape's sample shown",
        Effect.map(status.snapshot, (h) => h.load?.kvUsage === 0.25)
      )
      assert.strictEqual(engine.interrupted, 0)
    }).pipe(Effect.provide(layer))
  })

  it.effect("a flapping engine and a varying error text log O(1) lines; the recovery once, after it holds", () => {
    const { engine, logs, layer } = makeEngine()
    return Effect.gen(function* () {
      yield* (yield* EngineProcessControl).set(State.Ready({ since: 0, run: 0 }))
      yield* settle(
        "the first scrape",
        Effect.sync(() => engine.scrapes === 1)
      )
      const heartbeatWith = (mode: typeof engine.mode) =>
        Effect.gen(function* () {
          const before = engine.scrapes
          engine.mode = mode
          yield* TestClock.adjust(HEARTBEAT_MS)
          yield* settle(
            `the scrape after ${before}`,
            Effect.sync(() => engine.scrapes === before + 1)
          )
        })
      // 40 heartbeats alternating refused / answered: one warning, no recovery (it never holds)
      for (let i = 0; i < 40; i++) yield* heartbeatWith(i % 2 === 0 ? "fail" : "ok")
      // 20 heartbeats of 503s, each body with its own request id: one line for the kind, not one per body
      for (let i = 0; i < 20; i++) yield* heartbeatWith(i % 3 === 2 ? "ok" : "503")
      assert.deepStrictEqual(scrapeLines(logs), [
        "Warn engine metrics scrape failed (connect ECONNREFUSED 127.0.0.1:8000)",
        'Warn engine metrics scrape failed (HTTP 503: {"request_id":"r42"})'
      ])
      // answered RECOVERED_AFTER times in a row: the spell ends, logged once
      for (let i = 0; i < RECOVERED_AFTER + 5; i++) yield* heartbeatWith("ok")
      assert.strictEqual(scrapeLines(logs).length, 3)
      assert.strictEqual(scrapeLines(logs)[2], "Info engine metrics scrape answers again")
      // a new spell logs its kind again
      yield* heartbeatWith("fail")
      assert.strictEqual(scrapeLines(logs).length, 4)
    }).pipe(Effect.provide(layer))
  })

  it.effect("an engine failing with a new HTTP status each scrape logs at most 8 kinds per spell", () => {
    const { engine, logs, layer } = makeEngine()
    return Effect.gen(function* () {
      engine.mode = "status-per-scrape"
      yield* (yield* EngineProcessControl).set(State.Ready({ since: 0, run: 0 }))
      // 12 scrapes in one failing spell, each a kind never seen before (HTTP 501 ... HTTP 512)
      for (let n = 1; n <= 12; n++) {
        yield* settle(
          `scrape ${n}`,
          Effect.sync(() => engine.scrapes === n)
        )
        if (n < 12) yield* TestClock.adjust(HEARTBEAT_MS)
      }
      // the set of kinds logged stays bounded whatever the engine answers (engineLoad.ts MAX_KINDS)
      assert.deepStrictEqual(
        scrapeLines(logs),
        Array.from({ length: 8 }, (_, i) => `Warn engine metrics scrape failed (HTTP ${501 + i})`)
      )
    }).pipe(Effect.provide(layer))
  })
})
