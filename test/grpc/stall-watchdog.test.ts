// The stall watchdog (layers/grpc/StallWatchdog.ts) on a TestClock, over relays of its own making: a stream that
// sends nothing for engine.stream_idle_timeout is aborted and reported stalled; the stall is cleared only by a call
// that completes, not by streams that move: an engine that stalls every stream after a few tokens moves each new
// one, and every call on it still fails (it read healthy between stalls). Stalled with no call in flight, the
// watchdog asks the engine for a test completion (layers/engine/stallProbe.ts), which clears the stall when it
// completes.
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Layer, Result, Stream } from "effect"
import { TestClock } from "effect/testing"
import { decodeConfigObject, layerFromObject } from "../../src/layers/config/Config.ts"
import { engineFor } from "../../src/layers/engine/backends/index.ts"
import * as EngineStallLive from "../../src/layers/engine/EngineStall.ts"
import { PROBE_TOKENS } from "../../src/layers/engine/probeShape.ts"
import { ActiveCalls } from "../../src/layers/grpc/ActiveCalls.ts"
import { Relay } from "../../src/layers/grpc/Relay.ts"
import * as StallWatchdog from "../../src/layers/grpc/StallWatchdog.ts"
import type { Config, ConfigError } from "../../src/services/config/Config.ts"
import type { MetricNames } from "../../src/services/engine/Engine.ts"
import { EngineClient, EngineError, type JsonObject } from "../../src/services/engine/EngineClient.ts"
import { EngineStall, noStall, stallProblem } from "../../src/services/engine/EngineStall.ts"
import { State } from "../../src/services/engine/EngineState.ts"
import { loadSignals } from "../../src/services/engine/PromText.ts"
import { EngineStalled, StreamAborted } from "../../src/services/grpc/CallErrors.ts"
import * as EngineTest from "../../src/testing/EngineProcess.ts"

const IDLE_MS = 800 // the watchdog ticks every idle / 8 = 100 ms

const config = layerFromObject({ models: { m: { hf_repo: "org/m" } }, engine: { stream_idle_timeout: `${IDLE_MS}ms` } })
const layer = Layer.mergeAll(
  config,
  EngineStallLive.layer.pipe(Layer.provide(EngineTest.layerTest()), Layer.provide(config))
)

/** A relay streaming from the engine, as GenerateCall starts one; `aborted` says whether the watchdog ended it. */
const streaming = (active: ActiveCalls) => {
  const relay = new Relay(1024)
  relay.streamRequested(0)
  const state = { aborted: false }
  relay.interrupt = () => {
    state.aborted = true
  }
  active.add(relay)
  return { relay, state }
}

const stalledFailure = new EngineStalled({ idleTimeout: "800ms" })

/** The stream read a chunk from the engine. */
const read = (relay: Relay) => {
  relay.reads++
}

const problem = Effect.map(
  Effect.flatMap(EngineStall, (s) => s.state),
  (s) => stallProblem(s, "800ms")
)

