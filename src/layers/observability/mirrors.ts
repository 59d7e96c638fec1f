/**
 * Metrics mirrors: series filled at every scrape from another service's own state (the node's, etcd's, TLS's,
 * the trace exporter's, the logger's, the event loop's), so a figure has one source and /metrics cannot drift from
 * /status. Each takes the state as an effect, not the service, so Metrics stays free of dependencies; main wires
 * them. Re-exported by Metrics.ts.
 */
import { Effect, type Scope } from "effect"
import type { LagSample } from "../../services/node/EventLoopLag.ts"
import { NodeStates } from "../../services/node/NodeStatus.ts"
import { Metrics, setCounter, setCounters, setOptional, setStateGauge } from "../../services/observability/Metrics.ts"
import type { TraceExportView } from "../../services/observability/TraceExports.ts"
import { RegistrationStates, type RegistrationStatus } from "../../services/registry/HealthReporter.ts"
import type { TlsStatus } from "../../services/tls/Tls.ts"

/** Sets `cgn_agent_build_info` (1) for this agent's version, the running Node and the engine kind. */
export const recordBuildInfo = (info: { readonly version: string; readonly engine: string }) =>
  Effect.flatMap(Metrics, (m) =>
    Effect.sync(() => m.buildInfo.set({ version: info.version, node_version: process.version, engine: info.engine }, 1))
  )

/** Fills `cgn_agent_event_loop_lag_seconds` at every scrape with the worst lag of the last window. */
export const mirrorEventLoopLag = (lag: Effect.Effect<LagSample>): Effect.Effect<void, never, Metrics | Scope.Scope> =>
  Effect.flatMap(Metrics, (m) => m.onCollect(Effect.map(lag, (s) => m.eventLoopLag.set(s.windowMaxMs / 1000))))

/** Fills `cgn_agent_log_lines_dropped_total` at every scrape from Logging's count. */
export const mirrorLogDrops = (dropped: () => number): Effect.Effect<void, never, Metrics | Scope.Scope> =>
  Effect.flatMap(Metrics, (m) => m.onCollect(Effect.sync(() => setCounter(m.logLinesDropped, dropped()))))

/** Fills `cgn_agent_trace_spans_total` at every scrape while traces are exported (main wires TraceExportStatus). */
export const mirrorTraceExports = (
  status: Effect.Effect<TraceExportView> | undefined
): Effect.Effect<void, never, Metrics | Scope.Scope> =>
  status === undefined
    ? Effect.void
    : Effect.flatMap(Metrics, (m) =>
        m.onCollect(Effect.map(status, (s) => setCounters(m.traceSpans, "outcome", s.spans)))
      )

/**
 * Fills `cgn_agent_node_state` at every scrape from the node's own view, and `cgn_agent_node_cordoned_since_seconds`
 * from the cordon's record. The engine can be ready while the node is not (a stalled stream, a GPU fault, GPU memory
 * held past its timeout): this is the state to alert on.
 */
export const mirrorNodeState = (
  snapshot: Effect.Effect<{ readonly state: string }>,
  cordon: Effect.Effect<{ readonly since: number } | undefined> = Effect.undefined
): Effect.Effect<void, never, Metrics | Scope.Scope> =>
  Effect.flatMap(Metrics, (m) =>
    m.onCollect(
      Effect.zipWith(snapshot, cordon, (h, c) => {
        setStateGauge(m.nodeState, NodeStates, h.state)
        setOptional(m.nodeCordonedSince, c === undefined ? undefined : c.since / 1000)
      })
    )
  )

/** Fills the TLS gauges at every scrape from the Tls service's status (main wires `tls.status`). */
export const mirrorTls = (status: Effect.Effect<TlsStatus>): Effect.Effect<void, never, Metrics | Scope.Scope> =>
  Effect.flatMap(Metrics, (m) =>
    m.onCollect(
      Effect.map(status, (s) => {
        m.tlsReloadFailing.set(s.reloadError === undefined ? 0 : 1)
        setOptional(
          m.tlsCertificateExpiry,
          s.certificateNotAfter === undefined ? undefined : Date.parse(s.certificateNotAfter) / 1000
        )
        setCounter(m.tlsClientConnectionsRefused, s.clientsRefused ?? 0)
      })
    )
  )

/**
 * Mirrors the etcd reporter's registration status into the etcd gauges at every scrape. Takes the status
 * effect rather than the HealthReporter service, so Metrics stays free of dependencies; main wires it:
 * `yield* mirrorRegistration(reporter.status)`.
 */
export const mirrorRegistration = (
  status: Effect.Effect<RegistrationStatus>
): Effect.Effect<void, never, Metrics | Scope.Scope> =>
  Effect.flatMap(Metrics, (m) =>
    m.onCollect(
      Effect.map(status, (s) => {
        m.etcdRegistered.set(s.state === "registered" ? 1 : 0)
        setStateGauge(m.etcdRegistrationState, RegistrationStates, s.state)
        // No lease, no age: the series is absent (a 0 would read as a lease granted just now).
        setOptional(m.etcdLeaseAge, s.leaseAgeMs === undefined ? undefined : s.leaseAgeMs / 1000)
        setCounter(m.etcdLeasesLost, s.leasesLost)
        setCounter(m.etcdFailures, s.writeFailures)
        setOptional(m.etcdKeepaliveAge, s.sinceKeepAliveMs === undefined ? undefined : s.sinceKeepAliveMs / 1000)
      })
    )
  )
