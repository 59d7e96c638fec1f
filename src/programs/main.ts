/**
 * The daemon: every service's Layer composed into one program, and the ordered drain.
 * Reading this file shows the whole agent. Resources are released by their scopes in reverse order of
 * acquisition: the etcd lease first (after the drain), then the gRPC and admin servers, then the core
 * services (engine process group, sockets, timers). There is no hand-kept cleanup list.
 */
import { Clock, Context, Deferred, Duration, Effect, Layer, Option, Ref } from "effect"
import type { LogLevel } from "effect/LogLevel"
import type { NodeHealth } from "../gen/cgn/agent/v1/agent.ts"
import * as AdminLive from "../layers/admin/Admin.ts"
import { exposureWarnings } from "../layers/config/exposureWarnings.ts"
import * as EngineClientLive from "../layers/engine/EngineClient.ts"
import * as EngineHostLive from "../layers/engine/EngineHost.ts"
import { planLayer } from "../layers/engine/EnginePlan.ts"
import * as EngineProcessLive from "../layers/engine/EngineProcess.ts"
import * as EngineStallLive from "../layers/engine/EngineStall.ts"
import * as GpuGateLive from "../layers/engine/GpuGate.ts"
import * as ServedContextLive from "../layers/engine/ServedContext.ts"
import * as AdmissionLive from "../layers/grpc/Admission.ts"
import * as GrpcServerLive from "../layers/grpc/GrpcServer.ts"
import * as HealthListener from "../layers/grpc/HealthListener.ts"
import * as KvBridgeLive from "../layers/kv/KvBridge.ts"
import * as AgentShortageLive from "../layers/node/AgentShortage.ts"
import * as CordonLive from "../layers/node/Cordon.ts"
import * as EventLoopLagLive from "../layers/node/EventLoopLag.ts"
import * as MemoryCgroupLive from "../layers/node/MemoryCgroup.ts"
import * as NodeStatusLive from "../layers/node/NodeStatus.ts"
import * as NvmlLive from "../layers/node/Nvml.ts"
import * as Logging from "../layers/observability/Logging.ts"
import * as MetricsLive from "../layers/observability/Metrics.ts"
import * as ProcessWarnings from "../layers/observability/processWarnings.ts"
import * as Tracing from "../layers/observability/Tracing.ts"
import * as HealthReporterLive from "../layers/registry/HealthReporter.ts"
import * as TlsLive from "../layers/tls/Tls.ts"
import { AdminServer } from "../services/admin/Admin.ts"
import { type AgentConfig, Config } from "../services/config/Config.ts"
import { EngineProcess } from "../services/engine/EngineProcess.ts"
import { GpuGate } from "../services/engine/GpuGate.ts"
import { Admission } from "../services/grpc/Admission.ts"
import { GrpcServer } from "../services/grpc/GrpcServer.ts"
import { keepaliveTimes } from "../services/grpc/Keepalive.ts"
import { KvBridge } from "../services/kv/KvBridge.ts"
import { splitHostPort } from "../services/net/HostPort.ts"
import { Cordon } from "../services/node/Cordon.ts"
import { Drain } from "../services/node/Drain.ts"
import { EventLoopLag } from "../services/node/EventLoopLag.ts"
import { NodeStatus } from "../services/node/NodeStatus.ts"
import { xidRuleOf } from "../services/node/Xid.ts"
import { TraceExportStatus } from "../services/observability/TraceExports.ts"
import { HealthReporter, type RegistrationStatus } from "../services/registry/HealthReporter.ts"
import { Tls } from "../services/tls/Tls.ts"
import { VERSION } from "../version.ts"
import { hangupConfig } from "./hangup.ts"
import { guardEntry, nvmlWorkerEntry } from "./programPaths.ts"
import { reloadOnHangup, type ShutdownSignals, shutdownSignals } from "./runMain.ts"
import { shutdownBound } from "./shutdownBound.ts"

/**
 * The core services, built before any server listens: config, metrics, the engine supervisor (which
 * spawns the engine at once), the engine client, admission, GPUs, TLS material, drain and cordon levers, NodeStatus.
 */
