/**
 * The KV bridge's Prometheus series, registered on the shared registry here (so
 * services/observability/Metrics.ts stays untouched) and mirrored from the bridge's status at every scrape.
 */
import { Effect } from "effect"
import { Counter, Gauge, type Registry } from "prom-client"
import type { KvBridgeStatus } from "../../services/kv/KvBridge.ts"
import { METRIC_PREFIX, type MetricsService, setCounter } from "../../services/observability/Metrics.ts"

const counter = (registry: Registry, name: string, help: string): Counter =>
  (registry.getSingleMetric(METRIC_PREFIX + name) as Counter | undefined) ??
  new Counter({ name: METRIC_PREFIX + name, help, registers: [registry] })
const gauge = (registry: Registry, name: string, help: string): Gauge =>
  (registry.getSingleMetric(METRIC_PREFIX + name) as Gauge | undefined) ??
  new Gauge({ name: METRIC_PREFIX + name, help, registers: [registry] })

/** The bridge's series, mirrored from its status at every scrape. */
export const registerMetrics = (m: MetricsService, status: Effect.Effect<KvBridgeStatus>) => {
  const r = m.registry
  const forwarded = counter(r, "kv_events_forwarded_total", "KV-event batches cgn-kvcached acknowledged")
  const dropped = counter(r, "kv_events_dropped_total", "KV-event batches lost (queue overflow, undecodable)")
  const gaps = counter(r, "kv_event_gaps_total", "Sequence gaps on the engine's KV-event stream")
  const resyncs = counter(
    r,
    "kv_resyncs_total",
    "Resync records cgn-kvcached acknowledged (each drops a rank's blocks)"
  )
  const stateLosses = counter(
    r,
    "kvcached_state_losses_total",
    "Times cgn-kvcached answered Hello with nothing applied after acknowledging this run's events (lost its state)"
  )
  const connected = gauge(
    r,
    "kvcached_connected",
    "1 while connected to cgn-kvcached and it takes events (a Push acknowledged, or nothing to send)"
  )
  const subscribed = gauge(r, "kv_events_subscribed", "1 while every DP rank's KV-event reader is subscribed")
  const queued = gauge(r, "kv_events_queued", "KV-event batches waiting for cgn-kvcached")
  const queuedBytes = gauge(
    r,
    "kv_events_queued_bytes",
    "Bytes held for cgn-kvcached (unsent, unacknowledged, or held with a running replay's replies)"
  )
  return m.onCollect(
    Effect.map(status, (s) => {
      setCounter(forwarded, s.forwarded)
      setCounter(dropped, s.dropped)
      setCounter(gaps, s.gaps)
      setCounter(resyncs, s.resyncs)
      setCounter(stateLosses, s.kvcachedStateLosses)
      connected.set(s.kvcachedConnected ? 1 : 0)
      subscribed.set(s.subscribed ? 1 : 0)
      queued.set(s.queued)
      queuedBytes.set(s.queuedBytes)
    })
  )
}
