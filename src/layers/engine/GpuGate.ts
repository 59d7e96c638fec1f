/**
 * The live GpuGate: samples NVML once a second (through the Nvml service's short cache) to keep the fault
 * view current, and runs the wait before each spawn. For an engine that does not run on CUDA GPUs the gate is open
 * and reports nothing; without NVML it holds a start only on a fault it knows (see `watched` below). Time is
 * Effect's Clock, so a TestClock drives it.
 */
import { Clock, Duration, Effect, Layer, Ref, Stream, SubscriptionRef } from "effect"
import { Config } from "../../services/config/Config.ts"
import { EnginePlan } from "../../services/engine/Engine.ts"
import { GpuGate, type GpuGateStatus, gateProblem } from "../../services/engine/GpuGate.ts"
import { engineFault, gateVerdict, refMatches, unlistedRef } from "../../services/node/Gpus.ts"
import { findMig, migRef } from "../../services/node/Mig.ts"
import type { Gpu } from "../../services/node/Nvml.ts"
import { Nvml } from "../../services/node/Nvml.ts"
import { xidIsFault, xidRuleOf } from "../../services/node/Xid.ts"
import { rememberedFault } from "../../services/node/XidLedger.ts"
import { Metrics } from "../../services/observability/Metrics.ts"
import { engineFor } from "./backends/index.ts"
import { readStat } from "./processGroup.ts"

const POLL = Duration.seconds(1)

/** The process group of a pid (/proc/PID/stat), or undefined when it is not visible here. */
export const pgidOf = (pid: number): number | undefined => readStat(pid)?.pgrp

