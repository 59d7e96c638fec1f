/**
 * Metrics: the contract of the agent's one Prometheus registry, the named handles every service writes to (their
 * label sets in the handles' types). The names, help texts and buckets are the live layer's table
 * (layers/observability/Metrics.ts); nothing here reads another service.
 * Gauges that mirror another service's state are filled at scrape time by collect callbacks that the
 * owner of that state registers with `onCollect` (scoped: removed when the owner's scope closes).
 */
import { Context, type Effect, type Scope } from "effect"
import { Counter, type Gauge, type Histogram, type Registry } from "prom-client"
import type { EngineState } from "../engine/EngineProcess.ts"

/** Every metric name starts with this. */
export const METRIC_PREFIX = "cgn_agent_"

/**
 * Labels of the per-request series. `grpc_code` is the gRPC code name (OK, UNAVAILABLE, ...), the label name
 * go-grpc-prometheus and grpc-ecosystem middleware use, so stock gRPC dashboards read it.
 */
export type RequestLabels = "role" | "model" | "grpc_code"

/** `cgn_agent_engine_call_failure_streaks_total`'s help (services/engine/FailedCalls.ts). */
export const CALL_FAILURE_STREAKS =
  "Times engine.failed_calls_unhealthy Generate calls in a row failed in the engine (HTTP 5xx, connection refused or reset, a stream broken off) with none completed, making the node unhealthy"

/**
 * `cgn_agent_background_failures_total{fiber}`: deaths of the agent's background loops (layers/observability/
 * backgroundFiber.ts: a defect, a failure the loop leaves unhandled, an interruption from within), by the name the
 * loop runs under ("the etcd heartbeat": literals in the code, a DP rank's number at most, so a bounded set). Not a
 * handle of the layer's table: `background` runs in layers that may have no Metrics (tests, the layers below it),
 * so it takes the registry from the service when there is one and gets the counter by name, made at its first use
 * (as layers/grpc/admissionMetrics.ts does with its series).
 */
export const BACKGROUND_FAILURES = `${METRIC_PREFIX}background_failures_total`

export const backgroundFailures = (registry: Registry): Counter<"fiber"> =>
  (registry.getSingleMetric(BACKGROUND_FAILURES) as Counter<"fiber"> | undefined) ??
  new Counter({
    name: BACKGROUND_FAILURES,
    help: "Deaths of the agent's background loops (a defect of the agent's: a watcher, a reporter, a reader, a timer stopped), by the loop's name; each is logged at error with its cause, and a restarting loop runs again after its backoff",
    labelNames: ["fiber"] as const,
    registers: [registry]
  })

