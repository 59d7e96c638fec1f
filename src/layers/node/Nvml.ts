/**
 * Live Nvml service over libnvidia-ml (bindings: nvmlBinding.ts; one sample: nvmlSample.ts).
 * Loads the library once, nvmlInit_v2 at acquire and nvmlShutdown at release; samples on demand, cached
 * for `maxAge`, and mirrors each sample into the GPU gauges at scrape time (gpuMetrics.ts). Any failure
 * to load or init leaves the agent running with no GPUs and one log line saying why.
 */
import { Duration, Effect, Layer } from "effect"
import type { Gpu } from "../../gen/cgn/agent/v1/agent.ts"
import { DEFAULT_NVML_LIBRARY, Nvml, type NvmlService, nvmlReturnName } from "../../services/node/Nvml.ts"
import type { Metrics } from "../../services/observability/Metrics.ts"
import { mirrorToMetrics } from "./gpuMetrics.ts"
import { type Binding, bind } from "./nvmlBinding.ts"
import { sample } from "./nvmlSample.ts"

export interface NvmlOptions {
  /** Path or soname of the library; default: env CGN_NVML_LIBRARY, else libnvidia-ml.so.1. "" or "none": off. */
  readonly library?: string
  /** How old a sample may be before `gpus` takes a new one. Default 2 seconds. */
  readonly maxAge?: Duration.Input
}

const unavailable = (reason: string): Effect.Effect<NvmlService> =>
  Effect.logInfo("NVML not available; reporting no GPUs", { reason }).pipe(
    Effect.as({ gpus: Effect.succeed([]), sampleNow: Effect.succeed([]), unavailable: reason })
  )

const acquire = (library: string, maxAge: Duration.Input) =>
  Effect.gen(function* () {
    const koffi = yield* Effect.tryPromise(() => import("koffi")).pipe(Effect.option)
    if (koffi._tag === "None") return yield* unavailable("the koffi FFI module could not be loaded")
    let nvml: Binding
    try {
      nvml = bind(koffi.value.default, library)
    } catch (e) {
      return yield* unavailable(`cannot load ${library}: ${e instanceof Error ? e.message : String(e)}`)
    }
    const rc = nvml.init()
    if (rc !== 0) {
      nvml.unload()
      return yield* unavailable(`nvmlInit_v2 failed: ${nvmlReturnName(rc)}`)
    }
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        nvml.shutdown()
        nvml.unload()
      })
    )
    const logged = new Set<string>()
    const take = Effect.gen(function* () {
      const problems = new Set<string>()
      const gpus = sample(nvml, problems)
      // each distinct problem once per process: a GPU without utilization support must not flood the log
      for (const p of problems) {
        if (logged.has(p)) continue
        logged.add(p)
        yield* Effect.logWarning("NVML query failed", { problem: p })
      }
      return gpus
    })
    const gpus = yield* take.pipe(Effect.cachedWithTTL(maxAge))
    const first = yield* gpus
    yield* Effect.logInfo("NVML loaded", { library, gpus: first.length })
    return { gpus, sampleNow: take, unavailable: undefined } satisfies NvmlService
  })

const open = (options: NvmlOptions) => {
  const library = options.library ?? process.env.CGN_NVML_LIBRARY ?? DEFAULT_NVML_LIBRARY
  return library === "" || library === "none"
    ? unavailable("disabled (library set to none)")
    : acquire(library, options.maxAge ?? Duration.seconds(2))
}

/** The live probe; needs Metrics for the GPU gauges. */
export const layer = (options: NvmlOptions = {}): Layer.Layer<Nvml, never, Metrics> =>
  Layer.effect(Nvml, Effect.tap(open(options), mirrorToMetrics))

/** The probe without gauges, for the CLI (`check`, `render`), which has no registry. */
export const layerBare = (options: NvmlOptions = {}): Layer.Layer<Nvml> => Layer.effect(Nvml, open(options))

/** A fixed GPU list, for tests of the services that read GPUs. */
export const layerFixed = (gpus: ReadonlyArray<Gpu>): Layer.Layer<Nvml> =>
  Layer.succeed(Nvml, {
    gpus: Effect.succeed(gpus),
    sampleNow: Effect.succeed(gpus),
    unavailable: gpus.length === 0 ? "fixed: none" : undefined
  })
