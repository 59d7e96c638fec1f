/**
 * Live Nvml service over libnvidia-ml, run in a worker thread (the program at `worker`: programs/nvmlWorker.ts;
 * its side: nvmlSession.ts; one sample: nvmlSample.ts), so that a slow or hung NVML call (nvmlInit_v2 without
 * persistence mode takes seconds on a multi-GPU host, a GPU fallen off the bus hangs NVML calls) never blocks the
 * event loop that relays tokens and renews the etcd lease. This thread keeps the policy: samples on demand, cached
 * for `maxAge`, mirrored with whether NVML is up into the gauges at scrape time (gpuMetrics.ts).
 * `gpus` never waits on NVML (stale-while-revalidate): it is read on the status path (the etcd heartbeat's record,
 * built under the reporter's lock; admin /status and /metrics; gRPC GetNodeHealth), where a wait for a stuck call
 * (up to `callTimeout`) or an on-demand re-open (nvmlInit: seconds) would hold the next lease keepalive, as the
 * engine's /metrics scrape did (engineLoad.ts). It answers the last published answer at once and, once that is
 * `maxAge` old, starts a new sample that publishes when it answers. Only the layer's start waits, for the first.
 * NVML that cannot be opened (no library or no driver yet: a GPU operator installs it after the agent starts)
 * or that fails under a running agent (the device count refused: "Unknown Error" after hours, a driver upgraded
 * underneath) leaves the agent running with no GPUs, and is opened again with backoff (from 1 s, capped at
 * `retryMax`) when a sample is next asked for: no timer of its own. Each distinct reason is logged once.
 * Single flight with a deadline: one request at a time is in the worker; once it is `callTimeout` old, readers get
 * no GPUs and `unavailable` says NVML is not answering (`sampleNow` waits for it until then), and no further request
 * is sent until that one answers (a stuck NVML call cannot be interrupted; more would only be stuck behind it).
 * A worker is started only once the library loads here (a host without the driver starts none), and ended when
 * NVML fails in it. A lost GPU, or one whose UUID query failed, is named by the UUID its index had earlier in the
 * session (NvmlValues.ts nameGpus).
 */
import type { Worker } from "node:worker_threads"
import { Clock, Deferred, Duration, Effect, Layer, Option, Random } from "effect"
import type { Gpu } from "../../gen/cgn/agent/v1/agent.ts"
import { DEFAULT_NVML_LIBRARY, type GpuIdentity, Nvml, type NvmlSampler } from "../../services/node/Nvml.ts"
import { NvmlAbsence, nvmlAbsent } from "../../services/node/NvmlAbsence.ts"
import { nameGpus } from "../../services/node/NvmlValues.ts"
import type { XidRule } from "../../services/node/Xid.ts"
import type { Metrics } from "../../services/observability/Metrics.ts"
import { jitteredBackoffMs } from "../../services/retry/Backoff.ts"
import { mirrorToMetrics } from "./gpuMetrics.ts"
import { type NvmlThread, spawnThread } from "./nvmlThread.ts"
import { bindHardExit } from "./processExit.ts"
import { remembering } from "./xidMemory.ts"

/** How long NVML may take to answer, and so to shut down when a call is in flight (the shutdown bound counts it). */
export const CALL_TIMEOUT = Duration.seconds(10)

export interface NvmlOptions {
  /** Path or soname of the library; default: env CGN_NVML_LIBRARY, else libnvidia-ml.so.1. "" or "none": off. */
  readonly library?: string
  /** How old a sample may be before `gpus` takes a new one. Default 2 seconds. */
  readonly maxAge?: Duration.Input
  /** The longest wait between two tries to open NVML again (default 1 minute; the first is after ~1 s). */
  readonly retryMax?: Duration.Input
  /** How long an open or a whole sample (~15 calls a GPU, the Xid wait) may take before it is stuck: no GPUs. */
  readonly callTimeout?: Duration.Input
  /** Sees each worker thread started (tests count and watch them). */
  readonly onWorker?: (worker: Worker) => void
  /** agent.state_dir, where the GPUs' Xids of this boot are kept across restarts (xidMemory.ts); none: in memory. */
  readonly stateDir?: string
  /** Where the boot id is read (default /proc/sys/kernel/random/boot_id; tests give their own). */
  readonly bootIdFile?: string
  /** The Xid record read, never written (the CLI: the daemon owns it). */
  readonly readOnly?: boolean
  /** Which Xids are faults ([engine].ignore_xids, fault_xids): the Xid counter's `fault` label, the ledger's cap. */
  readonly xidRule?: XidRule
}

