/**
 * The GPU gauges: the Nvml service's GPU list mirrored into the shared Metrics registry at every scrape
 * (per-process series come and go with the processes; a lost GPU keeps only gpu_lost). A field NVML could not
 * report for a GPU (`unreportedFields`: utilization under MIG, power on some boards, ECC with ECC off) has no series
 * for that GPU, as dcgm-exporter leaves out what a GPU cannot report: a 0 would read as idle, 0 W, 0 errors.
 */
import { Effect } from "effect"
import type { Gauge } from "prom-client"
import type { Gpu } from "../../gen/cgn/agent/v1/agent.ts"
import { throttleReasonNames } from "../../services/node/Gpus.ts"
import type { NvmlService } from "../../services/node/Nvml.ts"
import { type GpuField, isUnknown } from "../../services/node/NvmlValues.ts"
import { Metrics } from "../../services/observability/Metrics.ts"

/** Mirrors the GPU list into the gauges at every scrape. */
export const mirrorToMetrics = (service: NvmlService) =>
  Effect.gen(function* () {
    const m = yield* Metrics
    // one gauge per field, each set only where the field is known
    const scalars: ReadonlyArray<readonly [GpuField, Gauge<"gpu" | "uuid">, (g: Gpu) => number]> = [
      ["utilization_percent", m.gpuUtilization, (g) => g.utilizationPercent / 100],
      ["memory_used_bytes", m.gpuMemoryUsed, (g) => g.memoryUsedBytes],
      ["memory_total_bytes", m.gpuMemoryTotal, (g) => g.memoryTotalBytes],
      ["temperature_celsius", m.gpuTemperature, (g) => g.temperatureCelsius],
      ["power_watts", m.gpuPower, (g) => g.powerWatts],
      ["power_limit_watts", m.gpuPowerLimit, (g) => g.powerLimitWatts],
      ["ecc_uncorrected", m.gpuEccUncorrected, (g) => g.eccUncorrected]
    ]
    yield* m.onCollect(
      Effect.zipWith(service.gpus, service.unavailable, (gpus, unavailable) => {
        m.nvmlUp.set(unavailable === undefined ? 1 : 0)
        // Every GPU series is rebuilt from this sample: per-process series come and go with the processes; a lost
        // GPU keeps only gpu_lost; a field that became unknown loses its series; a GPU no longer listed (NVML down,
        // a GPU gone from the host) keeps nothing.
        for (const g of [m.gpuUtilization, m.gpuMemoryUsed, m.gpuMemoryTotal, m.gpuTemperature, m.gpuPower]) g.reset()
        m.gpuLost.reset()
        m.gpuPowerLimit.reset()
        m.gpuThrottled.reset()
        m.gpuEccUncorrected.reset()
        m.gpuProcessMemory.reset()
        for (const g of gpus) {
          const labels = { gpu: String(g.index), uuid: g.uuid }
          m.gpuLost.set(labels, g.lost ? 1 : 0)
          if (g.lost) continue
          for (const [field, gauge, value] of scalars) if (!isUnknown(g, field)) gauge.set(labels, value(g))
          if (!isUnknown(g, "throttle_reasons")) {
            for (const reason of throttleReasonNames) {
              m.gpuThrottled.set({ ...labels, reason }, g.throttleReasons.includes(reason) ? 1 : 0)
            }
          }
          for (const p of g.processes) m.gpuProcessMemory.set({ ...labels, pid: String(p.pid) }, p.usedMemoryBytes)
        }
      })
    )
  })