export interface MetricHandles {
  /** Generate calls finished, by role, model and gRPC status code name. */
  readonly requests: Counter<RequestLabels>
  /** From the call arriving to the first generated text. */
  readonly timeToFirstToken: Histogram<"role" | "model">
  /** From the call arriving to its end (final message or error). */
  readonly requestDuration: Histogram<"role" | "model">
  /** Engine tokens relayed to callers; NodeStatus derives tokens/s from it. */
  readonly relayedTokens: Counter<"model">
  /** Generate calls that ended OK with no usage from the engine (their final carries none). */
  readonly finalsWithoutUsage: Counter<"model">
  /** Engine streams ended because the engine sent nothing for engine.stream_idle_timeout. */
  readonly engineStreamStalls: Counter<"model">
  /** Generate calls ended because the caller read nothing for agent.client_send_timeout while output waited. */
  readonly clientSendTimeouts: Counter<"model">
  /**
   * Times engine.failed_calls_unhealthy Generate calls in a row failed in the engine with none completed, which took
   * the engine as failing calls (services/engine/FailedCalls.ts). A 0 sample from the start.
   */
  readonly engineCallFailureStreaks: Counter<"model">
  /**
   * Times the engine taken as failing calls was held for flapping (services/engine/FlapDamping.ts): neither calls
   * nor the test clear it until the penalty decays. A 0 sample from the start.
   */
  readonly engineFailingHolds: Counter<"model">
  /**
   * gRPC connections closed at accept by reason (services/grpc/ConnectionCaps.ts RefusedReason: peer_limit,
   * total_limit, cooldown), and closed later (services/grpc/FloodRule.ts ClosedReason: for abuse, frame_flood,
   * reset_flood, refusal_flood, control_flood, protocol_error; keepalive_timeout for a client gone). A 0 sample of
   * each reason from the start (guardReport.ts).
   */
  readonly grpcConnectionsRefused: Counter<"reason">
  readonly grpcConnectionsClosed: Counter<"reason">
  /** gRPC connections open on agent.listen_grpc (the ones agent.max_connections counts), set at each scrape. */
  readonly grpcConnections: Gauge
  readonly inflight: Gauge
  readonly queued: Gauge
  /** 1 for the current EngineState tag (lower-case: starting, ready, ...), 0 for the others. */
  readonly engineState: Gauge<"state">
  /** Mirrored from EngineProcess.restarts: set it with `setCounter`. */
  readonly engineRestarts: Counter
  /** Ready engine runs ended on request (EngineProcess.restart), by who asked: stall or admin. */
  readonly engineRestartRequests: Counter<"source">
  /**
   * Kills by the kernel's OOM killer in the agent's memory cgroup (where the engine runs) during engine runs, added
   * as each run ends. Unlabelled: a 0 sample from the start, so increase() sees the first kill.
   */
  readonly engineOomKills: Counter
  /** Exit code of the last engine run; no sample while none has exited with a code (see `setOptional`). */
  readonly engineLastExitCode: Gauge
  /** 1 while the engine is failing (several runs in a row ended before being stable; still retried), else 0. */
  readonly engineFailing: Gauge
  /** 1 while the NodeHealth key is registered in etcd. */
  readonly etcdRegistered: Gauge
  /** 1 for the current registration state (e.g. standalone, registering, registered, backoff), 0 for others. */
  readonly etcdRegistrationState: Gauge<"state">
  /** Seconds since the current lease was granted. */
  readonly etcdLeaseAge: Gauge
  /**
   * Leases etcd reported expired or revoked (HealthReporter's `leasesLost`), mirrored at every scrape: set it with
   * `setCounter`. Each one leaves the key absent until the next keepalive, up to one agent.heartbeat.
   */
  readonly etcdLeasesLost: Counter
  /** Registration steps that failed (HealthReporter's `writeFailures`: a write, a grant or a keepalive), mirrored. */
  readonly etcdFailures: Counter
  /** Seconds since etcd last confirmed the lease alive; no sample without a lease. */
  readonly etcdKeepaliveAge: Gauge
  /** 1 while NVML answers (the GPU series are current); 0 while it is off, cannot be opened or stopped answering. */
  readonly nvmlUp: Gauge
  /** 1 while the last certificate reload failed and the previous certificates are still served, else 0. */
  readonly tlsReloadFailing: Gauge
  /** The served certificate's end of validity, Unix seconds; no sample in plaintext. */
  readonly tlsCertificateExpiry: Gauge
  /**
   * gRPC connections whose client certificate security.allowed_client_names refused (TlsStatus.clientsRefused),
   * mirrored at every scrape: set it with `setCounter`.
   */
  readonly tlsClientConnectionsRefused: Counter
  /** One-hot: the node's state as routers see it (NodeHealth.state). */
  readonly nodeState: Gauge<"state">
  /**
   * Since when an operator has the node cordoned, Unix seconds (the persisted cordon's `since`, so it survives agent
   * restarts, where a `for:` over node_state would start again); no sample when not cordoned.
   */
  readonly nodeCordonedSince: Gauge
  /**
   * Worst event-loop delay in the last completed fixed window of the EventLoopLag service (5 s): reading it
   * resets nothing, so any number of scrapers see the same value.
   */
  readonly eventLoopLag: Gauge
  /** Mirrored from Logging's count of lines dropped while stderr was not read: set it with `setCounter`. */
  readonly logLinesDropped: Counter
  /**
   * Spans of the OTLP trace export by outcome (TraceExports.ts TraceSpanOutcome), mirrored from TraceExportStatus:
   * set it with `setCounters`. No samples while traces are not exported.
   */
  readonly traceSpans: Counter<"outcome">
  readonly engineRunningRequests: Gauge
  readonly engineWaitingRequests: Gauge
  /** 0..1; no sample when the engine does not report it. */
  readonly engineKvCacheUsage: Gauge
  /** Always 1; the labels carry the agent's version, Node's version and the engine kind. */
  readonly buildInfo: Gauge<"version" | "node_version" | "engine">
  /** 0..1 per GPU. */
  readonly gpuUtilization: Gauge<"gpu" | "uuid">
  readonly gpuMemoryUsed: Gauge<"gpu" | "uuid">
  readonly gpuMemoryTotal: Gauge<"gpu" | "uuid">
  readonly gpuTemperature: Gauge<"gpu" | "uuid">
  readonly gpuPower: Gauge<"gpu" | "uuid">
  readonly gpuPowerLimit: Gauge<"gpu" | "uuid">
  /** 1 per active clock throttle reason, 0 for the others. */
  readonly gpuThrottled: Gauge<"gpu" | "uuid" | "reason">
  readonly gpuEccUncorrected: Gauge<"gpu" | "uuid">
  readonly gpuLost: Gauge<"gpu" | "uuid">
  /** Per compute process; reset at every scrape, so exited processes disappear. */
  readonly gpuProcessMemory: Gauge<"gpu" | "uuid" | "pid">
  /** 1 while the engine's (re)start waits for its GPUs to be free. */
  readonly engineGpuWait: Gauge
}

