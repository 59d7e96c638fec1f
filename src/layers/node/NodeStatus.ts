/**
 * NodeStatus layers. The test layer (below, `layerTest`) is a NodeStatus that tests drive by hand:
 * set the state, the draining flag or any NodeHealth field, and `changes` emits like the live one would.
 * The live `layer` (at the end) assembles NodeHealth from the engine, admission, drain, GPUs and metrics.
 */
import * as fs from "node:fs"
import * as os from "node:os"
import { Context, Duration, Effect, Layer, Option, PubSub, Ref, Schedule, Stream } from "effect"
import type { Counter } from "prom-client"
import { NodeHealth } from "../../gen/cgn/agent/v1/agent.ts"
import { Config } from "../../services/config/Config.ts"
import { EngineClient, type LoadSignals } from "../../services/engine/EngineClient.ts"
import { EngineProcess } from "../../services/engine/EngineProcess.ts"
import { EngineStall, noStall, stallProblem } from "../../services/engine/EngineStall.ts"
import { failingOf } from "../../services/engine/EngineState.ts"
import { GpuGate, type GpuGateStatus, gateProblem } from "../../services/engine/GpuGate.ts"
import { Admission } from "../../services/grpc/Admission.ts"
import { Drain } from "../../services/node/Drain.ts"
import { buildNodeHealth, nodeState, ratePerSecond } from "../../services/node/NodeHealthView.ts"
import { type NodeState, NodeStatus } from "../../services/node/NodeStatus.ts"
import { Nvml } from "../../services/node/Nvml.ts"
import { ENGINE_STATES, Metrics, setCounter, setOptional, setStateGauge } from "../../services/observability/Metrics.ts"
import { resolveAdvertiseAddr } from "../../services/registry/Advertise.ts"

// ---------------------------------------------------------------------------------------------------------
// Test layer (HealthReporter tests and fixtures)
// ---------------------------------------------------------------------------------------------------------

/** Controls of the test NodeStatus. */
export interface NodeStatusTestControls {
  /** Sets the node state (and the draining flag when the state is "draining"), emitting a change. */
  readonly setState: (state: NodeState) => Effect.Effect<void>
  /** Replaces fields of the snapshot; emits a change when the state field changes. */
  readonly update: (f: (current: NodeHealth) => NodeHealth) => Effect.Effect<void>
  /** How many times `snapshot` was read. */
  readonly reads: Effect.Effect<number>
}

export class NodeStatusTest extends Context.Service<NodeStatusTest, NodeStatusTestControls>()(
  "cgn-agent/NodeStatusTest"
) {}

/** A plausible starting snapshot; `overrides` replace top-level fields. */
export const testNodeHealth = (overrides: Partial<NodeHealth> = {}): NodeHealth =>
  NodeHealth.fromPartial({
    nodeId: "node-test",
    cluster: "default",
    agentVersion: "0.0.0-test",
    advertiseAddr: "127.0.0.1:7071",
    role: "both",
    state: "starting",
    engine: { kind: "vllm", model: "m", phase: "starting", restarts: 0, detail: "" },
    load: { inflight: 0, queued: 0, engineRunning: 0, engineWaiting: 0, kvUsage: -1, tokensPerSecond: 0 },
    capacity: { maxInflight: 256, maxQueue: 1024, gpus: [] },
    ...overrides
  })

