// A Generate call cut by the end of the engine run under it ends UNAVAILABLE with why (services/grpc/EngineCut.ts,
// layers/grpc/EngineCut.ts), not with the transport's words alone: the run's end read from the supervisor's state for
// each state a cut call can meet; then through the real gRPC server and the live EngineClient against a scripted
// engine that holds a stream open until the test breaks its connection, with the test supervisor in the state a
// restart (published before the engine is signalled) or an exit (reported after the socket closed) leaves. The wait
// for an exit's report is checked where the subject waits: a test sets the exit only once the handler subscribed to
// the supervisor's states (EngineProcessControl.awaitSubscriptions), and its bound runs on a TestClock.
import * as http from "node:http"
import type { AddressInfo } from "node:net"
import { assert, it as effectIt } from "@effect/vitest"
import { Effect, Fiber, Layer, ManagedRuntime } from "effect"
import { TestClock } from "effect/testing"
import { ClientError, createChannel, createClient, type Metadata, Status } from "nice-grpc"
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest"
import { type AgentClient, AgentDefinition } from "../../src/gen/cgn/agent/v1/agent.ts"
import { layerFromPlan } from "../../src/layers/engine/EngineClient.ts"
import { EXIT_NOTICE_MS, make } from "../../src/layers/grpc/EngineCut.ts"
import { layerWith as grpcLayerWith } from "../../src/layers/grpc/GrpcServer.ts"
import { ADMIN_RESTART_REASON } from "../../src/services/admin/EngineRestart.ts"
import { EngineError } from "../../src/services/engine/EngineClient.ts"
import {
  type EngineState,
  type ExitRecord,
  type RunEnd,
  RunEndWords,
  type UnhealthyEnding
} from "../../src/services/engine/EngineProcess.ts"
import { State } from "../../src/services/engine/EngineState.ts"
import { EngineRunEnded } from "../../src/services/grpc/CallErrors.ts"
import { connectionBroke, runEnding } from "../../src/services/grpc/EngineCut.ts"
import { GrpcServer } from "../../src/services/grpc/GrpcServer.ts"
import { endsUnavailable } from "../../src/services/grpc/GrpcStatus.ts"
import { STREAMED_ADVICE } from "../../src/services/grpc/StatusMessage.ts"
import {
  EngineProcessControl,
  layerTest as engineLayerTest,
  testExit,
  testPlan
} from "../../src/testing/EngineProcess.ts"
import { layerTest as nodeStatusLayerTest } from "../../src/testing/NodeStatus.ts"
import { agentDeps } from "../support/agentDeps.ts"

/** How a cut call's message ends: every call here had streamed text first, so no "retry on another node". */
const STREAMED = STREAMED_ADVICE.slice(2)
const STALL_REASON =
  "engine stalled: 1 stream(s) sent nothing for 500ms (engine.stream_idle_timeout) and no call has completed since, for 1s (engine.stall_restart_after)"
const OPERATOR_RESTART: UnhealthyEnding = { kind: "requested", source: "admin", reason: ADMIN_RESTART_REASON }
const STALL_RESTART: UnhealthyEnding = { kind: "requested", source: "stall", reason: STALL_REASON }
/** A Ready run being torn down, its reason worded as the supervisor words it. */
const tornDown = (ending: UnhealthyEnding): EngineState =>
  State.Unhealthy({ reason: RunEndWords.ending(ending), since: 0, run: 0, ending })
/** Run `run`'s exit record as the supervisor writes it for `endedBy`. */
const exitBy = (run: number, endedBy: RunEnd): ExitRecord => ({
  ...testExit(run, endedBy),
  endedBy
})

