/**
 * The live NodeStatus layer: assembles NodeHealth from the engine, admission, drain, cordon, GPUs and metrics.
 * Its test double (a NodeStatus tests drive by hand) is src/testing/NodeStatus.ts.
 */
import * as os from "node:os"
import { Clock, Duration, Effect, Layer, Option, Ref, Schedule, Stream } from "effect"
import type { Counter } from "prom-client"
import { Config } from "../../services/config/Config.ts"
import { EngineClient } from "../../services/engine/EngineClient.ts"
import { EngineProcess } from "../../services/engine/EngineProcess.ts"
import { progressReading } from "../../services/engine/EngineProgress.ts"
import { EngineStall, noStall, stallProblem } from "../../services/engine/EngineStall.ts"
import { failingOf } from "../../services/engine/EngineState.ts"
import { GpuGate, type GpuGateStatus, gateProblem } from "../../services/engine/GpuGate.ts"
import { requestContext, ServedContext } from "../../services/engine/ServedContext.ts"
import { Admission } from "../../services/grpc/Admission.ts"
import { hostsRendezvous } from "../../services/grpc/Handoff.ts"
import { hostOfAddr } from "../../services/net/HostPort.ts"
import { AgentShortage, shortageProblem } from "../../services/node/AgentShortage.ts"
import { Cordon } from "../../services/node/Cordon.ts"
import { Drain } from "../../services/node/Drain.ts"
import {
  bootstrapServer,
  buildNodeHealth,
  enginePhase,
  nodeState,
  ratePerSecond
} from "../../services/node/NodeHealthView.ts"
import { type NodeState, NodeStatus } from "../../services/node/NodeStatus.ts"
import { Nvml } from "../../services/node/Nvml.ts"
import { ENGINE_STATES, Metrics, setCounter, setOptional, setStateGauge } from "../../services/observability/Metrics.ts"
import { type AdvertiseError, advertiseAddrOf } from "../../services/registry/Advertise.ts"
import { VERSION } from "../../version.ts"
import { listenOf } from "../engine/backends/common.ts"
import { engineOf } from "../engine/backends/index.ts"
import { background, RESTART } from "../observability/backgroundFiber.ts"
import { sampleEngineLoad } from "./engineLoad.ts"

// ---------------------------------------------------------------------------------------------------------
// Live layer: NodeHealth from Config, EngineProcess, EngineClient.load, Admission, Drain, Nvml and the
// relayed-tokens counter in Metrics. It also fills the gauges that mirror this view at scrape time.
// ---------------------------------------------------------------------------------------------------------

export interface NodeStatusOptions {
  /** Overrides the version read from package.json. */
  readonly agentVersion?: string
}

const totalOf = (counter: Counter<"model">) =>
  Effect.promise(() => counter.get()).pipe(Effect.map((m) => m.values.reduce((sum, v) => sum + v.value, 0)))

export const layer = (
  options: NodeStatusOptions = {}
): Layer.Layer<
  NodeStatus,
  AdvertiseError,
  Config | EngineProcess | EngineClient | Admission | Drain | Cordon | Nvml | Metrics
