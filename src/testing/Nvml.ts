/** NVML for tests of the services that read GPUs: a fixed GPU list, no library, no worker thread. */
import { Effect, Layer } from "effect"
import type { Gpu } from "../gen/cgn/agent/v1/agent.ts"
import { Nvml } from "../services/node/Nvml.ts"

/** Every read answers `gpus`; an empty list reads as NVML unavailable, as on a host without the library. */
export const layerFixed = (gpus: ReadonlyArray<Gpu>): Layer.Layer<Nvml> =>
  Layer.succeed(Nvml, {
    gpus: Effect.succeed(gpus),
    sampleNow: Effect.succeed(gpus),
    unavailable: Effect.succeed(gpus.length === 0 ? "fixed: none" : undefined),
    clearXids: () => Effect.succeed([]),
    remembered: Effect.succeed([])
  })
