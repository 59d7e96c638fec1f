// NodeStatus: the pure NodeHealth mapping by tables, and the live layer over test layers (engine state
// pushed by hand, a counting fake EngineClient, fixed GPUs): snapshot, changes, one scrape per heartbeat, tokens/s
// and the gauges it mirrors into Metrics.
import { Effect, Fiber, Layer, Stream, SubscriptionRef } from "effect"
import { TestClock } from "effect/testing"
import { describe, expect, it } from "vitest"
import * as ConfigLayer from "../../src/layers/config/Config.ts"
import * as NodeStatusLayer from "../../src/layers/node/NodeStatus.ts"
import type { LaunchPlan } from "../../src/services/engine/Engine.ts"
import { EngineClient, type LoadSignals } from "../../src/services/engine/EngineClient.ts"
import type { EngineState, ExitRecord } from "../../src/services/engine/EngineProcess.ts"
import { EngineStall, noStall, type StallState, stallProblem } from "../../src/services/engine/EngineStall.ts"
import { State } from "../../src/services/engine/EngineState.ts"
import { GpuGate } from "../../src/services/engine/GpuGate.ts"
import { Admission } from "../../src/services/grpc/Admission.ts"
import { Drain } from "../../src/services/node/Drain.ts"
import { engineDetail, enginePhase, nodeState, ratePerSecond } from "../../src/services/node/NodeHealthView.ts"
import { NodeStatus, type NodeStatusService } from "../../src/services/node/NodeStatus.ts"
import { gpuWith } from "../../src/services/node/Nvml.ts"
import { Metrics } from "../../src/services/observability/Metrics.ts"
import { EngineProcessControl, testPlan } from "../../src/testing/EngineProcess.ts"
import * as NvmlTest from "../../src/testing/Nvml.ts"
import { nodeStatusDeps } from "../support/nodeStatus.ts"

const exit: ExitRecord = {
  run: 0,
  pid: 7,
  code: 137,
  signal: null,
  startedAt: 0,
  endedAt: 3000,
  runtimeMs: 3000,
  reason: "exited",
  endedBy: { kind: "exited" },
  lastLines: [],
  oomKills: undefined,
  memoryLimitBytes: undefined
}