> =>
  Layer.effect(
    NodeStatus,
    Effect.gen(function* () {
      const config = yield* Config
      const engine = yield* EngineProcess
      const client = yield* EngineClient
      const admission = yield* Admission
      const drain = yield* Drain
      const cordon = yield* Cordon
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
      // optional too: tests that build no AgentShortage, no ServedContext
      const shortage = yield* Effect.serviceOption(AgentShortage)
      const served = Option.getOrUndefined(yield* Effect.serviceOption(ServedContext))
      // why the node is unhealthy whatever the engine's state says: its GPUs, the engine stalled, or the agent itself
      // short of what it needs to reach the engine
      const problemNow = Effect.gen(function* () {
        const g = yield* gateStatus
        const s = Option.isSome(stall) ? yield* stall.value.state : noStall
        const short = Option.isSome(shortage) ? yield* shortage.value.current : undefined
        return (
          gateProblem(g) ?? stallProblem(s, stallIdle) ?? (short === undefined ? undefined : shortageProblem(short))
        )
      })
      const heartbeat = config.agent.heartbeat
      const agentVersion = options.agentVersion ?? VERSION
      // the interfaces are listed only for a wildcard listen host: listing them needs a descriptor (Advertise.ts)
      const advertise = (boundPort: number | undefined) =>
        advertiseAddrOf(
          {
            advertiseAddr: config.agent.advertise_addr,
            listenGrpc: config.agent.listen_grpc,
            nodeIp: config.agent.node_ip,
            boundPort
          },
          os.networkInterfaces
        )
      // resolved again once the gRPC server has bound (grpcBound): listen_grpc's port 0 is the OS's pick
      let advertiseAddr = yield* advertise(undefined)
      // A node that hosts its pairs' rendezvous (an SGLang prefill node) publishes its engine's bootstrap server: the
      // router copies it into both legs.
      const bootstrap = hostsRendezvous(config.agent.role, engineOf(config).capabilities.handoff)
        ? bootstrapServer(listenOf(config).host, hostOfAddr(advertiseAddr), config.engine.bootstrap_port)
        : undefined

      // One engine scrape per heartbeat, in a fiber of its own (engineLoad.ts), however many readers (etcd writer,
      // gRPC, /status, /metrics): readers take the last sample and never wait on the engine's I/O. Each one also
      // goes to EngineStall for the engine's progress counters, with the agent's own calls in flight (the work the
      // engine holds must be the agent's: EngineProgress.ts).
      const engineLoad = yield* sampleEngineLoad({
        load: client.load,
        state: engine.state,
        changes: engine.changes,
        heartbeatMs: Duration.toMillis(heartbeat),
        onSample: Option.match(stall, {
          onNone: () => undefined,
          onSome: (s) => (signals, at) =>
            Effect.flatMap(admission.inflight, (inflight) => s.scraped(progressReading(signals, at, inflight)))
        })
      })

      // tokens/s over the last heartbeat interval: a reading of the counter per heartbeat.
      const rate = yield* Ref.make(0)
      // Time through the Clock, as the engine states' `since` and `nextAt` are (EngineProcess): a phase's age is
      // the difference of the two, and read against Date.now() it was off by the whole epoch under a TestClock.
      let previous = { total: yield* totalOf(metrics.relayedTokens), at: yield* Clock.currentTimeMillis }
      yield* Effect.gen(function* () {
        const current = { total: yield* totalOf(metrics.relayedTokens), at: yield* Clock.currentTimeMillis }
        yield* Ref.set(rate, ratePerSecond(previous, current))
        previous = current
      }).pipe(
        Effect.repeat(Schedule.spaced(heartbeat)),
        Effect.delay(heartbeat),
        background("the tokens/s reading", "the node's tokens/s is no longer updated", { restart: RESTART }),
        Effect.forkScoped
      )

      const gather = Effect.gen(function* () {
        const [state, restarts, draining, cordoned, inflight, queued, gpus, tokensPerSecond, gpuGate, problem] =
          yield* Effect.all(
            [
              engine.state,
              engine.restarts,
              drain.draining,
              cordon.cordoned,
              admission.inflight,
              admission.queued,
              nvml.gpus,
              Ref.get(rate),
              gateStatus,
              problemNow
            ],
            { concurrency: "unbounded" }
          )
        const load = yield* engineLoad.latest(state)
        return {
          state,
          restarts,
          draining,
          cordoned,
          inflight,
          queued,
          gpus,
          tokensPerSecond,
          signals: load,
          gpuGate,
          problem
        }
      })

      const snapshot = Effect.gen(function* () {
        const g = yield* gather
        return buildNodeHealth({
          ...g,
          engine: g.state,
          engineGpus: g.gpuGate.gpus,
          engineMigDevice: g.gpuGate.mig,
          gpuWaiting: g.gpuGate.waiting !== undefined,
          config,
          agentVersion,
          advertiseAddr,
          bootstrap,
          kvTransfer: engine.plan.kvTransfer,
          // as ListModels reports it (layers/grpc/GrpcServer.ts): a router sizes calls by it before it picks a node
          maxModelLen: requestContext(config.model.max_model_len, served?.current())?.tokens,
          now: yield* Clock.currentTimeMillis
        })
      })

      yield* metrics.onCollect(
        Effect.gen(function* () {
          const g = yield* gather
          const [last] = yield* engine.exits
          metrics.inflight.set(g.inflight)
          metrics.queued.set(g.queued)
          setStateGauge(metrics.engineState, ENGINE_STATES, enginePhase(g.state))
          setCounter(metrics.engineRestarts, g.restarts)
          setOptional(metrics.engineLastExitCode, last?.code ?? undefined)
          metrics.engineFailing.set(failingOf(g.state) === undefined ? 0 : 1)
          metrics.engineRunningRequests.set(g.signals?.running ?? g.inflight)
          // no (fresh) sample, or an engine that does not report it: no sample rather than a 0 that reads as idle
          setOptional(metrics.engineWaitingRequests, g.signals?.waiting)
          setOptional(metrics.engineKvCacheUsage, g.signals?.kvUsage)
        })
      )

      // a GPU fault, memory held past gpu_free_timeout or a stalled engine is a fact: it reaches etcd at once,
      // not at the next heartbeat
      // Each with the engine's state: a change of it within one node state is a change too (a crash loop's
      // liveness failure, `unhealthy` with the run still up, then its teardown, `unhealthy` with the engine
      // restarting: the second is a fact the etcd record must carry at once, not a heartbeat later).
      const stateNow = Effect.gen(function* () {
        const [s, d, p, c] = yield* Effect.all([engine.state, drain.draining, problemNow, cordon.cordoned])
        return { state: nodeState(s, d, p, c), engine: enginePhase(s) }
      })
      const gpuChanges: Stream.Stream<unknown> = Option.match(gate, {
        onNone: () => Stream.empty,
        onSome: (g) => g.problems
      })
      const stallChanges: Stream.Stream<unknown> = Option.match(stall, {
        onNone: () => Stream.empty,
        onSome: (s) => s.changes
      })
      const shortageChanges: Stream.Stream<unknown> = Option.match(shortage, {
        onNone: () => Stream.empty,
        onSome: (s) => s.changes
      })
      const changes: Stream.Stream<NodeState> = Stream.mergeAll(
        [
          engine.changes.pipe(Stream.mapEffect(() => stateNow)),
          gpuChanges.pipe(Stream.mapEffect(() => stateNow)),
          stallChanges.pipe(Stream.mapEffect(() => stateNow)),
          shortageChanges.pipe(Stream.mapEffect(() => stateNow)),
          cordon.changes.pipe(Stream.mapEffect(() => stateNow)),
          Stream.fromEffect(drain.awaitStarted).pipe(Stream.as({ state: "draining" as const, engine: "" }))
        ],
        { concurrency: "unbounded" }
      ).pipe(
        Stream.changesWith((a, b) => a.state === b.state && a.engine === b.engine),
        Stream.map((c) => c.state)
      )

      const grpcBound = (port: number) =>
        Effect.map(advertise(port), (addr) => {
          advertiseAddr = addr
        })
      return NodeStatus.of({ snapshot, changes, draining: drain.draining, cordoned: cordon.cordoned, grpcBound })
    })
  )