describe("runEnding: why the run under a cut call ended, from the supervisor's state", () => {
  const killed = { ...exitBy(0, { kind: "exited" }), code: null, signal: "SIGKILL" }
  const cases: ReadonlyArray<[string, EngineState, ReadonlyArray<ExitRecord>, unknown]> = [
    ["Ready: not ending", State.Ready({ since: 0, run: 0 }), [], undefined],
    [
      "an operator's restart",
      tornDown(OPERATOR_RESTART),
      [],
      { by: "restart", why: "the engine is being restarted (POST /engine/restart by an operator)" }
    ],
    [
      "a stall restart",
      tornDown(STALL_RESTART),
      [],
      { by: "restart", why: `the engine is being restarted (${STALL_REASON})` }
    ],
    [
      "an exit",
      tornDown({ kind: "exited", status: "exit code 137" }),
      [],
      { by: "exit", why: "the engine exited (exit code 137)" }
    ],
    [
      "failed liveness",
      State.Unhealthy({ reason: "3 liveness probes failed in a row, last: timeout", since: 0, run: 0 }),
      [],
      { by: "restart", why: "the engine is being restarted (3 liveness probes failed in a row, last: timeout)" }
    ],
    [
      "restarting after an exit",
      State.Restarting({ attempt: 1, nextAt: 0, lastExit: killed }),
      [],
      { by: "exit", why: "the engine exited (signal SIGKILL)" }
    ],
    [
      "restarting after an exit with a code: worded as while the run was ending",
      State.Restarting({ attempt: 1, nextAt: 0, lastExit: { ...exitBy(0, { kind: "exited" }), code: 137 } }),
      [],
      { by: "exit", why: "the engine exited (exit code 137)" }
    ],
    [
      "restarting after a requested restart",
      State.Restarting({ attempt: 1, nextAt: 0, lastExit: exitBy(0, STALL_RESTART) }),
      [],
      { by: "restart", why: `the engine is being restarted (${STALL_REASON})` }
    ],
    [
      "the next run starting: the previous run's exit",
      State.Starting({ phase: "loading", since: 0, run: 1 }),
      [exitBy(1, { kind: "exited" }), exitBy(0, OPERATOR_RESTART)],
      { by: "restart", why: "the engine is being restarted (POST /engine/restart by an operator)" }
    ],
    ["the first run starting: nothing ended", State.Starting({ phase: "loading", since: 0, run: 0 }), [], undefined],
    ["stopping", State.Stopping({ since: 0 }), [], { by: "stop", why: "the agent is stopping the engine" }]
  ]
  it.each(cases)("%s", (_, state, exits, ending) => {
    expect(runEnding(state, exits)).toEqual(ending)
  })

  // Each way a run ends, as data: the words its exit record keeps (/status, the log) and a cut call's, once it ended
  // (Restarting) and, for a run torn down for certain, while it ends (Unhealthy): the same caller words both times.
  const ends: ReadonlyArray<[RunEnd, string, unknown]> = [
    [{ kind: "exited" }, "exited", { by: "exit", why: "the engine exited (exit code 1)" }],
    [
      { kind: "failed", problem: "spawn failed: spawn vllm ENOENT" },
      "spawn failed: spawn vllm ENOENT",
      { by: "restart", why: "the engine run ended (spawn failed: spawn vllm ENOENT)" }
    ],
    [
      OPERATOR_RESTART,
      `restarted: ${ADMIN_RESTART_REASON}`,
      { by: "restart", why: "the engine is being restarted (POST /engine/restart by an operator)" }
    ],
    [
      STALL_RESTART,
      `restarted: ${STALL_REASON}`,
      { by: "restart", why: `the engine is being restarted (${STALL_REASON})` }
    ],
    [
      { kind: "unhealthy", reason: "3 liveness probes failed in a row, last: timeout" },
      "unhealthy: 3 liveness probes failed in a row, last: timeout",
      { by: "restart", why: "the engine is being restarted (3 liveness probes failed in a row, last: timeout)" }
    ],
    [{ kind: "startupTimeout" }, "startup timeout", { by: "restart", why: "the engine run ended (startup timeout)" }],
    [{ kind: "stopped" }, "stopped", { by: "stop", why: "the agent stopped the engine" }]
  ]
  it.each(ends)("a run ended so: %j", (end, record, ending) => {
    expect(RunEndWords.record(end)).toBe(record)
    expect(runEnding(State.Restarting({ attempt: 1, nextAt: 0, lastExit: exitBy(0, end) }), [])).toEqual(ending)
    expect(runEnding(State.Starting({ phase: "loading", since: 0, run: 1 }), [exitBy(0, end)])).toEqual(ending)
  })

  it("a run torn down for certain: the Unhealthy reason's words, and the caller's the same as once it ended", () => {
    const endings: ReadonlyArray<[UnhealthyEnding, string]> = [
      [OPERATOR_RESTART, `restart requested: ${ADMIN_RESTART_REASON}`],
      [STALL_RESTART, `restart requested: ${STALL_REASON}`],
      [{ kind: "exited", status: "signal SIGKILL" }, "the engine exited (signal SIGKILL); stopping its process group"]
    ]
    for (const [ending, reason] of endings) {
      expect(RunEndWords.ending(ending)).toBe(reason)
      const ended = { ...exitBy(0, ending.kind === "exited" ? { kind: "exited" } : ending), signal: "SIGKILL" }
      expect(runEnding(tornDown(ending), [])).toEqual(
        runEnding(State.Restarting({ attempt: 1, nextAt: 0, lastExit: ended }), [])
      )
    }
  })

  it("who asked for a restart is its source, not its words: an operator's with any reason, a stall's with the admin's", () => {
    expect(runEnding(tornDown({ kind: "requested", source: "admin", reason: "again" }), [])?.why).toBe(
      "the engine is being restarted (POST /engine/restart by an operator)"
    )
    expect(runEnding(tornDown({ kind: "requested", source: "stall", reason: ADMIN_RESTART_REASON }), [])?.why).toBe(
      `the engine is being restarted (${ADMIN_RESTART_REASON})`
    )
  })

  it("a record written without its end (a hand-built one) reads as the engine's own exit", () => {
    expect(runEnding(State.Restarting({ attempt: 1, nextAt: 0, lastExit: testExit(0) }), [])).toEqual({
      by: "exit",
      why: "the engine exited (exit code 1)"
    })
  })

  it("explains only failures that end the call UNAVAILABLE, and waits for an exit only after a broken connection", () => {
    const broke = new EngineError({ reason: "Stream", message: "stream truncated: UND_ERR_SOCKET: other side closed" })
    const refused = new EngineError({ reason: "Connect", message: "ECONNREFUSED" })
    const http503 = new EngineError({ reason: "Http", message: "Loading model", status: 503 })
    const http400 = new EngineError({ reason: "Http", message: "bad", status: 400 })
    const event = new EngineError({ reason: "Stream", message: "boom", engineType: "server_error" })
    expect([broke, refused, http503, http400, event].map(endsUnavailable)).toEqual([true, true, true, false, true])
    expect([broke, refused, http503, http400, event].map(connectionBroke)).toEqual([true, true, false, false, false])
  })
})

