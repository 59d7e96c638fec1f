/**
 * Metrics layers: build the registry and every handle named in services/observability/Metrics.ts.
 * `layer` adds prom-client's default process metrics under their stock names (`process_*`, `nodejs_*`, no
 * prefix, so stock Node.js dashboards read them), less the ones that break Prometheus conventions (below);
 * event-loop lag is mirrored from the EventLoopLag service by `mirrorEventLoopLag`. `fromRegistry` builds the
 * service over any registry (src/testing/Metrics.ts gives tests a bare one, so they can assert exact series).
 *
 * Naming rules for every agent series (other modules adding metrics follow them; `promtool check metrics`
 * enforces most): prefix `cgn_agent_`; base units in the name (`_seconds`, `_bytes`, `_ratio` for 0..1);
 * `_total` on counters only; no sentinel values (a value that does not exist is a missing series, see
 * `setOptional`); one-hot `{state}` gauges for enumerations; label `grpc_code` for gRPC status code names.
 */
import { Cause, Effect, Layer } from "effect"
import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from "prom-client"
import {
  CALL_FAILURE_STREAKS,
  METRIC_PREFIX,
  type MetricHandles,
  Metrics,
  type MetricsService
} from "../../services/observability/Metrics.ts"

const p = (name: string) => `${METRIC_PREFIX}${name}`

// TTFT spans a cached prefix on a small model (ms) to a long prompt queued behind others (a minute).
const TTFT_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]
// End to end: a few tokens to a long generation.
const DURATION_BUCKETS = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600]