describe("the stall watchdog", () => {
  it.effect("a stall holds while streams only move, and clears when a call completes", () =>
    Effect.gen(function* () {
      const active = new ActiveCalls()
      yield* StallWatchdog.fork(active)
      const first = streaming(active)
      read(first.relay)
      yield* TestClock.adjust(IDLE_MS + 200)
      assert.isTrue(first.state.aborted, "the idle stream is aborted")
      first.relay.abort(stalledFailure)
      first.relay.finish(Exit.interrupt())
      active.delete(first.relay)
      assert.match((yield* problem) ?? "", /^engine stalled: 1 stream\(s\)/)

      // the next stream moves (a few tokens) and stalls in turn: the node never reads healthy in between
      const second = streaming(active)
      for (let i = 0; i < 5; i++) {
        read(second.relay)
        yield* TestClock.adjust(100)
        assert.isDefined(yield* problem, `still stalled while the stream moves (tick ${i})`)
      }
      yield* TestClock.adjust(IDLE_MS + 200)
      assert.isTrue(second.state.aborted)
      active.delete(second.relay)
      assert.match((yield* problem) ?? "", /^engine stalled: 2 stream\(s\)/)

      // a call that completes (its engine stream ended as the engine ends one) clears it at the next tick
      const third = streaming(active)
      read(third.relay)
      third.relay.finish(Exit.succeed(undefined))
      active.delete(third.relay)
      yield* TestClock.adjust(100)
      assert.isUndefined(yield* problem)
    }).pipe(Effect.scoped, Effect.provide(layer))
  )

  it.effect("a call the caller cancelled does not clear a stall", () =>
    Effect.gen(function* () {
      const active = new ActiveCalls()
      yield* StallWatchdog.fork(active)
      const first = streaming(active)
      yield* TestClock.adjust(IDLE_MS + 200)
      active.delete(first.relay)
      const cancelled = streaming(active)
      read(cancelled.relay)
      cancelled.relay.finish(Exit.interrupt())
      active.delete(cancelled.relay)
      // nor does one the engine broke off (a truncated stream)
      const broken = streaming(active)
      read(broken.relay)
      broken.relay.finish(Exit.fail(new StreamAborted({ reason: "stream truncated" })))
      active.delete(broken.relay)
      yield* TestClock.adjust(200)
      assert.isDefined(yield* problem)
    }).pipe(Effect.scoped, Effect.provide(layer))
  )

  // README engine.stream_idle_timeout: "A streaming engine call that sends nothing for this long (while the caller
  // is not the one holding it back) ends with UNAVAILABLE": a stream whose producer is paused on a full relay is
  // the caller's doing, however long it lasts (agent.client_send_timeout, not this watchdog, ends that one).
  it.effect("a stream the caller holds back (its producer paused on a full relay) is never taken as stalled", () =>
    Effect.gen(function* () {
      const active = new ActiveCalls()
      yield* StallWatchdog.fork(active)
      const held = streaming(active)
      const accepted = held.relay.onChunks([{ choices: [{ index: 0, text: "y".repeat(2000) }] }], () => undefined)
      assert.isFalse(accepted, "past maxPendingChars the producer is asked to wait")
      assert.isTrue(held.relay.paused)
      yield* TestClock.adjust(3 * IDLE_MS)
      assert.isFalse(held.state.aborted, "not aborted by the watchdog")
      assert.isUndefined(yield* problem, "the engine is not taken as stalled")
    }).pipe(Effect.scoped, Effect.provide(layer))
  )

  /**
   * An engine client whose whole answers the test scripts: each request recorded (its path in `paths`), answered by
   * `answer`, or 404 on a path in `missing` (a server without that endpoint).
   */
  const probed = (
    base: Layer.Layer<Config | EngineStall, ConfigError> = layer,
    /** The rank the engine runs a request on: vLLM's, the header's (the client's dataParallelRank option). */
    rankOf: (body: JsonObject, options?: { readonly dataParallelRank?: number }) => unknown = (_, o) =>
      o?.dataParallelRank
  ) => {
    const requests: Array<JsonObject> = []
    const paths: Array<string> = []
    const engine = {
      answer: "ok" as "ok" | "fail" | "hang",
      missing: [] as Array<string>,
      failRoom: undefined as number | undefined,
      /** A data-parallel rank that never answers (where `rankOf` runs the request). */
      hangRank: undefined as number | undefined,
      /** A data-parallel rank that answers HTTP 500 at once. */
      failRank: undefined as number | undefined
    }
    const ranks: Array<number | undefined> = []
    const client = EngineClient.of({
      streamTo: (path, body, options, sink) =>
        Effect.suspend(() => {
          requests.push(body)
          paths.push(path)
          ranks.push(options?.dataParallelRank)
          if (engine.missing.includes(path))
            return Effect.fail(new EngineError({ reason: "Http", message: "HTTP 404", status: 404 }))
          if (engine.answer === "hang" || (engine.hangRank !== undefined && rankOf(body, options) === engine.hangRank))
            return Effect.never
          if (
            engine.answer === "fail" ||
            (engine.failRoom !== undefined && body.bootstrap_room === engine.failRoom) ||
            (engine.failRank !== undefined && options?.dataParallelRank === engine.failRank)
          )
            return Effect.fail(new EngineError({ reason: "Http", message: "HTTP 500" }))
          sink.onChunks([{ choices: [{ text: "pong", finish_reason: "length" }] }], () => undefined)
          return Effect.void
        }),
      load: Effect.succeed({ running: undefined, waiting: undefined, kvUsage: undefined })
    })
    return { requests, paths, ranks, engine, layer: Layer.merge(base, Layer.succeed(EngineClient, client)) }
  }

  it.effect("stalled and idle: a test completion that fails leaves the stall, one that completes clears it", () => {
    const p = probed()
    return Effect.gen(function* () {
      const active = new ActiveCalls()
      yield* StallWatchdog.fork(active)
      p.engine.answer = "fail"
      const first = streaming(active)
      yield* TestClock.adjust(IDLE_MS + 200)
      assert.isTrue(first.state.aborted)
      // while the stalled call is still in flight: no probe
      assert.strictEqual(p.requests.length, 0)
      active.delete(first.relay)
      yield* TestClock.adjust(100)
      // vLLM (the config's engine) takes ignore_eos: the model cannot end the test early
      assert.deepStrictEqual(p.requests, [
        { prompt: "ping", max_tokens: PROBE_TOKENS, temperature: 0, ignore_eos: true }
      ])
      assert.isDefined(yield* problem, "a failed probe leaves the stall")
      // the next one an idle timeout later, not at every tick
      yield* TestClock.adjust(IDLE_MS - 200)
      assert.strictEqual(p.requests.length, 1)
      p.engine.answer = "ok"
      yield* TestClock.adjust(200)
      assert.strictEqual(p.requests.length, 2)
      assert.isUndefined(yield* problem, "a completed probe clears it")
      // not stalled: no more probes
      yield* TestClock.adjust(3 * IDLE_MS)
      assert.strictEqual(p.requests.length, 2)
    }).pipe(Effect.scoped, Effect.provide(p.layer))
  })

  it.effect(
    "a server without /v1/completions (chat only) is asked on /v1/chat/completions, kept once it completed there",
    () => {
      const p = probed()
      return Effect.gen(function* () {
        const active = new ActiveCalls()
        yield* StallWatchdog.fork(active)
        const stallOnce = Effect.gen(function* () {
          const s = streaming(active)
          yield* TestClock.adjust(IDLE_MS + 200)
          active.delete(s.relay)
        })
        p.engine.missing = ["/v1/completions"]
        p.engine.answer = "fail"
        yield* stallOnce
        yield* TestClock.adjust(100)
        assert.deepStrictEqual(p.paths, ["/v1/completions", "/v1/chat/completions"])
        assert.deepStrictEqual(p.requests[1], {
          messages: [{ role: "user", content: "ping" }],
          max_tokens: PROBE_TOKENS,
          temperature: 0,
          ignore_eos: true
        })
        assert.isDefined(yield* problem, "the chat answer failed too")
        // it never completed on chat: the next probe starts on /v1/completions again (a stray 404 moves nothing)
        p.engine.answer = "ok"
        yield* TestClock.adjust(IDLE_MS)
        assert.deepStrictEqual(p.paths.slice(2), ["/v1/completions", "/v1/chat/completions"])
        assert.isUndefined(yield* problem)
        // completed there: the probes of the next stall go to chat alone
        yield* stallOnce
        yield* TestClock.adjust(100)
        assert.deepStrictEqual(p.paths.slice(4), ["/v1/chat/completions"])
      }).pipe(Effect.scoped, Effect.provide(p.layer))
    }
  )

  it.effect("a stall in a tick in which a call completed is not noted (it logged unhealthy and clear at once)", () =>
    Effect.gen(function* () {
      const noted: Array<string> = []
      const recording = EngineStall.of({
        stalled: () => Effect.sync(() => void noted.push("stalled")),
        completed: () => Effect.sync(() => void noted.push("completed")),
        testFailed: () => Effect.void,
        callsFailed: () => Effect.void,
        rankMoved: () => Effect.succeed(false),
        moved: () => Effect.void,
        scraped: () => Effect.void,
        state: Effect.succeed(noStall),
        changes: Stream.empty
      })
      yield* Effect.gen(function* () {
        const active = new ActiveCalls()
        yield* StallWatchdog.fork(active)
        const stuck = streaming(active)
        yield* TestClock.adjust(IDLE_MS - 50)
        active.completed++
        yield* TestClock.adjust(100)
        assert.isTrue(stuck.state.aborted, "the stream is still ended")
        assert.deepStrictEqual(noted, ["completed"])
      }).pipe(Effect.scoped, Effect.provide(Layer.merge(config, Layer.succeed(EngineStall, recording))))
    })
  )

  it.effect("each tick tells EngineStall when the oldest stream that read something was requested", () =>
    Effect.gen(function* () {
      const moves: Array<readonly [number, number]> = []
      const recording = EngineStall.of({
        stalled: () => Effect.void,
        completed: () => Effect.void,
        testFailed: () => Effect.void,
        callsFailed: () => Effect.void,
        rankMoved: () => Effect.succeed(false),
        moved: (now, oldestSince) => Effect.sync(() => void moves.push([now, oldestSince])),
        scraped: () => Effect.void,
        state: Effect.succeed(noStall),
        changes: Stream.empty
      })
      yield* Effect.gen(function* () {
        const active = new ActiveCalls()
        yield* StallWatchdog.fork(active)
        const [a, b, c] = [streaming(active), streaming(active), streaming(active)]
        a.relay.watch.since = 100
        b.relay.watch.since = 50
        c.relay.watch.since = 10 // older, but it reads nothing
        read(a.relay)
        read(b.relay)
        yield* TestClock.adjust(100)
        assert.deepStrictEqual(moves, [[0, 50]], "the first tick, at the watchdog's start")
        // nothing read since: nothing told
        yield* TestClock.adjust(100)
        assert.strictEqual(moves.length, 1)
      }).pipe(Effect.scoped, Effect.provide(Layer.merge(config, Layer.succeed(EngineStall, recording))))
    })
  )

  it.effect("an SGLang prefill node with dp 2: a probe per rank, and a rank that fails leaves the stall", () => {
    const sglang = layerFromObject({
      agent: { role: "prefill" },
      engine: { kind: "sglang", stream_idle_timeout: `${IDLE_MS}ms` },
      models: { m: { hf_repo: "org/m", dp: 2 } }
    })
    const p = probed(
      Layer.mergeAll(sglang, EngineStallLive.layer.pipe(Layer.provide(EngineTest.layerTest()), Layer.provide(sglang)))
    )
    return Effect.gen(function* () {
      const active = new ActiveCalls()
      yield* StallWatchdog.fork(active)
      p.engine.failRoom = 1 // rank 1 wedged, rank 0 fine
      const first = streaming(active)
      yield* TestClock.adjust(IDLE_MS + 200)
      active.delete(first.relay)
      yield* TestClock.adjust(100)
      assert.deepStrictEqual(
        p.requests.map((r) => r.bootstrap_room),
        [0, 1]
      )
      assert.isDefined(yield* problem, "rank 0 answering does not clear it")
      p.engine.failRoom = undefined
      yield* TestClock.adjust(IDLE_MS)
      assert.strictEqual(p.requests.length, 4)
      assert.isUndefined(yield* problem)
    }).pipe(Effect.scoped, Effect.provide(p.layer))
  })

  it.effect("no test request while the engine is not Ready (being stopped or restarted)", () => {
    const engine = EngineTest.layerTest({
      initial: State.Unhealthy({ reason: "restart requested: x", since: 0, run: 0 })
    })
    const p = probed()
    return Effect.gen(function* () {
      const active = new ActiveCalls()
      yield* StallWatchdog.fork(active)
      const first = streaming(active)
      yield* TestClock.adjust(IDLE_MS + 200)
      active.delete(first.relay)
      yield* TestClock.adjust(2 * IDLE_MS)
      assert.strictEqual(p.requests.length, 0, "none while Unhealthy")
      yield* Effect.flatMap(EngineTest.EngineProcessControl, (c) => c.set(State.Ready({ since: 0, run: 0 })))
      yield* TestClock.adjust(IDLE_MS)
      assert.strictEqual(p.requests.length, 1, "asked once Ready")
    }).pipe(Effect.scoped, Effect.provide(Layer.merge(p.layer, engine)))
  })

  describe("an engine with no call for engine.idle_probe_after", () => {
    const quiet = layerFromObject({
      models: { m: { hf_repo: "org/m" } },
      engine: { stream_idle_timeout: `${IDLE_MS}ms`, idle_probe_after: "2s" }
    })
    const quietLayer = Layer.mergeAll(
      quiet,
      EngineStallLive.layer.pipe(Layer.provide(EngineTest.layerTest()), Layer.provide(quiet))
    )

    it.effect("is sent a test completion; one that gets no answer takes it as stalled, until one completes", () => {
      const p = probed(quietLayer)
      return Effect.gen(function* () {
        const active = new ActiveCalls()
        yield* StallWatchdog.fork(active)
        yield* TestClock.adjust(1900)
        assert.strictEqual(p.requests.length, 0, "not before idle_probe_after")
        yield* TestClock.adjust(200)
        assert.deepStrictEqual(p.requests, [
          { prompt: "ping", max_tokens: PROBE_TOKENS, temperature: 0, ignore_eos: true }
        ])
        assert.isUndefined(yield* problem, "it completed: not stalled")
        // the next one idle_probe_after later
        yield* TestClock.adjust(1800)
        assert.strictEqual(p.requests.length, 1)
        p.engine.answer = "hang"
        yield* TestClock.adjust(300)
        assert.strictEqual(p.requests.length, 2)
        assert.isUndefined(yield* problem, "not before stream_idle_timeout without an answer")
        yield* TestClock.adjust(IDLE_MS)
        assert.strictEqual(
          yield* problem,
          "engine stalled: a test completion sent after 2s without calls (engine.idle_probe_after) got no answer within 800ms (engine.stream_idle_timeout)"
        )
        // stalled and idle: the stall's own probe follows, one per idle timeout start to start, and the first that
        // completes clears it
        assert.strictEqual(p.requests.length, 3)
        yield* TestClock.adjust(IDLE_MS)
        assert.strictEqual(p.requests.length, 4)
        assert.isDefined(yield* problem)
        p.engine.answer = "ok"
        yield* TestClock.adjust(IDLE_MS)
        assert.strictEqual(p.requests.length, 5)
        assert.isUndefined(yield* problem)
      }).pipe(Effect.scoped, Effect.provide(p.layer))
    })

    it.effect("a test that the end of the engine run cut short is no wedge", () => {
      const engine = EngineTest.layerTest({ initial: State.Ready({ since: 0, run: 0 }) })
      const p = probed(quietLayer)
      return Effect.gen(function* () {
        yield* StallWatchdog.fork(new ActiveCalls())
        p.engine.answer = "hang"
        yield* TestClock.adjust(2100)
        assert.strictEqual(p.requests.length, 1)
        // the run is being restarted while the test waits: its missing answer says nothing of the engine
        yield* Effect.flatMap(EngineTest.EngineProcessControl, (c) =>
          c.set(State.Unhealthy({ reason: "restart requested: x", since: 0, run: 0 }))
        )
        yield* TestClock.adjust(IDLE_MS)
        assert.isUndefined(yield* problem)
      }).pipe(Effect.scoped, Effect.provide(Layer.merge(p.layer, engine)))
    })

    it.effect("an error the engine answers with is not a wedge, and calls in flight put the test off", () => {
      const p = probed(quietLayer)
      return Effect.gen(function* () {
        const active = new ActiveCalls()
        yield* StallWatchdog.fork(active)
        p.engine.answer = "fail"
        yield* TestClock.adjust(2100)
        assert.strictEqual(p.requests.length, 1)
        yield* TestClock.adjust(IDLE_MS)
        assert.isUndefined(yield* problem, "an HTTP 500 is an answer")
        // a call in flight from here on: no test while it lasts, nor until idle_probe_after after it
        const call = streaming(active)
        const reading = Effect.sync(() => read(call.relay))
        for (let i = 0; i < 30; i++) yield* Effect.andThen(reading, TestClock.adjust(100))
        assert.strictEqual(p.requests.length, 1, "none while a call is in flight")
        active.delete(call.relay)
        yield* TestClock.adjust(1900)
        assert.strictEqual(p.requests.length, 1)
        yield* TestClock.adjust(200)
        assert.strictEqual(p.requests.length, 2)
      }).pipe(Effect.scoped, Effect.provide(p.layer))
    })

    // engineWatch.ts quietSince: a call that begins and completes between two ticks (shorter than a tick, never
    // seen in flight) is a call all the same; idle_probe_after counts from it, else an engine serving short calls was
    // sent an "idle" test every idle_probe_after.
    it.effect("a call that completed between two ticks puts the test off idle_probe_after from it", () => {
      const p = probed(quietLayer)
      return Effect.gen(function* () {
        const active = new ActiveCalls()
        yield* StallWatchdog.fork(active)
        yield* TestClock.adjust(1550)
        const call = streaming(active)
        read(call.relay)
        call.relay.finish(Exit.succeed(undefined))
        active.delete(call.relay)
        yield* TestClock.adjust(1900)
        assert.strictEqual(p.requests.length, 0, "none within idle_probe_after of the call")
        yield* TestClock.adjust(300)
        assert.strictEqual(p.requests.length, 1)
      }).pipe(Effect.scoped, Effect.provide(p.layer))
    })

    it.effect('"0s" sends none, nor does the default before its two minutes', () => {
      const off = layerFromObject({
        models: { m: { hf_repo: "org/m" } },
        engine: { stream_idle_timeout: `${IDLE_MS}ms`, idle_probe_after: "0s" }
      })
      const none = probed(
        Layer.mergeAll(off, EngineStallLive.layer.pipe(Layer.provide(EngineTest.layerTest()), Layer.provide(off)))
      )
      const byDefault = probed()
      return Effect.gen(function* () {
        yield* Effect.gen(function* () {
          yield* StallWatchdog.fork(new ActiveCalls())
          yield* TestClock.adjust(600_000)
          assert.strictEqual(none.requests.length, 0)
        }).pipe(Effect.scoped, Effect.provide(none.layer))
        yield* Effect.gen(function* () {
          yield* StallWatchdog.fork(new ActiveCalls())
          yield* TestClock.adjust(119_900)
          assert.strictEqual(byDefault.requests.length, 0)
          yield* TestClock.adjust(200)
          assert.strictEqual(byDefault.requests.length, 1)
        }).pipe(Effect.scoped, Effect.provide(byDefault.layer))
      })
    })
  })

  describe("vLLM with two data-parallel ranks (a dense model's ranks are independent: one can hang alone)", () => {
    const dp2 = layerFromObject({
      models: { m: { hf_repo: "org/m", dp: 2 } },
      engine: { stream_idle_timeout: `${IDLE_MS}ms`, idle_probe_after: "2s" }
    })
    const dp2Layer = Layer.mergeAll(
      dp2,
      EngineStallLive.layer.pipe(Layer.provide(EngineTest.layerTest()), Layer.provide(dp2))
    )

    it.effect(
      "a stream that stalls while calls are in flight has each rank tested; the hung one keeps the node stalled",
      () => {
        const p = probed(dp2Layer)
        return Effect.gen(function* () {
          const active = new ActiveCalls()
          yield* StallWatchdog.fork(active)
          p.engine.hangRank = 1
          const stuck = streaming(active)
          const other = streaming(active)
          const reading = Effect.sync(() => read(other.relay))
          for (let i = 0; i < 10; i++) yield* Effect.andThen(reading, TestClock.adjust(100))
          assert.isTrue(stuck.state.aborted)
          // tested at once, the other call still in flight: one request per rank, pinned by the header
          assert.deepStrictEqual(p.ranks, [0, 1])
          // a call that another rank completes ends the stream's stall, not the rank's test
          active.delete(stuck.relay)
          active.completed++
          for (let i = 0; i < 8; i++) yield* Effect.andThen(reading, TestClock.adjust(100))
          assert.strictEqual(
            yield* problem,
            "engine stalled: a test completion sent after a stream stalled got no answer from data-parallel rank 1 within 800ms (engine.stream_idle_timeout)"
          )
          active.completed++
          yield* Effect.andThen(reading, TestClock.adjust(100))
          assert.isDefined(yield* problem, "calls rank 0 completes do not clear it")
          // the node out of traffic: its calls end, the stall's test goes to both ranks, and clears it once both answer
          active.delete(other.relay)
          p.engine.hangRank = undefined
          yield* TestClock.adjust(IDLE_MS)
          assert.deepStrictEqual(p.ranks.slice(-2), [0, 1])
          assert.isUndefined(yield* problem)
        }).pipe(Effect.scoped, Effect.provide(p.layer))
      }
    )

    // engineWatch.ts rankTestOwed: a stall while the last test is too recent to send another (one per
    // stream_idle_timeout, start to start) is tested once the probe may go, not forgotten: the rank its stream was on
    // may be the one that hangs.
    it.effect("a second stream that stalls within stream_idle_timeout of the ranks' test has them tested again", () => {
      const p = probed(dp2Layer)
      return Effect.gen(function* () {
        const active = new ActiveCalls()
        yield* StallWatchdog.fork(active)
        const first = streaming(active)
        const other = streaming(active)
        const reading = Effect.sync(() => read(other.relay))
        for (let i = 0; i < 3; i++) yield* Effect.andThen(reading, TestClock.adjust(100))
        // requested now (streaming() dates its stream at 0)
        const second = { relay: new Relay(1024), state: { aborted: false } }
        second.relay.streamRequested(300)
        second.relay.interrupt = () => {
          second.state.aborted = true
        }
        active.add(second.relay)
        for (let i = 0; i < 7; i++) yield* Effect.andThen(reading, TestClock.adjust(100))
        assert.isTrue(first.state.aborted)
        assert.deepStrictEqual(p.ranks, [0, 1])
        active.delete(first.relay)
        for (let i = 0; i < 4; i++) yield* Effect.andThen(reading, TestClock.adjust(100))
        assert.isTrue(second.state.aborted)
        active.delete(second.relay)
        assert.deepStrictEqual(p.ranks, [0, 1], "not yet: the last test began under stream_idle_timeout ago")
        for (let i = 0; i < 6; i++) yield* Effect.andThen(reading, TestClock.adjust(100))
        assert.deepStrictEqual(p.ranks, [0, 1, 0, 1])
      }).pipe(Effect.scoped, Effect.provide(p.layer))
    })

    // engineWatch.ts: a run that ends takes its streams' stalls with it, the ranks' test owed for them too: the next
    // run's calls are not followed by a test for a stall of the run before.
    it.effect("a ranks' test owed when the run ends is not sent on the next run", () => {
      const p = probed(dp2Layer)
      const engine = EngineTest.layerTest({ initial: State.Ready({ since: 0, run: 0 }) })
      return Effect.gen(function* () {
        const control = yield* EngineTest.EngineProcessControl
        const active = new ActiveCalls()
        yield* StallWatchdog.fork(active)
        const first = streaming(active)
        const other = streaming(active)
        const reading = Effect.sync(() => read(other.relay))
        for (let i = 0; i < 3; i++) yield* Effect.andThen(reading, TestClock.adjust(100))
        const second = { relay: new Relay(1024), state: { aborted: false } }
        second.relay.streamRequested(300)
        second.relay.interrupt = () => {
          second.state.aborted = true
        }
        active.add(second.relay)
        for (let i = 0; i < 7; i++) yield* Effect.andThen(reading, TestClock.adjust(100))
        assert.deepStrictEqual(p.ranks, [0, 1])
        active.delete(first.relay)
        for (let i = 0; i < 4; i++) yield* Effect.andThen(reading, TestClock.adjust(100))
        assert.isTrue(second.state.aborted, "the second stream stalled within the last test's stream_idle_timeout")
        // the run ends (its calls with it) before the probe may go again
        active.delete(second.relay)
        active.delete(other.relay)
        yield* control.set(State.Unhealthy({ reason: "restart requested: x", since: 1400, run: 0 }))
        yield* TestClock.adjust(100)
        yield* control.set(State.Ready({ since: 1500, run: 1 }))
        // the next run's call, moving: nothing owed from the run before, so no test while it runs
        const next = { relay: new Relay(1024), state: { aborted: false } }
        next.relay.streamRequested(1500)
        active.add(next.relay)
        for (let i = 0; i < 8; i++)
          yield* Effect.andThen(
            Effect.sync(() => read(next.relay)),
            TestClock.adjust(100)
          )
        assert.isFalse(next.state.aborted)
        assert.deepStrictEqual(p.ranks, [0, 1])
      }).pipe(Effect.scoped, Effect.provide(Layer.merge(p.layer, engine)))
    })

    it.effect(
      "stalled with no call: the stall's test goes to each rank, and a rank it finds hung outlasts a call",
      () => {
        const p = probed(dp2Layer)
        return Effect.gen(function* () {
          const active = new ActiveCalls()
          yield* StallWatchdog.fork(active)
          // the ranks' test after the stream stalls: rank 0 answers an error (neither a completion nor a wedge), so
          // the stream's stall stands
          p.engine.failRank = 0
          const stuck = streaming(active)
          yield* TestClock.adjust(IDLE_MS + 100)
          assert.isTrue(stuck.state.aborted)
          assert.deepStrictEqual(p.ranks, [0, 1])
          active.delete(stuck.relay)
          p.engine.failRank = undefined
          p.engine.hangRank = 1
          // stalled with no call: the stall's own test, to both ranks, an idle timeout after the last
          yield* TestClock.adjust(IDLE_MS)
          assert.deepStrictEqual(p.ranks, [0, 1, 0, 1])
          yield* TestClock.adjust(IDLE_MS)
          // the hung rank's reason shows before the streams' (it lasts; theirs comes and goes)
          assert.match((yield* problem) ?? "", /no answer from data-parallel rank 1 within/)
          // a call completes (on rank 0): the streams' stall ends, rank 1's missing answer keeps the node stalled
          active.completed++
          yield* TestClock.adjust(100)
          assert.strictEqual(
            yield* problem,
            "engine stalled: a test completion sent while the engine was stalled with no call got no answer from data-parallel rank 1 within 800ms (engine.stream_idle_timeout)"
          )
        }).pipe(Effect.scoped, Effect.provide(p.layer))
      }
    )

    it.effect(
      "under load, a rank taken as hung is tested again until every rank answers, which clears the stall",
      () => {
        const p = probed(dp2Layer)
        return Effect.gen(function* () {
          const active = new ActiveCalls()
          yield* StallWatchdog.fork(active)
          p.engine.hangRank = 1
          const stuck = streaming(active)
          const other = streaming(active)
          const reading = Effect.sync(() => read(other.relay))
          for (let i = 0; i < 10; i++) yield* Effect.andThen(reading, TestClock.adjust(100))
          active.delete(stuck.relay)
          for (let i = 0; i < 9; i++) yield* Effect.andThen(reading, TestClock.adjust(100))
          // calls rank 0 completes end the stream's stall, not the rank's
          active.completed++
          yield* Effect.andThen(reading, TestClock.adjust(100))
          assert.match((yield* problem) ?? "", /no answer from data-parallel rank 1 within/)
          // the rank comes back while calls keep running (never idle): the next test, every rank answering, clears it
          p.engine.hangRank = undefined
          for (let i = 0; i < 10 && (yield* problem) !== undefined; i++)
            yield* Effect.andThen(reading, TestClock.adjust(100))
          assert.isUndefined(yield* problem)
          assert.deepStrictEqual(p.ranks.slice(-2), [0, 1])
        }).pipe(Effect.scoped, Effect.provide(p.layer))
      }
    )

    it.effect("a silent rank whose own counters moved meanwhile is busy, not hung", () => {
      const p = probed(dp2Layer)
      return Effect.gen(function* () {
        const stall = yield* EngineStall
        const scrape = (at: number, rank1: number) =>
          stall.scraped({ at, counters: {}, held: undefined, inflight: 0, ranks: { "0": 5, "1": rank1 } })
        yield* StallWatchdog.fork(new ActiveCalls())
        yield* TestClock.adjust(100) // the run's start (which forgets the ranks' figures) seen first
        yield* scrape(100, 10)
        p.engine.hangRank = 1
        yield* TestClock.adjust(2000)
        assert.strictEqual(p.ranks.length, 2, "the idle test, at 2000")
        // rank 1's queue holds the test, but its counters move: it works
        yield* scrape(2300, 11)
        yield* TestClock.adjust(IDLE_MS)
        assert.isUndefined(yield* problem, "busy, not hung")
        // the next test: rank 1 silent and still, a hang
        yield* TestClock.adjust(2000)
        yield* scrape(4500, 11)
        yield* TestClock.adjust(IDLE_MS)
        assert.match((yield* problem) ?? "", /no answer from data-parallel rank 1 within/)
      }).pipe(Effect.scoped, Effect.provide(p.layer))
    })

    it.effect("a test no rank answers while calls complete is a queue, not a wedge: nothing noted", () => {
      const p = probed(dp2Layer)
      return Effect.gen(function* () {
        const active = new ActiveCalls()
        yield* StallWatchdog.fork(active)
        p.engine.answer = "hang" // both ranks' queues hold the test
        const stuck = streaming(active)
        const other = streaming(active)
        const reading = Effect.sync(() => read(other.relay))
        for (let i = 0; i < 10; i++) yield* Effect.andThen(reading, TestClock.adjust(100))
        assert.isTrue(stuck.state.aborted)
        assert.strictEqual(p.ranks.length, 2, "the ranks' test, after the stream stalled")
        active.delete(stuck.relay)
        // a call completes while the test waits (the queue moves), after the stream's stall was noted
        yield* Effect.andThen(reading, TestClock.adjust(100))
        active.completed++
        for (let i = 0; i < 8; i++) yield* Effect.andThen(reading, TestClock.adjust(100))
        assert.isUndefined(yield* problem)
      }).pipe(Effect.scoped, Effect.provide(p.layer))
    })

    it.effect("a test that no rank answers is the engine's, not a rank's", () => {
      const p = probed(dp2Layer)
      return Effect.gen(function* () {
        yield* StallWatchdog.fork(new ActiveCalls())
        p.engine.answer = "hang"
        yield* TestClock.adjust(2100 + IDLE_MS)
        assert.strictEqual(
          yield* problem,
          "engine stalled: a test completion sent after 2s without calls (engine.idle_probe_after) got no answer within 800ms (engine.stream_idle_timeout)"
        )
      }).pipe(Effect.scoped, Effect.provide(p.layer))
    })

    it.effect("the idle test goes to each rank: one that does not answer takes the engine as stalled, named", () => {
      const p = probed(dp2Layer)
      return Effect.gen(function* () {
        yield* StallWatchdog.fork(new ActiveCalls())
        p.engine.hangRank = 0
        yield* TestClock.adjust(2100 + IDLE_MS)
        assert.deepStrictEqual(p.ranks.slice(0, 2), [0, 1])
        assert.strictEqual(
          yield* problem,
          "engine stalled: a test completion sent after 2s without calls (engine.idle_probe_after) got no answer from data-parallel rank 0 within 800ms (engine.stream_idle_timeout)"
        )
      }).pipe(Effect.scoped, Effect.provide(p.layer))
    })

    it.effect("one rank that answers an error at once does not hide one that hangs", () => {
      const p = probed(dp2Layer)
      return Effect.gen(function* () {
        yield* StallWatchdog.fork(new ActiveCalls())
        p.engine.failRoom = undefined
        p.engine.hangRank = 1
        p.engine.answer = "ok"
        // rank 0 fails at once (HTTP 500), rank 1 hangs: the hang is what counts
        p.engine.failRank = 0
        yield* TestClock.adjust(2100 + IDLE_MS)
        assert.match((yield* problem) ?? "", /no answer from data-parallel rank 1/)
      }).pipe(Effect.scoped, Effect.provide(p.layer))
    })
  })
  describe.each([
    ["both", "routed_dp_rank"],
    ["prefill", "bootstrap_room"]
  ] as const)("SGLang in role %s with two data-parallel replicas, the test routed by %s", (role, field) => {
    const raw = {
      agent: { role },
      models: { m: { hf_repo: "org/m", dp: 2 } },
      engine: { kind: "sglang", stream_idle_timeout: `${IDLE_MS}ms`, idle_probe_after: "2s" }
    }
    const dp2 = layerFromObject(raw)
    const dp2Layer = Layer.mergeAll(
      dp2,
      EngineStallLive.layer.pipe(Layer.provide(EngineTest.layerTest()), Layer.provide(dp2))
    )
    // the replicas' figures as the agent reads them: SGLang's page through the SGLang backend's metric names
    const decoded = decodeConfigObject(raw, undefined, {})
    if (Result.isFailure(decoded)) throw new Error(decoded.failure.message)
    const names = engineFor("sglang").render(decoded.success).metrics?.names as MetricNames
    const page = (decode1: number) =>
      [0, 1]
        .map((r) => {
          const labels = `model_name="m",engine_type="${role === "both" ? "unified" : role}",tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="${r}"`
          return `sglang:realtime_tokens_total{${labels},mode="decode"} ${r === 0 ? 5 : decode1}\nsglang:token_usage{${labels}} 0.5`
        })
        .join("\n")

    it.effect("a silent replica whose own series moved meanwhile is busy, not hung", () => {
      const p = probed(dp2Layer, (body) => body[field])
      return Effect.gen(function* () {
        const stall = yield* EngineStall
        const scrape = (at: number, decode1: number) =>
          stall.scraped({
            at,
            counters: {},
            held: undefined,
            inflight: 0,
            ranks: loadSignals(page(decode1), names).rankProgress
          })
        yield* StallWatchdog.fork(new ActiveCalls())
        yield* TestClock.adjust(100)
        yield* scrape(100, 10)
        p.engine.hangRank = 1
        yield* TestClock.adjust(2000)
        assert.deepStrictEqual(
          p.requests.map((r) => r[field]),
          [0, 1],
          "the idle test, one request per replica"
        )
        // replica 1's queue holds the test, but its scheduler's counter moves: it works
        yield* scrape(2300, 11)
        yield* TestClock.adjust(IDLE_MS)
        assert.isUndefined(yield* problem, "busy, not hung")
        // the next test: replica 1 silent and still, a hang
        yield* TestClock.adjust(2000)
        yield* scrape(4500, 11)
        yield* TestClock.adjust(IDLE_MS)
        assert.match((yield* problem) ?? "", /no answer from data-parallel rank 1 within/)
      }).pipe(Effect.scoped, Effect.provide(p.layer))
    })
  })
})
