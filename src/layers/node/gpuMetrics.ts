/**
 * The GPU gauges: the Nvml service's GPU list mirrored into the shared Metrics registry at every scrape
 * (per-process series come and go with the processes; a lost GPU keeps only gpu_lost).
 */
import { Effect } from "effect"
import { throttleReasonNames } from "../../services/node/Gpus.ts"
import type { NvmlService } from "../../services/node/Nvml.ts"
import { Metrics } from "../../services/observability/Metrics.ts"

/** Mirrors the GPU list into the gauges at every scrape. */
export const mirrorToMetrics = (service: NvmlService) =>
  Effect.gen(function* () {
    const m = yield* Metrics
    yield* m.onCollect(
      Effect.zipWith(service.gpus, service.unavailable, (gpus, unavailable) => {
        m.nvmlUp.set(unavailable === undefined ? 1 : 0)
        // per-process series come and go with the processes; a lost GPU keeps only gpu_lost; a GPU no longer
        // listed (NVML down, a GPU gone from the host) keeps nothing
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
          m.gpuUtilization.set(labels, g.utilizationPercent / 100)
          m.gpuMemoryUsed.set(labels, g.memoryUsedBytes)
          m.gpuMemoryTotal.set(labels, g.memoryTotalBytes)
          m.gpuTemperature.set(labels, g.temperatureCelsius)
          m.gpuPower.set(labels, g.powerWatts)
          m.gpuPowerLimit.set(labels, g.powerLimitWatts)
          m.gpuEccUncorrected.set(labels, g.eccUncorrected)
          for (const reason of throttleReasonNames) {
            m.gpuThrottled.set({ ...labels, reason }, g.throttleReasons.includes(reason) ? 1 : 0)
          }
          for (const p of g.processes) m.gpuProcessMemory.set({ ...labels, pid: String(p.pid) }, p.usedMemoryBytes)
        }
      })
    )
  })
