// The stall watchdog's test completion per engine kind and role (layers/engine/stallProbe.ts, its shape from
// Engine.capabilities): an SGLang prefill or decode server refuses a request without its bootstrap fields, so there
// the probe names SGLang's fake bootstrap host and a room, no port, as SGLang's own warm-up and /health_generate do
// (python/sglang/srt/entrypoints/http_server.py; FAKE_BOOTSTRAP_HOST, python/sglang/srt/disaggregation/utils.py).
// vLLM's NixlConnector serves a request without kv_transfer_params locally on either role
// (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py): plain there, as on every engine in role "both".
// Then the probe's schedule and logging while the engine is stalled (stallProbe itself, with a scripted engine).
import { assert, it as effectIt } from "@effect/vitest"
import { Effect, Exit, Logger, Scope } from "effect"
import { describe, expect, it } from "vitest"
import { PROBE_TOKENS, probeBody, probeShape } from "../../src/layers/engine/probeShape.ts"
import { stallProbe } from "../../src/layers/engine/stallProbe.ts"
import { EngineKinds, Roles } from "../../src/services/config/ConfigSchema.ts"
import { EngineClient, EngineError } from "../../src/services/engine/EngineClient.ts"
import type { EngineStallService } from "../../src/services/engine/EngineStall.ts"
import { settle } from "../support/poll.ts"

const plain = { prompt: "ping", max_tokens: PROBE_TOKENS, temperature: 0 }
const fake = { bootstrap_host: "2.2.2.2", bootstrap_room: 0 }

describe("the stall probe's request", () => {
  it.each(["prefill", "decode"] as const)(
    "SGLang %s: the fake bootstrap host and room 0, on both endpoints",
    (role) => {
      const shape = probeShape("sglang", role)
      expect(probeBody("/v1/completions", shape)).toEqual({ ...plain, ignore_eos: true, ...fake })
      expect(probeBody("/v1/chat/completions", shape)).toEqual({
        messages: [{ role: "user", content: "ping" }],
        max_tokens: PROBE_TOKENS,
        temperature: 0,
        ignore_eos: true,
        ...fake
      })
      // no port: SGLang's own sends none (the fake sender and receiver never connect)
      expect(probeBody("/v1/completions", shape)).not.toHaveProperty("bootstrap_port")
    }
  )

  it("SGLang in role both, and vLLM in every role: no bootstrap fields", () => {
    expect(probeBody("/v1/completions", probeShape("sglang", "both"))).toEqual({ ...plain, ignore_eos: true })
    for (const role of Roles) {
      expect(probeBody("/v1/completions", probeShape("vllm", role))).toEqual({ ...plain, ignore_eos: true })
    }
  })

  it("of all engines and roles, only SGLang prefill and decode carry P/D fields", () => {
    for (const kind of EngineKinds) {
      for (const role of Roles) {
        const body = probeBody("/v1/completions", probeShape(kind, role))
        const pd = kind === "sglang" && role !== "both"
        expect("bootstrap_host" in body, `${kind} ${role}`).toBe(pd)
        expect("kv_transfer_params" in body, `${kind} ${role}`).toBe(false)
      }
    }
  })

  it.each(["prefill", "decode"] as const)(
    "SGLang %s with dp > 1: one request per rank, room r and routed_dp_rank r (a prefill server also routes room r to rank r mod dp)",
    (role) => {
      const shape = probeShape("sglang", role, 3)
      expect(shape.requests).toEqual(
        [0, 1, 2].map((r) => ({
          fields: { bootstrap_host: "2.2.2.2", bootstrap_room: r, routed_dp_rank: r },
          rank: r
        }))
      )
      expect(probeBody("/v1/completions", shape, shape.requests[2]?.fields)).toEqual({
        ...plain,
        ignore_eos: true,
        bootstrap_host: "2.2.2.2",
        bootstrap_room: 2,
        routed_dp_rank: 2
      })
    }
  )

  it("SGLang without P/D and dp > 1: one request per rank, named by routed_dp_rank alone", () => {
    const shape = probeShape("sglang", "both", 3)
    expect(shape.requests).toEqual([0, 1, 2].map((r) => ({ fields: { routed_dp_rank: r }, rank: r })))
    expect(probeBody("/v1/chat/completions", shape, shape.requests[1]?.fields)).toEqual({
      messages: [{ role: "user", content: "ping" }],
      max_tokens: PROBE_TOKENS,
      temperature: 0,
      ignore_eos: true,
      routed_dp_rank: 1
    })
    // one rank: no field (SGLang ignores rank 0 there, and refuses any other)
    expect(probeShape("sglang", "both", 1).requests).toEqual([{ fields: {} }])
    // neither a rank field nor a rank header: one request whatever dp
    expect(probeShape("llama_cpp", "both", 3).requests).toEqual([{ fields: {} }])
  })

  it("vLLM with dp > 1: one request per rank, pinned by the X-data-parallel-rank header, plain body", () => {
    for (const role of Roles) {
      expect(probeShape("vllm", role, 2).requests).toEqual([
        { fields: {}, rank: 0 },
        { fields: {}, rank: 1 }
      ])
      expect(probeShape("vllm", role, 1).requests).toEqual([{ fields: {} }])
    }
  })
})

/**
 * stallProbe over an engine that answers each path as `answerOf` says (an HTTP status, or a completion), with a
 * stream_idle_timeout of 5m and a liveness_interval (errorRetryMs) of 5s; `ready`: whether the run is still Ready.
 */