describe("the layer: a connection broken while the run shows Ready waits, bounded, for the supervisor's word", () => {
  const broke = new EngineError({ reason: "Stream", message: "stream truncated: UND_ERR_SOCKET: other side closed" })
  const ready = engineLayerTest({ initial: State.Ready({ since: 0, run: 0 }) })
  /** One failed request being explained, once the explainer waits on the supervisor's states (not before). */
  const explaining = Effect.gen(function* () {
    const control = yield* EngineProcessControl
    const explain = yield* make
    if (explain === undefined) return yield* Effect.die("a spawning plan has an explainer")
    const before = yield* control.subscriptions
    const fiber = yield* Effect.forkChild(Effect.flip(explain(broke)))
    const first = yield* Effect.raceFirst(
      Effect.as(control.awaitSubscriptions(before + 1), "waiting"),
      Effect.as(Fiber.await(fiber), "ended")
    )
    assert.strictEqual(first, "waiting", "the explainer waits on the states")
    return { control, fiber }
  })

  effectIt.effect("the exit reported while it waits: the exit's words, no time passed", () =>
    Effect.gen(function* () {
      const { control, fiber } = yield* explaining
      yield* control.set(tornDown({ kind: "exited", status: "signal SIGKILL" }))
      const e = yield* Fiber.join(fiber)
      assert.instanceOf(e, EngineRunEnded)
      assert.deepStrictEqual([e.by, e.why, e.engine], ["exit", "the engine exited (signal SIGKILL)", broke])
    }).pipe(Effect.provide(ready))
  )

  effectIt.effect("the run stays Ready past EXIT_NOTICE_MS: the transport's words, not before the bound", () =>
    Effect.gen(function* () {
      const { control, fiber } = yield* explaining
      // the same run Ready again (a state republished) is no word of its end
      yield* control.set(State.Ready({ since: 5, run: 0 }))
      yield* TestClock.adjust(EXIT_NOTICE_MS - 1)
      assert.isUndefined(fiber.pollUnsafe(), "still waiting before the bound")
      // the timer may have been set a little after the subscription; a second bound ends it for certain
      yield* TestClock.adjust(EXIT_NOTICE_MS)
      assert.strictEqual(yield* Fiber.join(fiber), broke)
    }).pipe(Effect.provide(ready))
  )

  effectIt.effect("an exit reported 100 ms after the break (the orphan guard's report) is still the call's why", () =>
    Effect.gen(function* () {
      const { control, fiber } = yield* explaining
      yield* TestClock.adjust(100)
      assert.isUndefined(fiber.pollUnsafe(), "still waiting for the supervisor's word")
      yield* control.set(tornDown({ kind: "exited", status: "signal SIGKILL" }))
      const e = yield* Fiber.join(fiber)
      assert.instanceOf(e, EngineRunEnded)
      assert.strictEqual(e.why, "the engine exited (signal SIGKILL)")
    }).pipe(Effect.provide(ready))
  )

  /** `e` explained, raced against the explainer subscribing to the states (a wait): which came first, and the error. */
  const explainedAtOnce = (e: EngineError) =>
    Effect.gen(function* () {
      const control = yield* EngineProcessControl
      const explain = yield* make
      if (explain === undefined) return yield* Effect.die("a spawning plan has an explainer")
      const before = yield* control.subscriptions
      const fiber = yield* Effect.forkChild(Effect.flip(explain(e)))
      const first = yield* Effect.raceFirst(
        Effect.as(control.awaitSubscriptions(before + 1), "waiting"),
        Effect.as(Fiber.await(fiber), "ended")
      )
      return { first, error: first === "ended" ? yield* Fiber.join(fiber) : undefined }
    })

  effectIt.effect("an engine's 503 (no broken connection) under Ready comes back at once, its own words", () =>
    Effect.gen(function* () {
      const http503 = new EngineError({ reason: "Http", message: "Loading model", status: 503 })
      const { first, error } = yield* explainedAtOnce(http503)
      assert.strictEqual(first, "ended", "no wait for the supervisor's word")
      assert.strictEqual(error, http503)
    }).pipe(Effect.provide(ready))
  )

  effectIt.effect("an engine's 4xx while the run is being restarted keeps its own status (the request's fault)", () =>
    Effect.gen(function* () {
      const http400 = new EngineError({ reason: "Http", message: "bad", status: 400 })
      const { first, error } = yield* explainedAtOnce(http400)
      assert.strictEqual(first, "ended")
      assert.strictEqual(error, http400)
    }).pipe(Effect.provide(engineLayerTest({ initial: tornDown(OPERATOR_RESTART) })))
  )

  effectIt.effect("broken while the next run is Starting: the previous run's exit says why", () =>
    Effect.gen(function* () {
      yield* (yield* EngineProcessControl).recordExit(exitBy(0, OPERATOR_RESTART))
      const { first, error } = yield* explainedAtOnce(broke)
      assert.strictEqual(first, "ended")
      assert.instanceOf(error, EngineRunEnded)
      assert.deepStrictEqual(
        [error.by, error.why, error.engine],
        ["restart", "the engine is being restarted (POST /engine/restart by an operator)", broke]
      )
    }).pipe(Effect.provide(engineLayerTest({ initial: State.Starting({ phase: "loading", since: 0, run: 1 }) })))
  )
})

