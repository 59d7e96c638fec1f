/**
 * Live Nvml service over libnvidia-ml (bindings: nvmlBinding.ts; one sample: nvmlSample.ts).
 * Loads the library and runs nvmlInit_v2 at acquire, nvmlShutdown at release; samples on demand, cached
 * for `maxAge`, and mirrors each sample and whether NVML is up into the gauges at scrape time (gpuMetrics.ts).
 * NVML that cannot be opened (no library or no driver yet: a GPU operator installs it after the agent starts)
 * or that fails under a running agent (the device count refused: "Unknown Error" after hours, a driver upgraded
 * underneath) leaves the agent running with no GPUs, and is opened again with backoff (from 1 s, capped at
 * `retryMax`) when a sample is next asked for: no timer of its own. Each distinct reason is logged once.
 */
import { Clock, Duration, Effect, Layer, Random } from "effect"
import type { Gpu } from "../../gen/cgn/agent/v1/agent.ts"
import { DEFAULT_NVML_LIBRARY, Nvml, type NvmlService, nvmlReturnName } from "../../services/node/Nvml.ts"
import type { Metrics } from "../../services/observability/Metrics.ts"
import { jitteredBackoffMs } from "../../services/retry/Backoff.ts"
import { mirrorToMetrics } from "./gpuMetrics.ts"
import { type Binding, bind } from "./nvmlBinding.ts"
import { sample } from "./nvmlSample.ts"

export interface NvmlOptions {
  /** Path or soname of the library; default: env CGN_NVML_LIBRARY, else libnvidia-ml.so.1. "" or "none": off. */
  readonly library?: string
  /** How old a sample may be before `gpus` takes a new one. Default 2 seconds. */
  readonly maxAge?: Duration.Input
  /** The longest wait between two tries to open NVML again (default 1 minute; the first is after ~1 s). */
  readonly retryMax?: Duration.Input
}

const RETRY_BASE_MS = 1_000

/** NVML off for good (disabled, or the FFI module missing from the build): nothing to retry. */
const unavailable = (reason: string): Effect.Effect<NvmlService> =>
  Effect.logInfo("NVML not available; reporting no GPUs", { reason }).pipe(
    Effect.as({ gpus: Effect.succeed([]), sampleNow: Effect.succeed([]), unavailable: Effect.succeed(reason) })
  )

const acquire = (library: string, maxAge: Duration.Input, retryMaxMs: number) =>
  Effect.gen(function* () {
    const koffi = yield* Effect.tryPromise(() => import("koffi")).pipe(Effect.option)
    if (koffi._tag === "None") return yield* unavailable("the koffi FFI module could not be loaded")
    let nvml: Binding | undefined
    let reason: string | undefined
    let failures = 0
    let nextTryAt = 0
    const logged = new Set<string>()
    const close = () => {
      nvml?.shutdown()
      nvml?.unload()
      nvml = undefined
    }
    yield* Effect.addFinalizer(() => Effect.sync(close))

    const down = (why: string) =>
      Effect.gen(function* () {
        reason = why
        failures++
        const retryInMs = jitteredBackoffMs(failures, retryMaxMs, yield* Random.next, RETRY_BASE_MS)
        nextTryAt = (yield* Clock.currentTimeMillis) + retryInMs
        if (logged.has(why)) return
        logged.add(why)
        // No library at all is a host without the NVIDIA driver, often on purpose (CPU engines, a dev box): said,
        // not warned about. NVML present but failing is a GPU host in trouble.
        const line = "NVML not available; reporting no GPUs, retrying with backoff"
        yield* why.startsWith("cannot load")
          ? Effect.logInfo(line, { reason: why })
          : Effect.logWarning(line, { reason: why })
      })

    /** Loads the library and inits NVML, unless the backoff says not yet. */
    const open = Effect.gen(function* () {
      if ((yield* Clock.currentTimeMillis) < nextTryAt) return
      let next: Binding
      try {
        next = bind(koffi.value.default, library)
      } catch (e) {
        return yield* down(`cannot load ${library}: ${e instanceof Error ? e.message : String(e)}`)
      }
      const rc = next.init()
      if (rc !== 0) {
        next.unload()
        return yield* down(`nvmlInit_v2 failed: ${nvmlReturnName(rc)}`)
      }
      nvml = next
      reason = undefined
      failures = 0
      yield* Effect.logInfo("NVML loaded", { library })
    })

    const take = Effect.gen(function* () {
      if (nvml === undefined) yield* open
      const session = nvml
      if (session === undefined) return []
      const problems = new Set<string>()
      let gone: string | undefined
      const gpus = sample(session, problems, (why) => {
        gone = why
      })
      if (gone !== undefined) {
        // NVML itself answers no more: shut it down and open it again later, as after a failed start.
        close()
        yield* down(`NVML stopped answering: ${gone}`)
        return []
      }
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
    if (nvml !== undefined) yield* Effect.logInfo("NVML sampled", { gpus: first.length })
    return { gpus, sampleNow: take, unavailable: Effect.sync(() => reason) } satisfies NvmlService
  })

const open = (options: NvmlOptions) => {
  const library = options.library ?? process.env.CGN_NVML_LIBRARY ?? DEFAULT_NVML_LIBRARY
  return library === "" || library === "none"
    ? unavailable("disabled (library set to none)")
    : acquire(
        library,
        options.maxAge ?? Duration.seconds(2),
        Duration.toMillis(Duration.fromInputUnsafe(options.retryMax ?? Duration.minutes(1)))
      )
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
    unavailable: Effect.succeed(gpus.length === 0 ? "fixed: none" : undefined)
  })