export const coreLayer = (config: AgentConfig, logLevel?: LogLevel) => {
  // The memory cgroup before the supervisor: each engine run's exit says whether the kernel's OOM killer ended it.
  const base = Layer.mergeAll(Layer.succeed(Config, config), MetricsLive.layer, MemoryCgroupLive.layer)
  const services = Layer.mergeAll(
    // The supervisor spawns engine runs through the orphan guard program; a layer never computes a program's path.
    EngineProcessLive.layer.pipe(Layer.provide(EngineHostLive.layer(guardEntry()))),
    EngineClientLive.layer,
    AdmissionLive.layer,
    Drain.layer,
    // read at start: a cordon persisted in state_dir keeps the node out of traffic across restarts
    CordonLive.layer,
    TlsLive.layer
  )
  // NVML before the plan: the plan's GPUs (CUDA_VISIBLE_DEVICES) come from it; the gate before the supervisor.
  return NodeStatusLive.layer().pipe(
    Layer.provideMerge(EngineStallLive.layer),
    // What the engine says one request can use, read once per Ready period: ListModels and Generate read it.
    Layer.provideMerge(ServedContextLive.layer),
    // Above the supervisor: the bridge follows its runs (a run that ends is retracted from kvcached).
    Layer.provideMerge(KvBridgeLive.layer),
    Layer.provideMerge(services),
    Layer.provideMerge(GpuGateLive.layer),
    Layer.provideMerge(planLayer),
    // NVML runs in a worker thread (a hung NVML call must not stall the relay): the program is handed in, too.
    // Its Xid memory in state_dir: a GPU's fault Xid outlives an agent restart, as the GPU's need for a reset does.
    Layer.provideMerge(
      NvmlLive.layer(nvmlWorkerEntry(), { stateDir: config.agent.state_dir, xidRule: xidRuleOf(config.engine) })
    ),
    // below the supervisor, the watchdog and NodeStatus, which it is told by and tells
    Layer.provideMerge(AgentShortageLive.layer),
    // above Metrics, so its sampler's deaths are counted (layers/observability/backgroundFiber.ts)
    Layer.provideMerge(EventLoopLagLive.layer()),
    Layer.provideMerge(base),
    Layer.provideMerge(Tracing.layer(config)),
    Layer.provideMerge(ProcessWarnings.layer),
    Layer.provideMerge(Logging.layer(config.agent.log_level, logLevel))
  )
}

/**
 * A vLLM prefill node's engine holds each leg's KV for its decode leg, which reads it from this engine after the leg
 * ended (nixl_connector.py: freed once read, or at VLLM_NIXL_ABORT_REQUEST_TIMEOUT): stopped as soon as the last leg
 * ended, every decode leg still to read failed (a P/D soak: even one sent 50 ms after the SIGTERM). So the engine is
 * kept until agent.handoff_timeout after the last handoff, within drain_timeout from the drain's start; a second
 * signal ends the wait. Nothing to wait for on a node that handed off none (SGLang's legs end once their KV is sent).
 */
const handoffGrace = Effect.fnUntraced(function* (startedAt: number, signals: ShutdownSignals) {
  const config = yield* Config
  const last = yield* (yield* GrpcServer).lastHandoffAt
  if (last === undefined) return
  const until = Math.min(
    last + Duration.toMillis(config.agent.handoff_timeout),
    startedAt + Duration.toMillis(config.agent.drain_timeout)
  )
  const waitMs = until - (yield* Clock.currentTimeMillis)
  if (waitMs <= 0) return
  yield* Effect.logInfo(
    `drain: keeping the engine ${Duration.format(Duration.millis(waitMs))} more for decode legs still to read the KV its last prefill legs handed off (agent.handoff_timeout after the last, within agent.drain_timeout)`
  )
  const cut = yield* Effect.raceFirst(
    Effect.as(Effect.sleep(waitMs), false),
    Effect.as(Deferred.await(signals.hurry), true)
  )
  // each step of the drain cut short is said (README)
  if (cut) yield* Effect.logWarning("drain: the wait for decode legs cut short by a second SIGTERM or SIGINT")
})