/** One scrape's answer. */
export interface MetricsText {
  readonly contentType: string
  readonly body: string
}

export interface MetricsService extends MetricHandles {
  readonly registry: Registry
  /**
   * Registers a callback run before every scrape (e.g. set gauges from the owner's state). Failures and
   * defects of the callback are logged and do not break the scrape. Removed when the caller's scope closes.
   */
  readonly onCollect: (collect: Effect.Effect<void>) => Effect.Effect<void, never, Scope.Scope>
  /** Runs the collect callbacks, then renders the registry in the Prometheus text format. */
  readonly render: Effect.Effect<MetricsText>
}

export class Metrics extends Context.Service<Metrics, MetricsService>()("cgn-agent/Metrics") {}

/** Sets a counter that mirrors a total kept elsewhere (prom-client counters have no `set`). */
export const setCounter = (counter: Counter, value: number): void => {
  counter.reset()
  if (value > 0) counter.inc(value)
}

/**
 * Sets a counter with one label that mirrors totals kept elsewhere, a sample for each value, 0 included: a series
 * that first appears at 1 shows no increase() for that first 1.
 */
export const setCounters = <L extends string>(
  counter: Counter<L>,
  label: L,
  totals: Readonly<Record<string, number>>
): void => {
  counter.reset()
  for (const [value, total] of Object.entries(totals)) counter.inc({ [label]: value } as Record<L, string>, total)
}

/**
 * Sets an unlabelled gauge, or removes its sample when there is no value: Prometheus reads a missing series
 * as "no value", where a sentinel such as -1 would be averaged and alerted on as if it were a reading.
 */
export const setOptional = (gauge: Gauge, value: number | undefined): void => {
  if (value === undefined) gauge.remove()
  else gauge.set(value)
}

/** Sets a one-hot state gauge: 1 for `current`, 0 for every other known state. */
export const setStateGauge = (gauge: Gauge<"state">, states: ReadonlyArray<string>, current: string): void => {
  for (const state of states) gauge.set({ state }, state === current ? 1 : 0)
  if (!states.includes(current)) gauge.set({ state: current }, 1)
}

// Every EngineState tag, checked by the compiler both ways: a state added to the supervisor must be added here.
const ENGINE_STATE_TAGS: Record<EngineState["_tag"], true> = {
  Starting: true,
  Ready: true,
  Unhealthy: true,
  Restarting: true,
  Stopping: true,
  Stopped: true
}

/** The EngineState tags as metric label values (NodeHealthView.enginePhase spells a state so). */
export const ENGINE_STATES: ReadonlyArray<string> = Object.keys(ENGINE_STATE_TAGS).map((t) => t.toLowerCase())
