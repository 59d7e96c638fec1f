/** NVML for tests of the services that read GPUs: a fixed GPU list, no library, no worker thread. */
import { Effect, Layer } from "effect"
import type { Gpu } from "../gen/cgn/agent/v1/agent.ts"
import { DEFAULT_NVML_LIBRARY, Nvml } from "../services/node/Nvml.ts"
import { NvmlAbsence } from "../services/node/NvmlAbsence.ts"

/** Every read answers `gpus`; an empty list reads as NVML unavailable, as on a host without the library. */
export const layerFixed = (gpus: ReadonlyArray<Gpu>): Layer.Layer<Nvml> =>
  Layer.succeed(Nvml, {
    gpus: Effect.succeed(gpus),
    sampleNow: Effect.succeed(gpus),
    unavailable: Effect.succeed(
      gpus.length === 0 ? NvmlAbsence.cannotLoad(DEFAULT_NVML_LIBRARY, "a fixed list of no GPUs") : undefined
    ),
    clearXids: () => Effect.succeed([]),
    remembered: Effect.succeed([])
  })