/**
 * The ordered drain: 1. NOT_SERVING and `draining` in etcd at once; 2. admission closed, in-flight
 * streams run to completion bounded by drain_timeout (a second signal cuts the wait), the rest end
 * with UNAVAILABLE; 3. the engine group stopped and confirmed gone. Step 4 (revoke the lease, close the
 * servers) is the scope's release, which runs right after.
 */
const orderedDrain = Effect.fn("Agent.drain")(function* (why: string, signals: ShutdownSignals) {
  const config = yield* Config
  const drain = yield* Drain
  const grpc = yield* GrpcServer
  const reporter = yield* HealthReporter
  const admission = yield* Admission
  const engine = yield* EngineProcess
  const timeout = config.agent.drain_timeout
  const startedAt = yield* Clock.currentTimeMillis
  // The worst case from here to the exit, every peer hung (shutdownBound.ts): what terminationGracePeriodSeconds needs.
  yield* Effect.logInfo("drain: started", {
    why,
    drain_timeout: Duration.format(timeout),
    exit_within: Duration.format(shutdownBound(config))
  })

  yield* drain.start
  yield* grpc.setHealthOverride("NOT_SERVING")
  yield* reporter.markDraining.pipe(
    Effect.timeout(config.agent.heartbeat),
    Effect.catch((e) => Effect.logWarning("drain: could not write draining to etcd", { error: String(e) }))
  )

  // Calls still queued are refused now (retryable elsewhere, nothing streamed), not started to be cut at drain_timeout.
  yield* admission.close({ rejectQueued: true })
  // A stream holds no admission slot while it hands its last deltas and final to the caller: wait for both.
  const idle = Effect.andThen(admission.awaitIdle, grpc.awaitNoStreams)
  const ended = yield* Effect.raceFirst(
    idle.pipe(
      Effect.timeoutOption(timeout),
      Effect.map((o) => (Option.isSome(o) ? ("idle" as const) : ("timeout" as const)))
    ),
    Deferred.await(signals.hurry).pipe(Effect.as("signal" as const))
  )
  const left = yield* grpc.activeStreams
  if (ended !== "idle" && left > 0) {
    // which cut the wait short: the operator's second signal or agent.drain_timeout (README: each step cut short is
    // logged; a second SIGTERM said nothing)
    yield* Effect.logWarning("drain: ending in-flight streams", {
      streams: left,
      cut_by: ended === "signal" ? "a second SIGTERM or SIGINT" : `agent.drain_timeout (${Duration.format(timeout)})`
    })
    yield* grpc.abortActive("node drained before the stream finished")
  }
  if (ended !== "signal") yield* handoffGrace(startedAt, signals)
  yield* Effect.logInfo("drain: in-flight streams done; stopping the engine")

  yield* engine.stop
  // standalone (no cluster.etcd) holds no lease to revoke: the line says what happens next on this node
  yield* Effect.logInfo(
    config.cluster.etcd.length > 0
      ? "drain: engine stopped; revoking the lease and closing the servers"
      : "drain: engine stopped; closing the servers"
  )
})

/**
 * The agent: servers and registration on top of the core, then wait for a signal or POST /drain,
 * then drain. Servers are acquired before the reporter, so the lease is revoked before they close.
 */