const makeHandles = (registry: Registry): MetricHandles => {
  const registers = [registry]
  const gauge = <L extends string = never>(name: string, help: string, labelNames: ReadonlyArray<L> = []) =>
    new Gauge<L>({ name: p(name), help, labelNames, registers })
  const counter = <L extends string = never>(name: string, help: string, labelNames: ReadonlyArray<L> = []) =>
    new Counter<L>({ name: p(name), help, labelNames, registers })
  const gpuLabels = ["gpu", "uuid"] as const
  return {
    requests: counter("requests_total", "Generate calls finished, by role, model and gRPC status code name", [
      "role",
      "model",
      "grpc_code"
    ] as const),
    timeToFirstToken: new Histogram({
      name: p("time_to_first_token_seconds"),
      help: "Time from receiving a Generate call to its first generated text",
      labelNames: ["role", "model"] as const,
      buckets: TTFT_BUCKETS,
      registers
    }),
    requestDuration: new Histogram({
      name: p("request_duration_seconds"),
      help: "Time from receiving a Generate call to its end",
      labelNames: ["role", "model"] as const,
      buckets: DURATION_BUCKETS,
      registers
    }),
    relayedTokens: counter("relayed_tokens_total", "Engine tokens relayed to callers", ["model"] as const),
    finalsWithoutUsage: counter(
      "finals_without_usage_total",
      "Generate calls that ended OK with no token usage from the engine (their final carries none)",
      ["model"] as const
    ),
    engineStreamStalls: counter(
      "engine_stream_stalls_total",
      "Engine streams ended because the engine sent nothing for engine.stream_idle_timeout",
      ["model"] as const
    ),
    clientSendTimeouts: counter(
      "client_send_timeouts_total",
      "Generate calls ended because the caller read nothing for agent.client_send_timeout while output waited",
      ["model"] as const
    ),
    engineCallFailureStreaks: counter("engine_call_failure_streaks_total", CALL_FAILURE_STREAKS, ["model"] as const),
    engineFailingHolds: counter(
      "engine_failing_holds_total",
      "Times the engine taken as failing calls (engine.failed_calls_unhealthy) was so again and again and was held for flapping: not cleared by completed calls nor the test until its penalty decays",
      ["model"] as const
    ),
    grpcConnectionsRefused: counter(
      "grpc_connections_refused_total",
      "gRPC connections closed at accept, by reason: peer_limit (agent.max_connections_per_peer), total_limit (agent.max_connections), cooldown (the peer flooded in the last 10 s), client_certificate (mTLS: a client certificate that did not verify)",
      ["reason"] as const
    ),
    grpcConnectionsClosed: counter(
      "grpc_connections_closed_total",
      "gRPC connections closed past their accept, by reason: for abuse, frame_flood (frames that carry no call, GOAWAY ENHANCE_YOUR_CALM), reset_flood (stream resets past the budget of the connection, node:http2's rapid-reset guard, or of the peer), refusal_flood (streams refused before any method ran, past 1000 at once then 100/s), control_flood (nghttp2's flood detection), protocol_error; keepalive_timeout (no answer to a keepalive PING: the client is gone), idle_evicted (it ran no call, stuck in its TLS handshake or idle, and a new connection past a cap took its place)",
      ["reason"] as const
    ),
    grpcConnections: gauge("grpc_connections", "gRPC connections open on agent.listen_grpc"),
    inflight: gauge("inflight_requests", "Generate calls running through the agent"),
    queued: gauge("queued_requests", "Generate calls waiting for an admission slot"),
    engineState: gauge("engine_state", "1 for the engine supervisor's current state", ["state"] as const),
    engineRestarts: counter("engine_restarts_total", "Engine restarts since the agent started"),
    engineRestartRequests: counter(
      "engine_restart_requests_total",
      "Ready engine runs ended on request, by source: stall (engine.stall_restart_after) or admin (POST /engine/restart)",
      ["source"] as const
    ),
    engineOomKills: counter(
      "engine_oom_kills_total",
      "Kills by the kernel's OOM killer in the agent's memory cgroup, where the engine runs, during engine runs"
    ),
    engineLastExitCode: gauge(
      "engine_last_exit_code",
      "Exit code of the last engine run (no sample until a run exits with a code)"
    ),
    engineFailing: gauge(
      "engine_failing",
      "1 while the engine is failing: several runs in a row ended before being stable (still retried with backoff)"
    ),
    etcdRegistered: gauge("etcd_registered", "1 while this node's NodeHealth key is registered in etcd"),
    etcdRegistrationState: gauge("etcd_registration_state", "1 for the current etcd registration state", [
      "state"
    ] as const),
    etcdLeaseAge: gauge("etcd_lease_age_seconds", "Seconds since the current etcd lease was granted"),
    etcdLeasesLost: counter("etcd_leases_lost_total", "etcd leases found expired or revoked (the key was gone)"),
    etcdFailures: counter("etcd_failures_total", "etcd registration steps that failed (a write, grant or keepalive)"),
    etcdKeepaliveAge: gauge("etcd_keepalive_age_seconds", "Seconds since etcd last confirmed the node's lease alive"),
    nvmlUp: gauge(
      "nvml_up",
      "1 while NVML answers and the GPU series are current; 0 while it is off, cannot be opened or stopped answering (opened again with backoff)"
    ),
    tlsReloadFailing: gauge(
      "tls_reload_failing",
      "1 while the last certificate reload failed and the previous certificates are still served (retried with backoff)"
    ),
    tlsCertificateExpiry: gauge(
      "tls_certificate_expiry_timestamp_seconds",
      "When the served gRPC certificate stops being valid, Unix seconds (no sample in plaintext)"
    ),
    tlsClientConnectionsRefused: counter(
      "tls_client_connections_refused_total",
      "gRPC connections whose client certificate chained to security.ca_file but was not in security.allowed_client_names (each call on them refused PERMISSION_DENIED)"
    ),
    nodeState: gauge(
      "node_state",
      "1 for the node's current state as routers see it (NodeHealth.state; /readyz answers 200 only when ready)",
      ["state"] as const
    ),
    nodeCordonedSince: gauge(
      "node_cordoned_since_seconds",
      "When an operator cordoned the node (POST /cordon), Unix seconds; no sample when it is not cordoned"
    ),
    eventLoopLag: gauge(
      "event_loop_lag_seconds",
      "Worst event-loop delay in the last completed 5 s window (scrapes do not reset it)"
    ),
    logLinesDropped: counter(
      "log_lines_dropped_total",
      "Log lines dropped because the stderr reader did not take them (more than 1 Mi characters written and not read)"
    ),
    traceSpans: counter(
      "trace_spans_total",
      "Spans of the OTLP trace export: exported, failed (export failed, dropped), queue_full (dropped unsent); no samples without export",
      ["outcome"] as const
    ),
    engineRunningRequests: gauge("engine_running_requests", "Requests running in the engine (engine metrics)"),
    engineWaitingRequests: gauge("engine_waiting_requests", "Requests waiting in the engine (engine metrics)"),
    engineKvCacheUsage: gauge(
      "engine_kv_cache_usage_ratio",
      "Engine KV-cache usage 0..1 (no sample when the engine does not report it)"
    ),
    buildInfo: gauge("build_info", "Always 1: the agent's version, Node's version and the engine kind", [
      "version",
      "node_version",
      "engine"
    ] as const),
    gpuUtilization: gauge(
      "gpu_utilization_ratio",
      "GPU utilization 0..1 (NVML; no series for a GPU that cannot report it, e.g. under MIG)",
      gpuLabels
    ),
    gpuMemoryUsed: gauge(
      "gpu_memory_used_bytes",
      "GPU memory in use (NVML; no series for a GPU that cannot report it)",
      gpuLabels
    ),
    gpuMemoryTotal: gauge("gpu_memory_total_bytes", "GPU memory in total (NVML)", gpuLabels),
    gpuTemperature: gauge(
      "gpu_temperature_celsius",
      "GPU core temperature (NVML; no series for a GPU that cannot report it)",
      gpuLabels
    ),
    gpuPower: gauge("gpu_power_watts", "GPU power draw (NVML; no series for a GPU that cannot report it)", gpuLabels),
    gpuPowerLimit: gauge(
      "gpu_power_limit_watts",
      "GPU enforced power limit (NVML; no series for a GPU that cannot report it)",
      gpuLabels
    ),
    gpuThrottled: gauge("gpu_clock_throttled", "1 while the GPU clocks are held down for this reason (NVML)", [
      ...gpuLabels,
      "reason"
    ] as const),
    gpuEccUncorrected: gauge(
      "gpu_ecc_uncorrected_errors",
      "Uncorrected ECC errors since the driver loaded (NVML, volatile); any makes the node unhealthy",
      gpuLabels
    ),
    gpuLost: gauge("gpu_lost", "1 when NVML reports the GPU lost (fallen off the bus)", gpuLabels),
    gpuProcessMemory: gauge("gpu_process_memory_bytes", "GPU memory held by a compute process (NVML)", [
      ...gpuLabels,
      "pid"
    ] as const),
    engineGpuWait: gauge("engine_gpu_wait", "1 while the engine's (re)start waits for its GPUs to be free")
  }
}

