/**
 * The GPU gauges: the Nvml service's GPU list mirrored into the shared Metrics registry at every scrape
 * (per-process series come and go with the processes; a lost GPU keeps only gpu_lost and its Xids). A field NVML
 * could not report for a GPU (`unreportedFields`: utilization under MIG, power on some boards, ECC with ECC off) has
 * no series for that GPU, as dcgm-exporter leaves out what a GPU cannot report: a 0 would read as idle, 0 W, 0 errors.
 * The Xid counter, the row-remapping and the page-retirement gauges are registered here, on the shared registry, once
 * per registry.
 */
import { Effect } from "effect"
import { Counter, Gauge, type Registry } from "prom-client"
import type { Gpu } from "../../gen/cgn/agent/v1/agent.ts"
import type { NvmlService } from "../../services/node/Nvml.ts"
import { type GpuField, isUnknown } from "../../services/node/NvmlValues.ts"
import { throttleReasonNames } from "../../services/node/Throttle.ts"
import { applicationXids, defaultXidRule, type XidRule, xidIsFault } from "../../services/node/Xid.ts"
import { METRIC_PREFIX, Metrics } from "../../services/observability/Metrics.ts"

/**
 * The Xid, row-remapping and page-retirement series of `registry`, made at its first use (a second Nvml layer shares
 * them).
 */
const faultSeries = (registry: Registry) => {
  const gpuLabels = ["gpu", "uuid"] as const
  const existing = <T>(name: string): T | undefined => registry.getSingleMetric(`${METRIC_PREFIX}${name}`) as T
  return {
    xidErrors:
      existing<Counter<"gpu" | "uuid" | "xid" | "fault">>("gpu_xid_errors_total") ??
      new Counter({
        name: `${METRIC_PREFIX}gpu_xid_errors_total`,
        help:
          "Xid errors NVML delivered as critical-error events this boot, by Xid, kept across agent restarts in " +
          'agent.state_dir until POST /gpus/clear-xids; fault="true" where the Xid makes the GPU faulty and the node ' +
          `unhealthy: all but the application errors (${applicationXids.join(", ")}), as engine.ignore_xids and ` +
          "fault_xids change that (no series where unsupported)",
        labelNames: [...gpuLabels, "xid", "fault"] as const,
        registers: [registry]
      }),
    remapPending:
      existing<Gauge<"gpu" | "uuid">>("gpu_row_remap_pending") ??
      new Gauge({
        name: `${METRIC_PREFIX}gpu_row_remap_pending`,
        help: "1 while a row remapping waits for a GPU reset (NVML; the node is unhealthy; no series where unsupported)",
        labelNames: gpuLabels,
        registers: [registry]
      }),
    remapFailure:
      existing<Gauge<"gpu" | "uuid">>("gpu_row_remap_failure") ??
      new Gauge({
        name: `${METRIC_PREFIX}gpu_row_remap_failure`,
        help: "1 once a row remapping has failed: replace the GPU (NVML; no series where unsupported)",
        labelNames: gpuLabels,
        registers: [registry]
      }),
    retiredPagesPending:
      existing<Gauge<"gpu" | "uuid">>("gpu_retired_pages_pending") ??
      new Gauge({
        name: `${METRIC_PREFIX}gpu_retired_pages_pending`,
        help:
          "1 while retired memory pages wait for a GPU reset or a reboot (NVML dynamic page retirement, boards " +
          "before Ampere; the node is unhealthy; no series where unsupported)",
        labelNames: gpuLabels,
        registers: [registry]
      })
  }
}