export const layer: Layer.Layer<GpuGate, never, Config | EnginePlan | Nvml | Metrics> = Layer.effect(
  GpuGate,
  Effect.gen(function* () {
    const config = yield* Config
    const plan = yield* EnginePlan
    const nvml = yield* Nvml
    const metrics = yield* Metrics
    const indices = plan.gpus ?? []
    // The engine's MIG device as configured: the plan's GPU is the one that listed it (backends/index.ts, Gpus.ts
    // assignGpus), and the gate judges the device, not the whole board other tenants' MIG devices share.
    const mig = indices.length > 0 ? migRef(config.model.gpus) : undefined
    // ... and as NVML names it (`MIG-<uuid>`, also for a configured name of the form before R470: Mig.ts findMig), for
    // the status and NodeHealth capacity.engine_mig_device; the configured name until NVML lists it
    const named = (ref: string, gpus: Parameters<typeof findMig>[0]): string => findMig(gpus, ref)?.device.uuid ?? ref
    const timeoutMs = Duration.toMillis(config.engine.gpu_free_timeout)
    const maxUsedBytes = config.engine.gpu_free_below_mib * 2 ** 20
    // the operator's changes to which Xids are faults ([engine].ignore_xids, fault_xids)
    const xidRule = xidRuleOf(config.engine)
    const status = yield* SubscriptionRef.make<GpuGateStatus>({
      gpus: indices,
      ...(mig === undefined ? {} : { mig: named(mig, yield* nvml.gpus) }),
      waiting: undefined,
      fault: undefined
    })
    const previousPgids = yield* Ref.make<ReadonlySet<number>>(new Set())
    // Gated only while NVML answers: without it there is nothing to wait on, and an NVML failure must not keep
    // the engine from starting or the node from serving (it is shown as nvml_up 0 instead). Except for a fault NVML
    // reported before it stopped answering: a GPU that fell off the bus (Xid 79) hangs NVML, and its fault must not
    // be forgotten with it (nor an engine started on it); it stands until NVML answers again and says otherwise. The
    // same for a fault Xid this boot's record keeps when NVML has not answered since the agent started (an agent
    // restarted on such a host): the GPUs cannot be told by index then, so a CUDA engine whose GPUs are unknown or
    // named by index is held on a fault of any GPU (XidLedger.ts rememberedFault).
    const gated = indices.length > 0
    const watched = gated || engineFor(config.engine.kind).capabilities.cudaGpus === true
    const nvmlUp = Effect.map(nvml.unavailable, (why) => why === undefined)
    const answered = yield* Ref.make(false)

    // An assigned GPU missing from the sample (fail closed) or its fault; a MIG device: its GPU's fault, or the device
    // gone from the sample. GPUs not resolved at start (NVML not answering then): those of NVML's list the config
    // names by UUID, or every GPU when it names none (the engine then sees them all).
    const judged = (gpus: ReadonlyArray<Gpu>) =>
      gated
        ? indices
        : gpus
            .filter((g) => config.model.gpus.length === 0 || config.model.gpus.some((r) => refMatches(r, g)))
            .map((g) => g.index)
    // ... and, not resolved, a configured UUID NVML does not list (a GPU whose UUID it cannot read: Gpus.ts assignGpus)
    const notGatedFault = (gpus: ReadonlyArray<Gpu>) =>
      engineFault(gpus, judged(gpus), xidRule) ?? unlistedRef(config.model.gpus, gpus)
    const faultNow = Effect.map(nvml.gpus, (gpus) =>
      gated ? engineFault(gpus, indices, xidRule, mig) : notGatedFault(gpus)
    )
    const faultRemembered = Effect.map(nvml.remembered, (gpus) =>
      rememberedFault(gpus, config.model.gpus, (xid) => xidIsFault(xid, xidRule))
    )
    const sampleFault = Effect.gen(function* () {
      const up = yield* nvmlUp
      if (up) yield* Ref.set(answered, true)
      const before = yield* SubscriptionRef.get(status)
      const fault = up
        ? yield* faultNow
        : (before.fault ?? ((yield* Ref.get(answered)) ? undefined : yield* faultRemembered))
      if (up && mig !== undefined) {
        const name = named(mig, yield* nvml.gpus)
        if (name !== before.mig) yield* SubscriptionRef.update(status, (s) => ({ ...s, mig: name }))
      }
      if (fault === before.fault) return
      yield* SubscriptionRef.update(status, (s) => ({ ...s, fault }))
      yield* fault === undefined
        ? Effect.logInfo("GPU fault cleared")
        : Effect.logError("GPU fault: the node is unhealthy", { reason: fault })
    })
    if (watched) {
      // the first sample before the first start can be awaited: a remembered fault must hold that start too
      yield* sampleFault
      yield* sampleFault.pipe(Effect.delay(POLL), Effect.forever, Effect.forkScoped)
    }

    // Whatever a wait publishes is withdrawn however it ends: a stop (drain, scope close) interrupts it, and the
    // node must not stay "waiting for GPUs" (gauge 1, and unhealthy once overdue) for a start that is not coming.
    const endWait = Effect.andThen(
      Effect.sync(() => metrics.engineGpuWait.set(0)),
      SubscriptionRef.update(status, (s) => ({ ...s, waiting: undefined }))
    )

    const faultVerdict = (reason: string | undefined) =>
      reason === undefined ? undefined : { _tag: "Faulty" as const, reason }

    const wait = Effect.gen(function* () {
      const since = yield* Clock.currentTimeMillis
      let logged: "none" | "waiting" | "overdue" = "none"
      while (true) {
        // never the cached sample: right after a crash it still shows the GPU as it was before
        const gpus = yield* nvml.sampleNow
        const known = (yield* SubscriptionRef.get(status)).fault
        const verdict = (yield* nvmlUp)
          ? gated
            ? gateVerdict(gpus, indices, maxUsedBytes, yield* Ref.get(previousPgids), pgidOf, xidRule, mig)
            : faultVerdict(notGatedFault(gpus))
          : known === undefined
            ? undefined
            : { _tag: "Faulty" as const, reason: `${known} (NVML is not answering: the fault stands until it does)` }
        if (verdict === undefined) return
        const now = yield* Clock.currentTimeMillis
        if (verdict._tag === "Free") {
          if (logged !== "none") yield* Effect.logInfo("GPUs free; starting the engine", { waited_ms: now - since })
          return
        }
        const overdue = now - since >= timeoutMs
        const holders = verdict._tag === "Held" ? verdict.holders : []
        yield* SubscriptionRef.update(status, (s) => ({
          ...s,
          waiting: { since, reason: verdict.reason, holders, overdue }
        }))
        metrics.engineGpuWait.set(1)
        if (logged === "none") {
          logged = "waiting"
          yield* Effect.logWarning("waiting for the engine's GPUs before starting it", {
            reason: verdict.reason,
            gpus: indices.join(","),
            ...(mig === undefined ? {} : { mig })
          })
        }
        if (overdue && logged !== "overdue") {
          logged = "overdue"
          // the reason says which: memory held, or memory NVML cannot report (the GPU cannot be judged free)
          yield* Effect.logError("the engine's GPUs are not free in time; the node is unhealthy until they are", {
            reason: verdict.reason,
            gpu_free_timeout: Duration.format(config.engine.gpu_free_timeout)
          })
        }
        yield* Effect.sleep(POLL)
      }
    })
    const awaitFree = watched ? Effect.ensuring(wait, endWait) : Effect.void

    return GpuGate.of({
      awaitFree,
      spawned: (pgid) => Ref.update(previousPgids, (s) => new Set([...s, pgid])),
      status: SubscriptionRef.get(status),
      problems: SubscriptionRef.changes(status).pipe(Stream.map(gateProblem), Stream.changes)
    })
  })
)