/** The service over `registry`: every agent handle registered there, scrape callbacks run before each render. */
export const fromRegistry = (registry: Registry): Effect.Effect<MetricsService> =>
  Effect.sync(() => {
    const handles = makeHandles(registry)
    const callbacks = new Set<Effect.Effect<void>>()
    const runCallback = (cb: Effect.Effect<void>) =>
      cb.pipe(
        Effect.catchCause((cause) =>
          Effect.logWarning("metrics collect callback failed", { cause: Cause.pretty(cause) })
        )
      )
    return {
      ...handles,
      registry,
      onCollect: (collect) =>
        Effect.acquireRelease(
          Effect.sync(() => {
            // a fresh wrapper per registration, so the same effect may be registered twice
            const entry = collect.pipe(Effect.map(() => undefined))
            callbacks.add(entry)
            return entry
          }),
          (entry) => Effect.sync(() => callbacks.delete(entry))
        ).pipe(Effect.asVoid),
      render: Effect.gen(function* () {
        yield* Effect.forEach([...callbacks], runCallback, { concurrency: "unbounded", discard: true })
        const body = yield* Effect.promise(() => registry.metrics())
        return { contentType: registry.contentType, body }
      })
    } satisfies MetricsService
  })

/**
 * prom-client defaults left out: the `nodejs_active_*_total` series are gauges named like counters
 * (promtool rejects them; `nodejs_active_{handles,requests,resources}{type}` carry the same counts), and the
 * `nodejs_eventloop_lag_{min,max,mean,stddev,p50,p90,p99}_seconds` series reset their histogram at every
 * scrape, so two scrapers (Prometheus and an agent sidecar) each see a fraction of the delays.
 * `cgn_agent_event_loop_lag_seconds` (a fixed window) replaces them; `nodejs_eventloop_lag_seconds` stays.
 */
export const DROPPED_DEFAULT_METRICS = [
  "nodejs_active_handles_total",
  "nodejs_active_requests_total",
  "nodejs_active_resources_total",
  ...["min", "max", "mean", "stddev", "p50", "p90", "p99"].map((s) => `nodejs_eventloop_lag_${s}_seconds`)
] as const

/**
 * The production registry: the agent's series and the default process metrics. Event-loop lag comes from
 * the EventLoopLag service (see `mirrorEventLoopLag`), so the loop is measured once.
 */
export const layer: Layer.Layer<Metrics> = Layer.effect(
  Metrics,
  Effect.gen(function* () {
    const registry = new Registry()
    // prom-client's own event-loop histogram (its timer fires every 10 ms by default: 100 wake-ups a second on an
    // idle agent) feeds only series dropped below; the loop is measured once, by EventLoopLag. An hour's
    // precision leaves that timer all but still.
    collectDefaultMetrics({ register: registry, eventLoopMonitoringPrecision: 3_600_000 })
    for (const name of DROPPED_DEFAULT_METRICS) registry.removeSingleMetric(name)
    return yield* fromRegistry(registry)
  })
)

// The scrape-time mirrors of other services' state (node, etcd, TLS, traces, logs, event loop) live beside this.
export * from "./mirrors.ts"