/** Mirrors the GPU list into the gauges at every scrape. */
export const mirrorToMetrics = (service: NvmlService, rule: XidRule = defaultXidRule) =>
  Effect.gen(function* () {
    const m = yield* Metrics
    const faults = faultSeries(m.registry)
    // one gauge per field, each set only where the field is known
    const scalars: ReadonlyArray<readonly [GpuField, Gauge<"gpu" | "uuid">, (g: Gpu) => number]> = [
      ["utilization_percent", m.gpuUtilization, (g) => g.utilizationPercent / 100],
      ["memory_used_bytes", m.gpuMemoryUsed, (g) => g.memoryUsedBytes],
      ["memory_total_bytes", m.gpuMemoryTotal, (g) => g.memoryTotalBytes],
      ["temperature_celsius", m.gpuTemperature, (g) => g.temperatureCelsius],
      ["power_watts", m.gpuPower, (g) => g.powerWatts],
      ["power_limit_watts", m.gpuPowerLimit, (g) => g.powerLimitWatts],
      ["ecc_uncorrected", m.gpuEccUncorrected, (g) => g.eccUncorrected],
      ["row_remap_pending", faults.remapPending, (g) => (g.rowRemapPending ? 1 : 0)],
      ["row_remap_failure", faults.remapFailure, (g) => (g.rowRemapFailure ? 1 : 0)],
      ["retired_pages_pending", faults.retiredPagesPending, (g) => (g.retiredPagesPending ? 1 : 0)]
    ]
    // the index each GPU last had, for the Xid series of a GPU NVML does not list now (see below)
    const lastIndex = new Map<string, string>()
    // the GPUs lost in NVML's last answer, by index: still lost while NVML does not answer (see below)
    const lastLost = new Map<string, { readonly gpu: string; readonly uuid: string }>()
    yield* m.onCollect(
      Effect.map(Effect.all([service.gpus, service.unavailable, service.remembered]), ([gpus, unavailable, kept]) => {
        m.nvmlUp.set(unavailable === undefined ? 1 : 0)
        // Every GPU series is rebuilt from this sample: per-process series come and go with the processes; a lost
        // GPU keeps only gpu_lost and its Xids; a field that became unknown loses its series; a GPU no longer listed (NVML down,
        // a GPU gone from the host) keeps only its Xids.
        for (const g of [m.gpuUtilization, m.gpuMemoryUsed, m.gpuMemoryTotal, m.gpuTemperature, m.gpuPower]) g.reset()
        m.gpuLost.reset()
        m.gpuPowerLimit.reset()
        m.gpuThrottled.reset()
        m.gpuEccUncorrected.reset()
        m.gpuProcessMemory.reset()
        faults.xidErrors.reset()
        faults.remapPending.reset()
        faults.remapFailure.reset()
        faults.retiredPagesPending.reset()
        for (const g of gpus) {
          const labels = { gpu: String(g.index), uuid: g.uuid }
          m.gpuLost.set(labels, g.lost ? 1 : 0)
          // a counter mirrored from the boot's totals (xidMemory.ts): it goes down only when the operator clears it
          for (const x of g.criticalXids) {
            const fault = String(xidIsFault(x.xid, rule))
            faults.xidErrors.inc({ ...labels, xid: String(x.xid), fault }, x.events)
          }
          if (g.lost) continue
          for (const [field, gauge, value] of scalars) if (!isUnknown(g, field)) gauge.set(labels, value(g))
          if (!isUnknown(g, "throttle_reasons")) {
            for (const reason of throttleReasonNames) {
              m.gpuThrottled.set({ ...labels, reason }, g.throttleReasons.includes(reason) ? 1 : 0)
            }
          }
          for (const p of g.processes) m.gpuProcessMemory.set({ ...labels, pid: String(p.pid) }, p.usedMemoryBytes)
        }
        // A GPU lost when NVML last answered stays lost while it does not (a GPU off the bus hangs it): the gate keeps
        // its fault (GpuGate.ts), and the critical alert on gpu_lost must not resolve meanwhile.
        if (unavailable === undefined) {
          lastLost.clear()
          for (const g of gpus) if (g.lost) lastLost.set(String(g.index), { gpu: String(g.index), uuid: g.uuid })
        } else
          for (const [index, labels] of lastLost)
            if (!gpus.some((g) => String(g.index) === index)) m.gpuLost.set(labels, 1)
        // The boot's Xids of a GPU NVML does not list now (NVML down or hung: a GPU off the bus hangs it) stay: the
        // alert on them must not resolve while the fault stands. Labelled with the index a scrape last saw NVML list it
        // at ("" when no scrape has seen it listed since the agent started: the index is learned here, at a scrape).
        for (const g of gpus) if (g.uuid !== "") lastIndex.set(g.uuid, String(g.index))
        for (const k of kept) {
          if (gpus.some((g) => g.uuid === k.uuid)) continue
          const labels = { gpu: lastIndex.get(k.uuid) ?? "", uuid: k.uuid }
          for (const x of k.xids) {
            faults.xidErrors.inc({ ...labels, xid: String(x.xid), fault: String(xidIsFault(x.xid, rule)) }, x.events)
          }
        }
      })
    )
  })