describe("NodeHealthView (pure)", () => {
  it("a run torn down for its health is phase unhealthy, for an exit or a restart asked for stopping (the metric's words); an operator's restart reads starting", () => {
    const probe = State.Unhealthy({ reason: "3 liveness probes failed", since: 0, run: 0 })
    expect(enginePhase(probe)).toBe("unhealthy")
    expect(nodeState(probe, false)).toBe("unhealthy")
    // an operator's restart is no fault: the node reads starting from the request on; an exit or a stall restart is
    const endings = [
      [{ kind: "exited", status: "exit code 1" }, "unhealthy"],
      [{ kind: "requested", source: "stall", reason: "x" }, "unhealthy"],
      [{ kind: "requested", source: "admin", reason: "x" }, "starting"]
    ] as const
    for (const [ending, state] of endings) {
      const torn = State.Unhealthy({ reason: "restart requested: x", since: 0, run: 0, ending })
      expect(enginePhase(torn)).toBe("stopping")
      expect(nodeState(torn, false), ending.kind).toBe(state)
      expect(nodeState(torn, true)).toBe("draining")
    }
  })

  it("maps engine states to node states, a drain winning", () => {
    const table: Array<[EngineState, boolean, string]> = [
      [State.Starting({ phase: "loading", since: 0, run: 0 }), false, "starting"],
      [State.Ready({ since: 0, run: 0 }), false, "ready"],
      [State.Unhealthy({ reason: "probe timeout", since: 0, run: 0 }), false, "unhealthy"],
      [State.Restarting({ attempt: 1, nextAt: 0, lastExit: exit }), false, "starting"],
      [State.Restarting({ attempt: 3, nextAt: 0, lastExit: exit, failing: "engine failing: x" }), false, "unhealthy"],
      [State.Starting({ phase: "loading", since: 0, run: 3, failing: "engine failing: x" }), false, "unhealthy"],
      [State.Stopping({ since: 0 }), false, "unhealthy"],
      [State.Stopped({ lastExit: undefined }), false, "unhealthy"],
      [State.Ready({ since: 0, run: 0 }), true, "draining"],
      [State.Stopping({ since: 0 }), true, "draining"]
    ]
    for (const [engine, draining, want] of table) expect(nodeState(engine, draining)).toBe(want)
  })

  it("describes the phase and computes rates", () => {
    expect(engineDetail(State.Starting({ phase: "loading", since: 0, run: 2 }), 12_400)).toBe("loading for 12s (run 2)")
    // held by the GPU gate before the spawn: not "spawning"
    const held = State.Starting({ phase: "spawning", since: 0, run: 1 })
    expect(engineDetail(held, 3_000, true)).toBe("waiting for the engine's GPUs for 3s (run 1)")
    expect(engineDetail(held, 3_000)).toBe("spawning for 3s (run 1)")
    expect(engineDetail(State.Restarting({ attempt: 3, nextAt: 5000, lastExit: exit }), 1000)).toMatch(
      /^restart 3 in 4s; run 0 \(pid 7\) ended: exited, exit code 137/
    )
    expect(
      engineDetail(State.Restarting({ attempt: 3, nextAt: 5000, lastExit: exit, failing: "engine failing: x" }), 1000)
    ).toMatch(/^engine failing: x; restart 3 in 4s; run 0/)
    // the OOM killer's part of the exit, as every reader of NodeHealth (routers, /readyz) sees it
    const oom = { ...exit, code: 1, oomKills: 1, memoryLimitBytes: 256 * 2 ** 30 }
    expect(engineDetail(State.Restarting({ attempt: 1, nextAt: 5000, lastExit: oom }), 1000)).toContain(
      "ended: exited, exit code 1, 1 OOM kill in the agent's memory cgroup during this run (limit 256.0 GiB)"
    )
    // half a second ahead is "in 1s", never "in 0s" while the restart is still to come
    expect(engineDetail(State.Restarting({ attempt: 2, nextAt: 1500, lastExit: exit }), 1000)).toMatch(
      /^restart 2 in 1s;/
    )
    expect(ratePerSecond({ total: 10, at: 0 }, { total: 60, at: 500 })).toBe(100)
    expect(ratePerSecond({ total: 10, at: 0 }, { total: 5, at: 500 })).toBe(0) // counter reset
    expect(ratePerSecond({ total: 10, at: 100 }, { total: 20, at: 100 })).toBe(0)
  })
})

const gpu = gpuWith({
  index: 0,
  name: "H100",
  uuid: "GPU-1",
  memoryTotalBytes: 80e9,
  memoryUsedBytes: 1e9,
  memoryFreeBytes: 79e9,
  utilizationPercent: 5
})

/**
 * The first `count` states `changes` emits, collected into `seen` by a forked watcher; `reach(n)` waits (bounded)
 * until `n` are in.
 */
const watchChanges = (status: NodeStatusService, count: number) =>
  Effect.gen(function* () {
    const seen: Array<string> = []
    const watcher = yield* status.changes.pipe(
      Stream.tap((s) => Effect.sync(() => seen.push(s))),
      Stream.take(count),
      Stream.runDrain,
      Effect.forkChild
    )
    const reach = (n: number) =>
      Effect.gen(function* () {
        for (let i = 0; i < 500 && seen.length < n; i++) yield* Effect.sleep("2 millis")
      })
    return { seen, watcher, reach }
  })