/**
 * Streams one chunk and holds the rest; `cut()` breaks the held connections as a dying engine does. `closed`: one
 * promise per held request, settled when its connection closes (whoever closed it).
 */
const held: Array<http.ServerResponse> = []
const closed: Array<Promise<void>> = []
const startEngine = async (): Promise<{ server: http.Server; url: string }> => {
  const server = http.createServer((req, res) => {
    req.resume()
    req.on("end", () => {
      res.writeHead(200, { "content-type": "text/event-stream" })
      res.write(`data: {"choices":[{"index":0,"text":"a"}]}\n\n`)
      held.push(res)
      closed.push(new Promise((resolve) => res.on("close", () => resolve())))
    })
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  return { server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` }
}
const cut = (): void => {
  for (const res of held.splice(0)) res.socket?.destroy()
}

interface Ended {
  readonly status: string
  readonly details: string
  readonly text: string
  readonly trailer: Metadata | undefined
}

/** One call held by the engine, once its first delta came (the engine request is streaming); `ended`: its end. */
const holdCall = async (client: AgentClient): Promise<{ readonly ended: Promise<Ended> }> => {
  let first: () => void = () => {}
  const streaming = new Promise<void>((resolve) => (first = resolve))
  let text = ""
  let trailer: Metadata | undefined
  const ended = (async (): Promise<Ended> => {
    try {
      for await (const r of client.generate({ prompt: "p" }, { onTrailer: (t) => (trailer = t) })) {
        if (r.delta !== undefined) text += r.delta.text
        first()
      }
      return { status: "OK", details: "", text, trailer }
    } catch (e) {
      if (!(e instanceof ClientError)) throw e
      return { status: Status[e.code] ?? String(e.code), details: e.details, text, trailer }
    } finally {
      first()
    }
  })()
  await streaming
  return { ended }
}

describe("a Generate call whose engine connection breaks", () => {
  let engine: { server: http.Server; url: string }
  const agents: Array<{ close: () => Promise<void> }> = []
  beforeAll(async () => {
    engine = await startEngine()
  })
  beforeEach(() => {
    held.length = 0
    closed.length = 0
  })
  afterAll(async () => {
    for (const a of agents.splice(0)) await a.close()
    engine?.server.closeAllConnections()
    await new Promise<void>((resolve) => (engine === undefined ? resolve() : engine.server.close(() => resolve())))
  })

  const startAgent = async (options: { spawns?: boolean } = {}) => {
    const { config, deps } = agentDeps(engine.url, { agent: { max_tokens_limit: 1000 } })
    const port = Number(new URL(engine.url).port)
    // agentDeps' test supervisor spawns; a proxied server's plan does not (openai_compat)
    const plan = testPlan({ baseUrl: engine.url, port, servedModel: "m", requestModel: "m", spawns: false })
    const engineDeps =
      options.spawns === false
        ? Layer.mergeAll(
            config,
            layerFromPlan(plan),
            engineLayerTest({ plan, initial: State.Ready({ since: 0, run: 0 }) }),
            nodeStatusLayerTest({ state: "ready" })
          )
        : deps
    const rt = ManagedRuntime.make(
      grpcLayerWith({ address: "127.0.0.1:0", shutdownGraceMs: 500 }).pipe(Layer.provideMerge(engineDeps))
    )
    const server = await rt.runPromise(GrpcServer)
    const channel = createChannel(server.address)
    const agent = {
      client: createClient(AgentDefinition, channel),
      set: (s: EngineState) => rt.runPromise(Effect.flatMap(EngineProcessControl, (c) => c.set(s))),
      subscriptions: () => rt.runPromise(Effect.flatMap(EngineProcessControl, (c) => c.subscriptions)),
      /** "waiting" once the handler subscribed to the states since `before` was read, "ended" if the call ended first. */
      waiting: (before: number, call: { readonly ended: Promise<Ended> }) =>
        Promise.race([
          rt
            .runPromise(Effect.flatMap(EngineProcessControl, (c) => c.awaitSubscriptions(before + 1)))
            .then(() => "waiting"),
          call.ended.then(() => "ended")
        ]),
      close: async () => {
        channel.close()
        await rt.dispose()
      }
    }
    agents.push(agent)
    return agent
  }

  // The engine keeps every connection open here (no cut()): only the agent can end these calls, and the engine sees
  // its connection close, as llama-server must before it exits on SIGTERM.
  it("an operator's restart published (before the engine is signalled): the calls end at once with why, their engine requests aborted", async () => {
    const agent = await startAgent()
    const calls = [await holdCall(agent.client), await holdCall(agent.client)]
    await agent.set(tornDown(OPERATOR_RESTART))
    for (const call of calls) {
      const r = await call.ended
      expect([r.status, r.text]).toEqual(["UNAVAILABLE", "a"])
      expect(r.details).toBe(
        `the engine is being restarted (POST /engine/restart by an operator): the engine request was aborted; ${STREAMED}`
      )
      // it had streamed "a": the advice and the trailer agree (StatusMessage.ts asSent)
      expect(r.trailer?.get("cgn-retryable")).toBe("false")
      expect(r.trailer?.get("cgn-error-source")).toBe("agent")
      // nothing of the engine's: it never failed
      expect(r.trailer?.get("cgn-engine-reason")).toBeUndefined()
    }
    expect(held).toHaveLength(2)
    await Promise.all(closed)
  })

  const ending: ReadonlyArray<[string, EngineState, string]> = [
    [
      "failed liveness",
      State.Unhealthy({ reason: "3 liveness probes failed in a row, last: timeout", since: 0, run: 0 }),
      "the engine is being restarted (3 liveness probes failed in a row, last: timeout)"
    ],
    ["a stall restart", tornDown(STALL_RESTART), `the engine is being restarted (${STALL_REASON})`],
    [
      "a stall restart, first seen once the run ended (Restarting)",
      State.Restarting({ attempt: 1, nextAt: 0, lastExit: exitBy(0, STALL_RESTART) }),
      `the engine is being restarted (${STALL_REASON})`
    ],
    ["the agent stopping the engine", State.Stopping({ since: 0 }), "the agent is stopping the engine"]
  ]
  it.each(ending)("%s: the call ends at once with why, its engine request aborted", async (_, state, why) => {
    const agent = await startAgent()
    const call = await holdCall(agent.client)
    await agent.set(state)
    const r = await call.ended
    expect(r.status).toBe("UNAVAILABLE")
    expect(r.details).toBe(`${why}: the engine request was aborted; ${STREAMED}`)
    expect(r.trailer?.get("cgn-error-source")).toBe("agent")
    await Promise.all(closed)
  })

  it("cut by the engine's exit, reported after the socket closed: UNAVAILABLE, the exit's status", async () => {
    const agent = await startAgent()
    const call = await holdCall(agent.client)
    const before = await agent.subscriptions()
    cut()
    // the exit as the orphan guard's report brings it: after the connection broke, once the handler, seeing the run
    // still Ready, waits on the supervisor's states for it (EXIT_NOTICE_MS)
    expect(await agent.waiting(before, call)).toBe("waiting")
    await agent.set(tornDown({ kind: "exited", status: "signal SIGKILL" }))
    const r = await call.ended
    expect(r.status).toBe("UNAVAILABLE")
    expect(r.details).toMatch(/^the engine exited \(signal SIGKILL\): stream truncated: .+; do not retry elsewhere: /)
    expect(r.trailer?.get("cgn-error-source")).toBe("engine")
  })

  it("broken while the run stays Ready: the transport's words, as before, after the wait", async () => {
    const agent = await startAgent()
    const call = await holdCall(agent.client)
    const before = await agent.subscriptions()
    cut()
    expect(await agent.waiting(before, call)).toBe("waiting")
    const r = await call.ended
    expect(r.status).toBe("UNAVAILABLE")
    expect(r.details).toMatch(/^engine failed mid-stream: stream truncated: /)
    expect(r.trailer?.get("cgn-error-source")).toBe("engine")
  })

  it("a proxied server (openai_compat) is not the agent's: its state never explains a cut", async () => {
    const agent = await startAgent({ spawns: false })
    const call = await holdCall(agent.client)
    await agent.set(State.Unhealthy({ reason: "3 liveness probes failed in a row, last: timeout", since: 0, run: 0 }))
    cut()
    const r = await call.ended
    expect(r.status).toBe("UNAVAILABLE")
    expect(r.details).toMatch(/^engine failed mid-stream: stream truncated: /)
  })

  it("broken after the run ended by itself (Restarting): the run's exit record says why", async () => {
    const agent = await startAgent()
    const call = await holdCall(agent.client)
    const killed = { ...exitBy(0, { kind: "exited" }), code: null, signal: "SIGKILL" }
    await agent.set(State.Restarting({ attempt: 1, nextAt: 0, lastExit: killed }))
    cut()
    const r = await call.ended
    expect(r.status).toBe("UNAVAILABLE")
    expect(r.details).toMatch(/^the engine exited \(signal SIGKILL\): stream truncated: .+; do not retry elsewhere: /)
  })
})