export const daemon = Effect.scoped(
  Effect.gen(function* () {
    const config = yield* Config
    const signals = yield* shutdownSignals
    // check says them too: a plaintext port off loopback lets anyone who reaches it use the engine, a key sent in clear
    for (const exposure of exposureWarnings(config)) yield* Effect.logWarning(exposure)
    const drain = yield* Drain
    const tls = yield* Tls
    // The reporter (and its etcd client) is built after the servers: a SIGHUP before then has no etcd TLS to reload.
    const etcdTlsReload = yield* Deferred.make<Effect.Effect<string | undefined>>()
    const reloadEtcdTls = Effect.flatMap(Deferred.poll(etcdTlsReload), (done) =>
      Option.isSome(done) ? Effect.flatten(done.value) : Effect.undefined
    )
    // The TLS reloads first: the problems they warned of are not repeated by the config file's line (hangupConfig).
    yield* reloadOnHangup(
      Effect.gen(function* () {
        const said = [yield* TlsLive.hangupReload, yield* reloadEtcdTls].filter((p) => p !== undefined)
        yield* hangupConfig(config, said)
      })
    )
    const lag = yield* EventLoopLag
    yield* MetricsLive.mirrorEventLoopLag(lag.sample)
    yield* MetricsLive.mirrorLogDrops(Logging.droppedLogLines)
    // Undefined when traces are not exported: no series, no /status section.
    const traceExports = yield* TraceExportStatus
    yield* MetricsLive.mirrorTraceExports(traceExports)
    yield* MetricsLive.mirrorTls(tls.status)
    yield* MetricsLive.recordBuildInfo({ version: VERSION, engine: config.engine.kind })

    // /status reads the registration once the reporter exists (it is built after the servers).
    const reporterReady = yield* Deferred.make<Effect.Effect<RegistrationStatus>>()
    const registration = Effect.flatten(Deferred.await(reporterReady))
    const bridge = yield* KvBridge
    const gpuGate = yield* GpuGate
    const admission = yield* Admission
    const admin = yield* Layer.build(
      AdminLive.layer({
        extras: {
          registration,
          admission: admission.stats,
          eventLoopLag: lag.sample,
          kv: bridge.status,
          gpuGate: gpuGate.status,
          tls: tls.status,
          ...(traceExports === undefined ? {} : { tracing: traceExports })
        }
      })
    )
    // GetNodeHealth answers with the freshness of the last etcd write, once the reporter (built after the servers)
    // has one
    const lastWritten = yield* Ref.make<Effect.Effect<NodeHealth | undefined>>(Effect.succeed(undefined))
    const grpc = yield* Layer.build(
      GrpcServerLive.layerWith({ tls: tls.serverTls, lastWritten: Effect.flatten(Ref.get(lastWritten)) })
    )
    // before the registration: with listen_grpc's port 0 the node advertises the port the OS picked
    yield* (yield* NodeStatus).grpcBound(Number(splitHostPort(Context.get(grpc, GrpcServer).address).port))
    // Plaintext health for the kubelet's gRPC probe, which cannot do mTLS (layers/grpc/HealthListener.ts).
    if (config.agent.listen_health !== undefined)
      yield* HealthListener.serve(config.agent.listen_health, Context.get(grpc, GrpcServer).healthState, {
        maxConnectionsPerPeer: config.agent.max_connections_per_peer,
        maxConnections: config.agent.max_connections,
        keepalive: keepaliveTimes(config.agent)
      })
    const reporterContext = yield* Layer.build(HealthReporterLive.layer)
    const reporter = Context.get(reporterContext, HealthReporter)
    yield* Deferred.succeed(reporterReady, reporter.status)
    yield* Ref.set(lastWritten, reporter.lastRecord)
    yield* Deferred.succeed(etcdTlsReload, reporter.reloadTls)
    yield* MetricsLive.mirrorRegistration(reporter.status)
    yield* MetricsLive.mirrorNodeState((yield* NodeStatus).snapshot, (yield* Cordon).current)

    yield* Effect.logInfo("cgn-agent serving", {
      node_id: config.agent.node_id,
      grpc: Context.get(grpc, GrpcServer).address,
      admin: Context.get(admin, AdminServer).url,
      engine: config.engine.kind,
      model: config.model.served_name,
      etcd: config.cluster.etcd.length > 0 ? config.cluster.etcd.join(",") : "standalone"
    })

    const why = yield* Effect.raceFirst(
      Deferred.await(signals.requested),
      drain.awaitStarted.pipe(Effect.as("POST /drain"))
    )
    yield* orderedDrain(why, signals).pipe(Effect.provide(Context.merge(grpc, reporterContext)))
  })
)

/**
 * The daemon on a resolved config, with all of its layers. `cgn-agent stopped` is said once the layers too are
 * released (the engine's supervision, the KV link, the span flush, NVML): said as the daemon scope's last finalizer,
 * their own last lines (records kvcached never acknowledged, spans dropped) came after it. A failure says the fatal
 * line instead (fatal.ts).
 */
export const runDaemon = (config: AgentConfig, logLevel?: LogLevel) =>
  daemon.pipe(Effect.provide(coreLayer(config, logLevel)), Effect.tap(Effect.logInfo("cgn-agent stopped")))