const build = (signals: LoadSignals) => {
  let scrapes = 0
  const client = Layer.succeed(EngineClient, {
    streamTo: () => Effect.void,
    load: Effect.sync(() => {
      scrapes++
      return signals
    })
  })
  const config = ConfigLayer.layerFromObject({
    models: { m: { hf_repo: "org/m" } },
    cluster: { name: "c1" },
    agent: { node_id: "n1", heartbeat: "200ms", advertise_addr: "10.1.2.3:7071", max_inflight: 4, max_queue: 2 }
  })
  const deps = nodeStatusDeps(config, client, NvmlTest.layerFixed([gpu]))
  const layer = NodeStatusLayer.layer({ agentVersion: "9.9.9" }).pipe(Layer.provideMerge(deps))
  return { layer, scrapes: () => scrapes }
}

/** One NodeHealth snapshot of the live layer over `config` (an engine with no load signals) and the test engine's `plan`. */
const snapshotOf = (config: Record<string, unknown>, plan?: LaunchPlan) =>
  Effect.runPromise(
    Effect.scoped(
      Effect.flatMap(NodeStatus, (s) => s.snapshot).pipe(
        Effect.provide(
          NodeStatusLayer.layer().pipe(
            Layer.provideMerge(
              nodeStatusDeps(
                ConfigLayer.layerFromObject({ models: { m: { hf_repo: "org/m" } }, ...config }),
                Layer.succeed(EngineClient, {
                  streamTo: () => Effect.void,
                  load: Effect.succeed({ running: undefined, waiting: undefined, kvUsage: undefined })
                }),
                NvmlTest.layerFixed([]),
                plan
              )
            )
          )
        )
      )
    )
  )