/** NodeStatus plus its controls, for tests. */
export const layerTest = (initial: Partial<NodeHealth> = {}): Layer.Layer<NodeStatus | NodeStatusTest> =>
  Layer.effectContext(
    Effect.gen(function* () {
      const current = yield* Ref.make(testNodeHealth(initial))
      const draining = yield* Ref.make(initial.state === "draining")
      const reads = yield* Ref.make(0)
      const pubsub = yield* Effect.acquireRelease(PubSub.unbounded<NodeState>(), PubSub.shutdown)
      const update = (f: (h: NodeHealth) => NodeHealth) =>
        Effect.gen(function* () {
          const before = (yield* Ref.get(current)).state
          const after = f(yield* Ref.get(current))
          yield* Ref.set(current, after)
          if (after.state === "draining") yield* Ref.set(draining, true)
          if (after.state !== before) yield* PubSub.publish(pubsub, after.state as NodeState)
        })
      const status = NodeStatus.of({
        snapshot: Ref.updateAndGet(reads, (n) => n + 1).pipe(Effect.andThen(Ref.get(current))),
        changes: Stream.fromPubSub(pubsub),
        draining: Ref.get(draining)
      })
      const controls = NodeStatusTest.of({
        setState: (state) => update((h) => ({ ...h, state })),
        update,
        reads: Ref.get(reads)
      })
      return Context.make(NodeStatus, status).pipe(Context.add(NodeStatusTest, controls))
    })
  )

// ---------------------------------------------------------------------------------------------------------
// Live layer: NodeHealth from Config, EngineProcess, EngineClient.load, Admission, Drain, Nvml and the
// relayed-tokens counter in Metrics. It also fills the gauges that mirror this view at scrape time.
// ---------------------------------------------------------------------------------------------------------

export interface NodeStatusOptions {
  /** Overrides the version read from package.json. */
  readonly agentVersion?: string
  /** The bound gRPC port, when listen_grpc asks for port 0 (otherwise the configured port is advertised). */
  readonly boundGrpcPort?: number
}

/** The version in the package.json next to src/ or dist/ ("0.0.0" if unreadable). */
export const packageVersion = (): string => {
  try {
    const pkg = JSON.parse(fs.readFileSync(new URL("../../../package.json", import.meta.url), "utf8")) as unknown
    const version = (pkg as { version?: unknown }).version
    return typeof version === "string" ? version : "0.0.0"
  } catch {
    return "0.0.0"
  }
}

const totalOf = (counter: Counter<"model">) =>
  Effect.promise(() => counter.get()).pipe(Effect.map((m) => m.values.reduce((sum, v) => sum + v.value, 0)))

