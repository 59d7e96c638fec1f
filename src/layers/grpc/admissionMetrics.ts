/**
 * Admission's Prometheus series, registered on the shared registry here (as kvBridgeMetrics.ts does) and mirrored
 * from Admission's totals at every scrape: `cgn_agent_admission_refusals_total{reason}`, the calls admission ended
 * without sending them to the engine: `overloaded` (slots and queue full), `draining`, and the calls shed for their
 * deadline, `deadline_at_arrival` (RESOURCE_EXHAUSTED) and `deadline_at_slot` (DEADLINE_EXCEEDED). Every reason
 * has a sample from the start, 0 included, so increase() sees the first refusal.
 */
import { Effect } from "effect"
import { Counter, type Registry } from "prom-client"
import type { AdmissionStats } from "../../services/grpc/Admission.ts"
import { METRIC_PREFIX, type MetricsService, setCounters } from "../../services/observability/Metrics.ts"

export const ADMISSION_REFUSALS = `${METRIC_PREFIX}admission_refusals_total`

const counter = (registry: Registry): Counter<"reason"> =>
  (registry.getSingleMetric(ADMISSION_REFUSALS) as Counter<"reason"> | undefined) ??
  new Counter({
    name: ADMISSION_REFUSALS,
    help: "Generate calls admission ended before the engine saw them, by reason: overloaded, draining, deadline_at_arrival, deadline_at_slot",
    labelNames: ["reason"] as const,
    registers: [registry]
  })

/** The totals by reason, as the series' samples. */
export const refusalsByReason = (s: AdmissionStats): Record<string, number> => ({
  overloaded: s.refusedOverloaded,
  draining: s.refusedDraining,
  deadline_at_arrival: s.shedAtArrival,
  deadline_at_slot: s.shedAtSlot
})

/** Mirrors Admission's totals into the series at every scrape (removed when the caller's scope closes). */
export const registerMetrics = (m: MetricsService, stats: Effect.Effect<AdmissionStats>) => {
  const refusals = counter(m.registry)
  return m.onCollect(Effect.map(stats, (s) => setCounters(refusals, "reason", refusalsByReason(s))))
}