describe("NodeStatus live layer", () => {
  it("an SGLang prefill node publishes its engine's bootstrap server; no other node does", async () => {
    const snapshot = (engine: Record<string, unknown>, role: string) =>
      snapshotOf({ agent: { role, advertise_addr: "10.1.2.3:7071" }, engine })
    // a wildcard engine host is no address a decode engine can dial: the node's advertised host instead
    const wildcard = { kind: "sglang", url: "http://0.0.0.0:30000", bootstrap_port: 9001 }
    expect((await snapshot(wildcard, "prefill")).bootstrap).toEqual({ host: "10.1.2.3", port: 9001 })
    const routable = { kind: "sglang", url: "http://10.9.9.9:30000" }
    expect((await snapshot(routable, "prefill")).bootstrap).toEqual({ host: "10.9.9.9", port: 8998 })
    expect((await snapshot(routable, "decode")).bootstrap).toBeUndefined()
    expect((await snapshot({ kind: "vllm", kv_offload: "nixl" }, "prefill")).bootstrap).toBeUndefined()
  })

  it("a P/D node publishes its KV transfer backend (the plan's), for a router to pair only nodes that share one", async () => {
    expect((await snapshotOf({}, testPlan({ kvTransfer: "nixl" }))).kvTransfer).toBe("nixl")
    expect((await snapshotOf({})).kvTransfer).toBe("")
  })

  it("assembles NodeHealth, samples the engine once per heartbeat, and emits changes", async () => {
    const { layer, scrapes } = build({ running: 3, waiting: 1, kvUsage: 0.25 })
    const result = await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const status = yield* NodeStatus
          const control = yield* EngineProcessControl
          const { seen, watcher, reach } = yield* watchChanges(status, 3)
          // bounded wait until the watcher has subscribed (it sees the current state first)
          yield* reach(1)
          const starting = yield* status.snapshot
          const startingBody = (yield* (yield* Metrics).render).body
          yield* control.set(State.Ready({ since: Date.now(), run: 0 }))
          // the engine's load comes from the sampler's fiber (engineLoad.ts), which scrapes a new Ready period at once
          let ready = yield* status.snapshot
          for (let i = 0; i < 500 && ready.load?.kvUsage !== 0.25; i++) {
            yield* Effect.sleep("2 millis")
            ready = yield* status.snapshot
          }
          const again = yield* status.snapshot
          const busy = yield* Effect.scoped((yield* Admission).acquire.pipe(Effect.andThen(status.snapshot)))
          const body = (yield* (yield* Metrics).render).body
          // changes reports the state when observed: let the watcher see "ready" before draining
          yield* reach(2)
          yield* (yield* Drain).start
          yield* Fiber.join(watcher).pipe(Effect.timeout("5 seconds"))
          const draining = yield* status.snapshot
          return {
            starting,
            startingBody,
            ready,
            again,
            busy,
            body,
            seen,
            draining,
            isDraining: yield* status.draining
          }
        })
      ).pipe(Effect.provide(layer))
    )
    expect(result.starting).toMatchObject({
      nodeId: "n1",
      cluster: "c1",
      agentVersion: "9.9.9",
      advertiseAddr: "10.1.2.3:7071",
      role: "both",
      state: "starting",
      engine: { kind: "vllm", model: "m", phase: "starting", restarts: 0 },
      load: { inflight: 0, queued: 0, engineRunning: 0, engineWaiting: 0, kvUsage: -1, tokensPerSecond: 0 },
      capacity: { maxInflight: 4, maxQueue: 2, gpus: [gpu] }
    })
    expect(result.ready.state).toBe("ready")
    expect(result.ready.load).toMatchObject({ engineRunning: 3, engineWaiting: 1, kvUsage: 0.25 })
    expect(result.again.load).toEqual(result.ready.load)
    expect(result.busy.load).toMatchObject({ inflight: 1, queued: 0 })
    expect(scrapes()).toBeLessThanOrEqual(2) // the sampler's, not one per reader; one more if a heartbeat passed
    expect(result.body).toContain('cgn_agent_engine_state{state="ready"} 1')
    expect(result.body).toContain("cgn_agent_engine_kv_cache_usage_ratio 0.25")
    expect(result.body).toMatch(/^cgn_agent_engine_waiting_requests 1$/m)
    // not Ready, so no sample: unknown, not a 0 that reads as an idle engine (NodeHealth's proto field has no
    // presence, so engineWaiting stays 0 there)
    expect(result.startingBody).toContain("# TYPE cgn_agent_engine_waiting_requests gauge")
    expect(result.startingBody).not.toMatch(/^cgn_agent_engine_waiting_requests /m)
    expect(result.startingBody).toMatch(/^cgn_agent_engine_running_requests 0$/m)
    // No run has exited yet: the series has no sample (no -1 sentinel), only its HELP and TYPE.
    expect(result.body).toContain("# TYPE cgn_agent_engine_last_exit_code gauge")
    expect(result.body).not.toMatch(/^cgn_agent_engine_last_exit_code /m)
    expect(result.seen).toEqual(["starting", "ready", "draining"])
    expect(result.draining.state).toBe("draining")
    expect(result.isDraining).toBe(true)
  })

  it("a change of the engine's state within one node state is emitted too (a crash loop's liveness failure, then its teardown)", async () => {
    const { layer } = build({ running: undefined, waiting: undefined, kvUsage: undefined })
    const seen = await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const status = yield* NodeStatus
          const control = yield* EngineProcessControl
          const { seen, watcher, reach } = yield* watchChanges(status, 4)
          yield* reach(1)
          yield* control.set(State.Ready({ since: Date.now(), run: 2 }))
          yield* reach(2)
          // three probes failed: the run is being torn down
          yield* control.set(State.Unhealthy({ reason: "3 liveness probes failed", since: Date.now(), run: 2 }))
          yield* reach(3)
          // the run torn down, the next waited for, still failing: the same node state, a change of the engine's
          const failing = "3 runs in a row ended before being stable"
          yield* control.set(State.Restarting({ attempt: 3, nextAt: Date.now() + 8_000, lastExit: exit, failing }))
          yield* Fiber.join(watcher).pipe(Effect.timeout("5 seconds"))
          return seen
        })
      ).pipe(Effect.provide(layer))
    )
    expect(seen).toEqual(["starting", "ready", "unhealthy", "unhealthy"])
  })

  it("reports tokens/s over the last heartbeat from the relayed-tokens counter", async () => {
    const { layer } = build({ running: undefined, waiting: undefined, kvUsage: undefined })
    const rate = await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const status = yield* NodeStatus
          ;(yield* Metrics).relayedTokens.inc({ model: "m" }, 100)
          // poll, bounded: the rate appears after the next heartbeat (200ms)
          for (let i = 0; i < 100; i++) {
            const r = (yield* status.snapshot).load?.tokensPerSecond ?? 0
            if (r > 0) return r
            yield* Effect.sleep("20 millis")
          }
          return 0
        })
      ).pipe(Effect.provide(layer))
    )
    expect(rate).toBeGreaterThan(0)
    expect(rate).toBeLessThanOrEqual(500)
  })

  it("with no running figure from the engine, NodeHealth engineRunning and the running-requests gauge are the agent's calls in flight", async () => {
    // README: an engine that does not report it (llama.cpp, mlx, openai_compat) or a stale scrape: the agent's count
    const { layer } = build({ running: undefined, waiting: undefined, kvUsage: undefined })
    const { health, body } = await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const status = yield* NodeStatus
          yield* (yield* EngineProcessControl).set(State.Ready({ since: Date.now(), run: 0 }))
          return yield* Effect.scoped(
            Effect.gen(function* () {
              yield* (yield* Admission).acquire
              return { health: yield* status.snapshot, body: (yield* (yield* Metrics).render).body }
            })
          )
        })
      ).pipe(Effect.provide(layer))
    )
    expect(health.load).toMatchObject({ inflight: 1, engineRunning: 1 })
    expect(body).toMatch(/^cgn_agent_engine_running_requests 1$/m)
  })

  it("a stall reaches the changes at once (the etcd write), the engine's state unchanged", async () => {
    const { layer } = build({ running: undefined, waiting: undefined, kvUsage: undefined })
    const stalledState: StallState = { ...noStall, lastStallAt: 2_000, stalledStreams: 1, stalledSince: 2_000 }
    const seen = await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const stallRef = yield* SubscriptionRef.make<StallState>(noStall)
          const stall = EngineStall.of({
            stalled: () => Effect.void,
            completed: () => Effect.void,
            moved: () => Effect.void,
            testFailed: () => Effect.void,
            callsFailed: () => Effect.void,
            rankMoved: () => Effect.succeed(false),
            scraped: () => Effect.void,
            state: SubscriptionRef.get(stallRef),
            changes: SubscriptionRef.changes(stallRef)
          })
          return yield* Effect.gen(function* () {
            const status = yield* NodeStatus
            const { seen, watcher, reach } = yield* watchChanges(status, 3)
            yield* reach(1)
            yield* (yield* EngineProcessControl).set(State.Ready({ since: Date.now(), run: 0 }))
            yield* reach(2)
            yield* SubscriptionRef.set(stallRef, stalledState)
            yield* Fiber.join(watcher).pipe(Effect.timeout("2 seconds"), Effect.ignore)
            return seen
          }).pipe(Effect.provide(layer.pipe(Layer.provide(Layer.succeed(EngineStall, stall)))))
        })
      )
    )
    expect(seen).toEqual(["starting", "ready", "unhealthy"])
  })

  it("a first spawn the GPU gate holds reads 'waiting for the engine's GPUs' in NodeHealth, not 'spawning'", async () => {
    const { layer } = build({ running: undefined, waiting: undefined, kvUsage: undefined })
    const waiting = { since: 0, reason: "GPU 0 holds 70 GiB", holders: [], overdue: false }
    const gate = GpuGate.of({
      awaitFree: Effect.never,
      runEnv: Effect.succeed({}),
      spawned: () => Effect.void,
      status: Effect.succeed({ gpus: [0], waiting, fault: undefined }),
      problems: Stream.empty
    })
    const detail = await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          yield* (yield* EngineProcessControl).set(State.Starting({ phase: "spawning", since: Date.now(), run: 0 }))
          return (yield* (yield* NodeStatus).snapshot).engine?.detail
        })
      ).pipe(Effect.provide(layer.pipe(Layer.provide(Layer.succeed(GpuGate, gate)))))
    )
    expect(detail).toMatch(/^waiting for the engine's GPUs for \d+s \(run 0\)/)
  })
})