const RETRY_BASE_MS = 1_000

/** NVML off for good (disabled, or the FFI module missing from the build): nothing to retry. */
const unavailable = (reason: string): Effect.Effect<NvmlSampler> =>
  Effect.logInfo("NVML not available; reporting no GPUs", { reason }).pipe(
    Effect.as({ gpus: Effect.succeed([]), sampleNow: Effect.succeed([]), unavailable: Effect.succeed(reason) })
  )

const message = (e: unknown) => (e instanceof Error ? e.message : String(e))

interface Settings {
  readonly worker: string
  readonly library: string
  readonly maxAgeMs: number
  readonly retryMaxMs: number
  readonly callTimeout: Duration.Duration
  readonly onWorker: ((worker: Worker) => void) | undefined
  /** The daemon opens NVML again with backoff; the CLI's one look (`check`, `render`) does not, and says not. */
  readonly retries: boolean
}

/** The request in the worker now: `sampleNow` waits for `done` until `deadlineAt`, never longer. */
interface Job {
  readonly done: Deferred.Deferred<ReadonlyArray<Gpu>>
  readonly deadlineAt: number
  /** Set by the first reader that sees `deadlineAt` passed: the request is stuck. */
  stalled: boolean
}

/** What readers get: the last answer, and why NVML was not in use as of it (one value, so the two always agree). */
interface Published {
  readonly gpus: ReadonlyArray<Gpu>
  readonly reason: string | undefined
  readonly at: number
}