export const layer = (
  options: NodeStatusOptions = {}
): Layer.Layer<NodeStatus, never, Config | EngineProcess | EngineClient | Admission | Drain | Nvml | Metrics> =>
  Layer.effect(
    NodeStatus,
    Effect.gen(function* () {
      const config = yield* Config
      const engine = yield* EngineProcess
      const client = yield* EngineClient
      const admission = yield* Admission
      const drain = yield* Drain
      const nvml = yield* Nvml
      const metrics = yield* Metrics
      // optional: tests and hosts without a GPU engine run without a gate
      const gate = yield* Effect.serviceOption(GpuGate)
      const gateStatus = Option.match(gate, {
        onNone: () => Effect.succeed<GpuGateStatus>({ gpus: [], waiting: undefined, fault: undefined }),
        onSome: (g) => g.status
      })
      const stall = yield* Effect.serviceOption(EngineStall)
      const stallIdle = Duration.format(config.engine.stream_idle_timeout)
      // why the node is unhealthy whatever the engine's state says: its GPUs, or the engine stalled
      const problemNow = Effect.gen(function* () {
        const g = yield* gateStatus
        const s = Option.isSome(stall) ? yield* stall.value.state : noStall
        return gateProblem(g) ?? stallProblem(s, stallIdle)
      })
      const heartbeat = config.agent.heartbeat
      const agentVersion = options.agentVersion ?? packageVersion()
      const advertiseAddr = resolveAdvertiseAddr({
        advertiseAddr: config.agent.advertise_addr,
        listenGrpc: config.agent.listen_grpc,
        nodeIp: process.env.NODE_IP,
        interfaces: os.networkInterfaces(),
        boundPort: options.boundGrpcPort
      })

      // One engine scrape per heartbeat at most, however many readers (etcd writer, gRPC, /status, /metrics).
      // Polling, not a request: no span (it would be a root span per heartbeat in every trace backend).
      const signals = yield* client.load.pipe(
        Effect.withTracerEnabled(false),
        Effect.map((s): LoadSignals | undefined => s),
        Effect.catch((e) =>
          Effect.logDebug("engine load scrape failed", { error: e.message }).pipe(Effect.as(undefined))
        ),
        Effect.cachedWithTTL(heartbeat)
      )

      // tokens/s over the last heartbeat interval: a reading of the counter per heartbeat.
      const rate = yield* Ref.make(0)
      let previous = { total: yield* totalOf(metrics.relayedTokens), at: Date.now() }
      yield* Effect.gen(function* () {
        const current = { total: yield* totalOf(metrics.relayedTokens), at: Date.now() }
        yield* Ref.set(rate, ratePerSecond(previous, current))
        previous = current
      }).pipe(Effect.repeat(Schedule.spaced(heartbeat)), Effect.delay(heartbeat), Effect.forkScoped)

      const gather = Effect.gen(function* () {
        const [state, restarts, draining, inflight, queued, gpus, tokensPerSecond, gpuGate, problem] =
          yield* Effect.all(
            [
              engine.state,
              engine.restarts,
              drain.draining,
              admission.inflight,
              admission.queued,
              nvml.gpus,
              Ref.get(rate),
              gateStatus,
              problemNow
            ],
            { concurrency: "unbounded" }
          )
        const load = state._tag === "Ready" ? yield* signals : undefined
        return { state, restarts, draining, inflight, queued, gpus, tokensPerSecond, signals: load, gpuGate, problem }
      })

      const snapshot = Effect.map(gather, (g) =>
        buildNodeHealth({
          ...g,
          engine: g.state,
          engineGpus: g.gpuGate.gpus,
          config,
          agentVersion,
          advertiseAddr,
          now: Date.now()
        })
      )

      yield* metrics.onCollect(
        Effect.gen(function* () {
          const g = yield* gather
          const [last] = yield* engine.exits
          metrics.inflight.set(g.inflight)
          metrics.queued.set(g.queued)
          setStateGauge(metrics.engineState, ENGINE_STATES, g.state._tag.toLowerCase())
          setCounter(metrics.engineRestarts, g.restarts)
          setOptional(metrics.engineLastExitCode, last?.code ?? undefined)
          metrics.engineFailing.set(failingOf(g.state) === undefined ? 0 : 1)
          metrics.engineRunningRequests.set(g.signals?.running ?? g.inflight)
          metrics.engineWaitingRequests.set(g.signals?.waiting ?? 0)
          setOptional(metrics.engineKvCacheUsage, g.signals?.kvUsage)
        })
      )

      // a GPU fault, memory held past gpu_free_timeout or a stalled engine is a fact: it reaches etcd at once,
      // not at the next heartbeat
      const stateNow = Effect.gen(function* () {
        const [s, d, p] = yield* Effect.all([engine.state, drain.draining, problemNow])
        return nodeState(s, d, p)
      })
      const gpuChanges: Stream.Stream<unknown> = Option.match(gate, {
        onNone: () => Stream.empty,
        onSome: (g) => g.problems
      })
      const stallChanges: Stream.Stream<unknown> = Option.match(stall, {
        onNone: () => Stream.empty,
        onSome: (s) => s.changes
      })
      const changes: Stream.Stream<NodeState> = Stream.mergeAll(
        [
          engine.changes.pipe(Stream.mapEffect(() => stateNow)),
          gpuChanges.pipe(Stream.mapEffect(() => stateNow)),
          stallChanges.pipe(Stream.mapEffect(() => stateNow)),
          Stream.fromEffect(drain.awaitStarted).pipe(Stream.as("draining" as const))
        ],
        { concurrency: "unbounded" }
      ).pipe(Stream.changes)

      return NodeStatus.of({ snapshot, changes, draining: drain.draining })
    })
  )