describe("NodeStatus on the Clock", () => {
  it("ages the engine's phase by the Clock its states are stamped with (a TestClock here)", async () => {
    const { layer } = build({ running: undefined, waiting: undefined, kvUsage: undefined })
    const details = await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          yield* TestClock.setTime(1_000_000)
          const status = yield* NodeStatus
          const control = yield* EngineProcessControl
          yield* control.set(State.Starting({ phase: "loading", since: 988_000, run: 0 }))
          const loading = (yield* status.snapshot).engine?.detail
          yield* control.set(State.Restarting({ attempt: 2, nextAt: 1_004_000, lastExit: exit }))
          const restarting = (yield* status.snapshot).engine?.detail
          return { loading, restarting }
        })
      ).pipe(Effect.provide(layer), Effect.provide(TestClock.layer()))
    )
    expect(details.loading).toBe("loading for 12s (run 0)")
    expect(details.restarting).toMatch(/^restart 2 in 4s; /)
  })

  it("tokens/s is over the last heartbeat alone: 0 a heartbeat after the tokens stop", async () => {
    const { layer } = build({ running: undefined, waiting: undefined, kvUsage: undefined })
    const rates = await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const status = yield* NodeStatus
          const rate = Effect.map(status.snapshot, (h) => h.load?.tokensPerSecond)
          // the reading awaits the counter's promise: let it settle (bounded), the clock standing still
          const settled = (from: number | undefined) =>
            Effect.gen(function* () {
              let r = yield* rate
              for (let i = 0; i < 200 && r === from; i++) {
                yield* Effect.promise(() => new Promise<void>((resolve) => setImmediate(resolve)))
                r = yield* rate
              }
              return r
            })
          ;(yield* Metrics).relayedTokens.inc({ model: "m" }, 100)
          yield* TestClock.adjust("200 millis") // heartbeat 200ms: 100 tokens in it
          const first = yield* settled(0)
          yield* TestClock.adjust("200 millis") // a heartbeat with none
          return [first, yield* settled(first)]
        })
      ).pipe(Effect.provide(layer), Effect.provide(TestClock.layer()))
    )
    expect(rates).toEqual([500, 0])
  })
})

describe("stallProblem", () => {
  it("unhealthy from a stall until a call completes; a completion in the same tick clears it", () => {
    expect(stallProblem(noStall, "5m")).toBeUndefined()
    const stalled = { lastStallAt: 2_000, lastCompletedAt: 1_000, stalledStreams: 2, stalledSince: 1_500 }
    expect(stallProblem(stalled, "5m")).toBe(
      "engine stalled: 2 stream(s) sent nothing for 5m (engine.stream_idle_timeout) and no call has completed since"
    )
    expect(stallProblem({ ...stalled, lastCompletedAt: undefined }, "5m")).toContain("engine stalled")
    expect(stallProblem({ ...stalled, lastCompletedAt: 2_000 }, "5m")).toBeUndefined()
    expect(nodeState({ _tag: "Ready", since: 0, run: 0 }, false, stallProblem(stalled, "5m"))).toBe("unhealthy")
    expect(nodeState({ _tag: "Ready", since: 0, run: 0 }, true, stallProblem(stalled, "5m"))).toBe("draining")
  })
})