const acquire = (s: Settings) =>
  Effect.gen(function* () {
    const koffi = yield* Effect.tryPromise(() => import("koffi")).pipe(Effect.option)
    if (koffi._tag === "None") return yield* unavailable(NvmlAbsence.noFfi)
    const scope = yield* Effect.scope
    /** The worker thread, from its start until it is ended; `ready` while NVML is open in it. */
    let thread: NvmlThread | undefined
    let ready = false
    let job: Job | undefined
    let reason: string | undefined
    let failures = 0
    let nextTryAt = 0
    const logged = new Set<string>()
    /** What each GPU index was called in this NVML session, for naming a GPU once it is lost. */
    const known = new Map<number, GpuIdentity>()
    const callTimeoutMs = Duration.toMillis(s.callTimeout)
    // the deadline is the exchange's, not one call's (a slow sample of many GPUs is stuck too): said so
    const stuckReason = `an NVML sample (an open, or one round of reads over every GPU) has taken over ${Duration.format(s.callTimeout)} (a GPU off the bus?)`

    const logOnce = (why: string, log: Effect.Effect<void>) =>
      Effect.suspend(() => {
        if (logged.has(why)) return Effect.void
        logged.add(why)
        return log
      })

    /**
     * NVML is not usable: the worker (if any; NVML failed in it or is already shut down there) is ended, and the
     * next open, after the backoff, starts a new one.
     */
    const down = (why: string) =>
      Effect.gen(function* () {
        const t = thread
        thread = undefined
        ready = false
        if (t !== undefined) yield* t.terminate
        reason = why
        failures++
        const retryInMs = jitteredBackoffMs(failures, s.retryMaxMs, yield* Random.next, RETRY_BASE_MS)
        nextTryAt = (yield* Clock.currentTimeMillis) + retryInMs
        // No library at all is a host without the NVIDIA driver, often on purpose (CPU engines, a dev box): said,
        // not warned about. NVML present but failing is a GPU host in trouble.
        const line = s.retries
          ? "NVML not available; reporting no GPUs, retrying with backoff"
          : "NVML not available; reporting no GPUs"
        yield* logOnce(
          why,
          nvmlAbsent(why) ? Effect.logInfo(line, { reason: why }) : Effect.logWarning(line, { reason: why })
        )
      })

    /** Starts a worker and opens NVML in it, unless the backoff says not yet. */
    const open = Effect.gen(function* () {
      if ((yield* Clock.currentTimeMillis) < nextTryAt) return
      // dlopen here first, where a missing library fails fast: a host without the NVIDIA driver (CPU engines, dev
      // boxes) pays for no worker thread, whose isolate costs a few MiB.
      try {
        koffi.value.default.load(s.library).unload()
      } catch (e) {
        return yield* down(NvmlAbsence.cannotLoad(s.library, message(e)))
      }
      // A worker stuck in an NVML call must not hold the process's exit: its way out needs koffi, loaded here.
      bindHardExit(koffi.value.default)
      const spawned = yield* Effect.result(spawnThread(s.worker, s.onWorker))
      if (spawned._tag === "Failure") return yield* down(`cannot start the NVML worker: ${spawned.failure.message}`)
      thread = spawned.success
      const reply = yield* spawned.success.call({ op: "open", library: s.library })
      if (reply.op !== "open") return yield* down(`NVML worker ended: ${reply.op === "exited" ? reply.why : reply.op}`)
      if (reply.failed !== undefined) return yield* down(reply.failed)
      ready = true
      reason = undefined
      failures = 0
      known.clear() // indices are this session's enumeration
      yield* Effect.logInfo("NVML loaded", { library: s.library })
    })

    /** One exchange with the worker: open NVML if it is not, then sample. */
    const exchange = Effect.gen(function* () {
      if (!ready) yield* open
      const t = thread
      if (!ready || t === undefined) return []
      const reply = yield* t.call({ op: "sample" })
      if (reply.op !== "sample") {
        yield* down(`NVML worker ended: ${reply.op === "exited" ? reply.why : reply.op}`)
        return []
      }
      if (reply.gone !== undefined) {
        // NVML itself answers no more (the worker has shut it down): open it again later, as after a failed start.
        yield* down(`NVML stopped answering: ${reply.gone}`)
        return []
      }
      reason = undefined // answering again, after a stall too
      // each distinct problem once per process: a GPU without utilization support must not flood the log
      for (const p of reply.problems) yield* logOnce(p, Effect.logWarning("NVML query failed", { problem: p }))
      return nameGpus(reply.gpus, known)
    })

    /** The answer readers get; replaced by the layer's first sample before any reader exists. */
    let published: Published = { gpus: [], reason: "NVML not sampled yet", at: Number.NEGATIVE_INFINITY }
    const publish = (gpus: ReadonlyArray<Gpu>) =>
      Effect.map(Clock.currentTimeMillis, (at) => {
        published = { gpus, reason, at }
      })

    /** The exchange in flight once its deadline has passed: marked stuck, no GPUs published (each reader checks). */
    const stall = (current: Job) =>
      Effect.gen(function* () {
        if (job !== current || current.stalled) return
        current.stalled = true
        reason = stuckReason
        yield* publish([])
        yield* logOnce(
          stuckReason,
          Effect.logWarning("NVML call stuck; reporting no GPUs until its sample completes", { reason: stuckReason })
        )
      })

    /** Marks the exchange in flight stuck if its deadline has passed: what a reader sees is then as at the deadline. */
    const settle = Effect.gen(function* () {
      const current = job
      if (current !== undefined && (yield* Clock.currentTimeMillis) >= current.deadlineAt) yield* stall(current)
    })

    /** Starts an exchange, forked into the layer's scope: however late it answers, its answer is published. */
    const start = (now: number) =>
      Effect.gen(function* () {
        const entry: Job = { done: Deferred.makeUnsafe(), deadlineAt: now + callTimeoutMs, stalled: false }
        job = entry
        yield* exchange.pipe(
          Effect.tap((gpus) =>
            Effect.andThen(
              publish(gpus),
              entry.stalled ? Effect.logInfo("NVML answered again", { reason: stuckReason }) : Effect.void
            )
          ),
          Effect.exit,
          Effect.flatMap((exit) =>
            Effect.sync(() => {
              if (job === entry) job = undefined // before completing: a reader that sees it done sees no job
              Deferred.doneUnsafe(entry.done, exit)
            })
          ),
          Effect.forkIn(scope)
        )
        return entry
      })

    /** Joins the exchange in flight or starts one; waits for it until its deadline, then reports no GPUs. */
    const take = Effect.gen(function* () {
      const now = yield* Clock.currentTimeMillis
      const current = job ?? (yield* start(now))
      // past its deadline, the exchange in flight is stuck: no wait at all
      if (current.deadlineAt > now) {
        const answer = yield* Deferred.await(current.done).pipe(
          Effect.timeoutOption(Duration.millis(current.deadlineAt - now))
        )
        if (Option.isSome(answer)) return answer.value
      }
      yield* stall(current)
      return []
    })

    /** The last answer at once; once it is `maxAge` old, a new sample is started (none while one is in flight). */
    const gpus = Effect.gen(function* () {
      yield* settle
      const now = yield* Clock.currentTimeMillis
      if (job === undefined && now - published.at >= s.maxAgeMs) yield* start(now)
      return published.gpus
    })

    yield* Effect.addFinalizer(() =>
      Effect.gen(function* () {
        yield* settle
        const t = thread
        thread = undefined
        ready = false
        // Behind a stuck call the worker would not read the request to shut down: no wait for it then.
        if (t !== undefined) yield* t.release(job?.stalled === true ? Duration.zero : s.callTimeout)
      })
    )
    // The start waits for the first answer (until its deadline): the plan's GPUs come from it.
    const first = yield* take
    if (ready) yield* Effect.logInfo("NVML sampled", { gpus: first.length })
    return { gpus, sampleNow: take, unavailable: Effect.map(settle, () => published.reason) } satisfies NvmlSampler
  })