const probeOf = (answerOf: (path: string) => "ok" | "local" | number, ready = true) =>
  Effect.gen(function* () {
    const paths: Array<string> = []
    const completed: Array<string> = []
    const warnings: Array<{ message: string; fields: Record<string, unknown> }> = []
    const client = EngineClient.of({
      streamTo: (path, _body, _options, sink) =>
        Effect.suspend(() => {
          paths.push(path)
          const a = answerOf(path)
          // the agent's own host could not connect (EMFILE: services/node/HostShortage.ts)
          if (a === "local") return Effect.fail(new EngineError({ reason: "Local", message: "too many open files" }))
          if (a !== "ok") return Effect.fail(new EngineError({ reason: "Http", message: `HTTP ${a}`, status: a }))
          sink.onChunks([{ choices: [{ text: "pong", finish_reason: "length" }] }], () => undefined)
          return Effect.void
        }),
      load: Effect.succeed({ running: undefined, waiting: undefined, kvUsage: undefined })
    })
    const stall = {
      completed: (_at: number, why: string) => Effect.sync(() => void completed.push(why)),
      testFailed: () => Effect.void,
      rankMoved: () => Effect.succeed(false)
    } as unknown as EngineStallService
    const scope = yield* Effect.acquireRelease(Scope.make(), (s) => Scope.close(s, Exit.void))
    const logger = Logger.make(({ logLevel, message }) => {
      const [first, fields] = [message].flat()
      if (logLevel === "Warn") warnings.push({ message: String(first), fields: fields as Record<string, unknown> })
    })
    const probe = stallProbe(
      client,
      stall,
      300_000,
      probeShape("vllm", "both"),
      scope,
      "0s",
      Effect.succeed(ready),
      () => Number.NEGATIVE_INFINITY,
      5_000
    )
    // a test's fiber is forked by the caller of `stalled`, and logs through its logger
    const stalled = (now: number) => probe.stalled(now).pipe(Effect.provide(Logger.layer([logger])))
    /** Waits for the test in flight to end, by starting the next one, due at `now` (none starts while one is in flight). */
    const over = (now: number) => settle(`the test before ${now} ended`, stalled(now))
    return { stalled, over, paths, completed, warnings }
  })

describe("stallProbe while the engine is stalled (README engine.stream_idle_timeout)", () => {
  it("the test completion is 16 tokens", () => {
    expect(PROBE_TOKENS).toBe(16)
  })

  effectIt.effect(
    "a test the engine answered with an error: the next one engine.liveness_interval after it began, not a stream_idle_timeout later",
    () =>
      Effect.gen(function* () {
        let answer: "ok" | number = 503
        const h = yield* probeOf(() => answer)
        assert.isTrue(yield* h.stalled(0))
        yield* settle(
          "the failed test logged",
          Effect.sync(() => h.warnings.length > 0)
        )
        assert.strictEqual(h.warnings[0]?.fields.next_try_in, "5s")
        assert.isFalse(yield* h.stalled(4_999), "not before liveness_interval")
        answer = "ok"
        yield* h.over(5_000)
        yield* settle(
          "the stall cleared",
          Effect.sync(() => h.completed.length > 0)
        )
        assert.match(
          h.completed[0] ?? "",
          /^the engine completed a test request sent with no call in flight \(max_tokens 16, \/v1\/completions\)/
        )
      }).pipe(Effect.scoped)
  )

  effectIt.effect(
    "a test the agent could not send (its own descriptor limit) says so, not that the engine failed it",
    () =>
      Effect.gen(function* () {
        const h = yield* probeOf(() => "local")
        assert.isTrue(yield* h.stalled(0))
        yield* settle(
          "the unsent test logged",
          Effect.sync(() => h.warnings.length > 0)
        )
        assert.strictEqual(
          h.warnings[0]?.message,
          "the agent could not send the engine a test request: nothing concluded"
        )
      }).pipe(Effect.scoped)
  )

  for (const status of [404, 405, 501]) {
    effectIt.effect(`a server that answers /v1/completions ${status} is tested on /v1/chat/completions`, () =>
      Effect.gen(function* () {
        const h = yield* probeOf((path) => (path === "/v1/completions" ? status : "ok"))
        assert.isTrue(yield* h.stalled(0))
        yield* settle(
          "the test over",
          Effect.sync(() => h.completed.length + h.warnings.length > 0)
        )
        assert.deepStrictEqual(h.paths, ["/v1/completions", "/v1/chat/completions"])
        assert.strictEqual(h.completed.length, 1)
      }).pipe(Effect.scoped)
    )
  }

  effectIt.effect("a test that fails for the same reason again is logged once (logged once per reason)", () =>
    Effect.gen(function* () {
      const h = yield* probeOf(() => 503)
      assert.isTrue(yield* h.stalled(0))
      yield* h.over(5_000)
      yield* h.over(10_000)
      assert.deepStrictEqual(
        h.warnings.map((w) => [w.message, w.fields.error]),
        [["the engine failed a test request sent with no call in flight: the node stays unhealthy", "HTTP 503"]]
      )
    }).pipe(Effect.scoped)
  )

  effectIt.effect("a test that failed once the run was no longer Ready is not logged: the run's end broke it", () =>
    Effect.gen(function* () {
      const h = yield* probeOf(() => 503, false)
      assert.isTrue(yield* h.stalled(0))
      yield* h.over(5_000)
      assert.deepStrictEqual(h.warnings, [])
    }).pipe(Effect.scoped)
  )
})