const open = (worker: string, options: NvmlOptions) => {
  const library = options.library ?? process.env.CGN_NVML_LIBRARY ?? DEFAULT_NVML_LIBRARY
  const millis = (d: Duration.Input) => Duration.toMillis(Duration.fromInputUnsafe(d))
  const sampler =
    library === "" || library === "none"
      ? unavailable(NvmlAbsence.disabled)
      : acquire({
          worker,
          library,
          maxAgeMs: millis(options.maxAge ?? Duration.seconds(2)),
          retryMaxMs: millis(options.retryMax ?? Duration.minutes(1)),
          callTimeout: Duration.fromInputUnsafe(options.callTimeout ?? CALL_TIMEOUT),
          onWorker: options.onWorker,
          retries: options.readOnly !== true
        })
  // every sample through the Xid memory: an NVML opened again (or an agent restarted) must not forget a GPU's Xids
  return Effect.flatMap(sampler, (s) =>
    remembering(s, {
      stateDir: options.stateDir,
      bootIdFile: options.bootIdFile,
      readOnly: options.readOnly,
      xidRule: options.xidRule
    })
  )
}

/** The live probe, NVML in the worker thread at `worker` (programs/programPaths.ts); needs Metrics for the gauges. */
export const layer = (worker: string, options: NvmlOptions = {}): Layer.Layer<Nvml, never, Metrics> =>
  Layer.effect(
    Nvml,
    Effect.tap(open(worker, options), (service) => mirrorToMetrics(service, options.xidRule))
  )

/** The probe without gauges, for the CLI (`check`, `render`), which has no registry. */
export const layerBare = (worker: string, options: NvmlOptions = {}): Layer.Layer<Nvml> =>
  Layer.effect(Nvml, open(worker, options))
