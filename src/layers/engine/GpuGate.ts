/**
 * The live GpuGate: samples NVML once a second (through the Nvml service's short cache) to keep the fault
 * view current, and runs the wait before each spawn. For an engine that does not run on CUDA GPUs the gate is open
 * and reports nothing; without NVML it holds a start only on a fault it knows (see `watched` below). GPUs the plan
 * could not choose at start (models.x.gpus unset, NVML listing none then) are chosen here, once (see `choice`). Time
 * is Effect's Clock, so a TestClock drives it.
 */
import { Clock, Duration, Effect, Layer, Ref, Stream, SubscriptionRef } from "effect"
import { Config } from "../../services/config/Config.ts"
import { formatPath } from "../../services/config/SchemaProblems.ts"
import { EnginePlan } from "../../services/engine/Engine.ts"
import { GpuGate, type GpuGateStatus, gateProblem, type LateChoice, lateChoice } from "../../services/engine/GpuGate.ts"
import { cudaEnv, engineFault, gateVerdict, refMatches, unlistedRef } from "../../services/node/Gpus.ts"
import { findMig, migRef } from "../../services/node/Mig.ts"
import type { Gpu } from "../../services/node/Nvml.ts"
import { Nvml } from "../../services/node/Nvml.ts"
import { NvmlAbsence, nvmlAbsent } from "../../services/node/NvmlAbsence.ts"
import { xidIsFault, xidRuleOf } from "../../services/node/Xid.ts"
import { rememberedFault } from "../../services/node/XidLedger.ts"
import { Metrics } from "../../services/observability/Metrics.ts"
import { background, RESTART } from "../observability/backgroundFiber.ts"
import { engineOf } from "./backends/index.ts"
import { fillInWarning } from "./EnginePlan.ts"
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
    const cuda = engineOf(config).capabilities.cudaGpus === true
    // The engine's GPUs, fixed for the agent's life: the plan's, else, for an automatic choice the plan could not make
    // (NVML failing or hung at the start, its driver not loaded yet), those chosen before the first spawn once NVML
    // lists GPUs (lateChoice), with the CUDA variables the spawn adds (runEnv); undefined until then.
    interface Choice {
      readonly indices: ReadonlyArray<number>
      readonly env: Readonly<Record<string, string>>
    }
    const choosing = cuda && plan.gpus === undefined && config.model.gpus.length === 0
    const choice = yield* Ref.make<Choice | undefined>(choosing ? undefined : { indices: plan.gpus ?? [], env: {} })
    const indicesNow = Effect.map(Ref.get(choice), (c) => c?.indices ?? [])
    // The engine's MIG device as configured: the plan's GPU is the one that listed it (EnginePlan.ts, Gpus.ts
    // assignGpus), and the gate judges the device, not the whole board other tenants' MIG devices share.
    const mig = (plan.gpus ?? []).length > 0 ? migRef(config.model.gpus) : undefined
    // ... and as NVML names it (`MIG-<uuid>`, also for a configured name of the form before R470: Mig.ts findMig), for
    // the status and NodeHealth capacity.engine_mig_device; the configured name until NVML lists it
    const named = (ref: string, gpus: Parameters<typeof findMig>[0]): string => findMig(gpus, ref)?.device.uuid ?? ref
    const timeoutMs = Duration.toMillis(config.engine.gpu_free_timeout)
    const maxUsedBytes = config.engine.gpu_free_below_mib * 2 ** 20
    // the operator's changes to which Xids are faults ([engine].ignore_xids, fault_xids)
    const xidRule = xidRuleOf(config.engine)
    const status = yield* SubscriptionRef.make<GpuGateStatus>({
      gpus: plan.gpus ?? [],
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
    // named by index is held on a fault of any GPU (XidLedger.ts rememberedFault), until NVML answers or the operator
    // clears it (POST /gpus/clear-xids; the only way where NVML is switched off).
    const watched = (plan.gpus ?? []).length > 0 || cuda
    const nvmlUp = Effect.map(nvml.unavailable, (why) => why === undefined)
    // NVML that will never answer (switched off, not loadable), as a fault it holds says: only the operator frees it
    const absence = Effect.map(nvml.unavailable, (why) =>
      why === undefined || !nvmlAbsent(why)
        ? undefined
        : why === NvmlAbsence.disabled
          ? "NVML is switched off (CGN_NVML_LIBRARY=none)"
          : `NVML is absent (${why})`
    )
    const answered = yield* Ref.make(false)

    /**
     * The choice still to be made (lateChoice) on this sample of NVML, made when it can be: undefined once made.
     * `atSpawn`: a start waits on it, and with no NVML to wait for the engine is given no GPUs (it sees them all), as
     * ever; the poll chooses only from GPUs NVML lists, so that a library loaded by the first start is still used.
     * A wait for NVML given up is not made here but by the start that then goes on (`unpinned`): one a fault holds
     * (NVML's before it went silent, or remembered) still gets its GPUs chosen once NVML answers, held on theirs alone.
     */
    const choose = (gpus: ReadonlyArray<Gpu>, atSpawn: boolean, gaveUp = false) =>
      Effect.gen(function* () {
        if ((yield* Ref.get(choice)) !== undefined) return undefined
        const key = formatPath(["models", config.model.name, "gpus"])
        const unavailable = yield* nvml.unavailable
        const next = lateChoice(key, config.model.tp * config.model.dp, gpus, unavailable, xidRule, gaveUp)
        if (next._tag !== "Chosen" || (next.assignment._tag !== "Assigned" && !atSpawn)) return next
        if (gaveUp && unavailable !== undefined && !nvmlAbsent(unavailable)) return next
        const { assignment } = next
        const made: Choice =
          assignment._tag === "Assigned"
            ? { indices: assignment.indices, env: cudaEnv([], assignment) }
            : { indices: [], env: {} }
        // the poll and a start's wait may both get here: the first to set it made the choice
        if (!(yield* Ref.modify(choice, (c) => (c === undefined ? [true, made] : [false, c])))) return undefined
        if (assignment._tag !== "Assigned") return undefined
        yield* SubscriptionRef.update(status, (s) => ({ ...s, gpus: made.indices }))
        yield* Effect.logInfo("the engine's GPUs chosen now that NVML lists them (none listed at the agent's start)", {
          gpus: made.indices.join(","),
          CUDA_VISIBLE_DEVICES: made.env.CUDA_VISIBLE_DEVICES ?? ""
        })
        if (assignment.faults !== undefined && assignment.faults.length > 0)
          yield* Effect.logWarning(fillInWarning(config.model.name, assignment.faults))
        return undefined
      })
    const timeoutField = { gpu_free_timeout: Duration.format(config.engine.gpu_free_timeout) }
    /** The start that gave up on NVML goes on: no GPUs chosen from then on; false: the poll chose them meanwhile. */
    const unpinned = Effect.gen(function* () {
      const made = yield* Ref.modify(choice, (c) => (c === undefined ? [true, { indices: [], env: {} }] : [false, c]))
      if (made)
        yield* Effect.logWarning(
          "NVML did not answer within engine.gpu_free_timeout: the engine starts without CUDA_VISIBLE_DEVICES (it sees every GPU it is given), and stays so for the agent's life",
          { reason: yield* nvml.unavailable, ...timeoutField }
        )
      return made
    })

    // An assigned GPU missing from the sample (fail closed) or its fault; a MIG device: its GPU's fault, or the device
    // gone from the sample. GPUs not resolved at start (NVML not answering then): those of NVML's list the config
    // names by UUID, or every GPU when it names none (the engine then sees them all).
    const judged = (gpus: ReadonlyArray<Gpu>) =>
      gpus
        .filter((g) => config.model.gpus.length === 0 || config.model.gpus.some((r) => refMatches(r, g)))
        .map((g) => g.index)
    // ... and, not resolved, a configured UUID NVML does not list (a GPU whose UUID it cannot read: Gpus.ts assignGpus)
    const notGatedFault = (gpus: ReadonlyArray<Gpu>) =>
      engineFault(gpus, judged(gpus), xidRule) ?? unlistedRef(config.model.gpus, gpus)
    const faultOf = (gpus: ReadonlyArray<Gpu>, indices: ReadonlyArray<number>) =>
      indices.length > 0 ? engineFault(gpus, indices, xidRule, mig) : notGatedFault(gpus)
    // read again at each sample while NVML has not answered: POST /gpus/clear-xids releases it (NVML may never answer)
    const faultRemembered = Effect.gen(function* () {
      const remembered = yield* nvml.remembered
      return rememberedFault(remembered, config.model.gpus, (xid) => xidIsFault(xid, xidRule), yield* absence)
    })
    const sampleFault = Effect.gen(function* () {
      const up = yield* nvmlUp
      if (up) yield* Ref.set(answered, true)
      // the cached sample, asked for only while NVML answers (a sample asked for opens a failed NVML again)
      const gpus = up ? yield* nvml.gpus : []
      // NVML lists too few GPUs for the choice still to be made: the node is unhealthy, saying so
      const pending = up ? yield* choose(gpus, false) : undefined
      const before = yield* SubscriptionRef.get(status)
      const fault = up
        ? pending?._tag === "Refused"
          ? pending.reason
          : faultOf(gpus, yield* indicesNow)
        : (yield* Ref.get(answered))
          ? before.fault
          : yield* faultRemembered
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
      yield* sampleFault.pipe(
        Effect.delay(POLL),
        Effect.forever,
        background("the GPU fault watch", "the engine's GPUs are no longer watched for faults (Xids, lost GPUs)", {
          restart: RESTART
        }),
        Effect.forkScoped
      )
    }

    // Whatever a wait publishes is withdrawn however it ends: a stop (drain, scope close) interrupts it, and the
    // node must not stay "waiting for GPUs" (gauge 1, and unhealthy once overdue) for a start that is not coming.
    const endWait = Effect.andThen(
      Effect.sync(() => metrics.engineGpuWait.set(0)),
      SubscriptionRef.update(status, (s) => ({ ...s, waiting: undefined }))
    )

    const faultVerdict = (reason: string | undefined) =>
      reason === undefined ? undefined : { _tag: "Faulty" as const, reason }

    /**
     * What a start does on `gpus`, sampled now: its GPUs' verdict (gateVerdict; not chosen: a fault of any, or of those
     * the config names by UUID), a fault known before NVML went silent, or the choice of its GPUs it waits for (`pending`);
     * undefined: it goes on.
     */
    const verdictOf = (gpus: ReadonlyArray<Gpu>, known: string | undefined, pending: LateChoice | undefined) =>
      Effect.gen(function* () {
        if (pending?._tag === "Refused") return { _tag: "Faulty" as const, reason: pending.reason }
        const up = yield* nvmlUp
        if (up && pending === undefined) {
          const indices = yield* indicesNow
          return indices.length > 0
            ? gateVerdict(gpus, indices, maxUsedBytes, yield* Ref.get(previousPgids), pgidOf, xidRule, mig)
            : faultVerdict(notGatedFault(gpus))
        }
        if (!up && known !== undefined)
          return {
            _tag: "Faulty" as const,
            // NVML that will never answer: the fault's words say what frees it (XidLedger.ts rememberedFault)
            reason:
              (yield* absence) === undefined
                ? `${known} (NVML is not answering: the fault stands until it does)`
                : known
          }
        return pending?._tag === "Waiting" ? { _tag: "Choosing" as const, reason: pending.reason } : undefined
      })

    const wait = Effect.gen(function* () {
      const since = yield* Clock.currentTimeMillis
      let logged: "none" | "waiting" | "overdue" = "none"
      let heldLogged = false
      while (true) {
        // never the cached sample: right after a crash it still shows the GPU as it was before
        const gpus = yield* nvml.sampleNow
        const known = (yield* SubscriptionRef.get(status)).fault
        // a wait for NVML past gpu_free_timeout gives up: the engine starts as on a host without NVML
        const gaveUp = (yield* Clock.currentTimeMillis) - since >= timeoutMs
        const pending = yield* choose(gpus, true, gaveUp)
        const verdict = yield* verdictOf(gpus, known, pending)
        // NVML given up (`pending` the choice of none): the start goes on unpinned, unless the poll chose meanwhile
        if (verdict === undefined && (pending?._tag !== "Chosen" || (yield* unpinned))) return
        if (verdict === undefined) continue
        const now = yield* Clock.currentTimeMillis
        if (verdict._tag === "Free") {
          if (logged !== "none") yield* Effect.logInfo("GPUs free; starting the engine", { waited_ms: now - since })
          return
        }
        const overdue = now - since >= timeoutMs
        const holders = verdict._tag === "Held" ? verdict.holders : []
        const forNvml = verdict._tag === "Choosing" ? { forNvml: true } : {}
        yield* SubscriptionRef.update(status, (s) => ({
          ...s,
          waiting: { since, reason: verdict.reason, holders, overdue, ...forNvml }
        }))
        metrics.engineGpuWait.set(1)
        if (pending?._tag === "Chosen" && !heldLogged) {
          heldLogged = true
          yield* Effect.logWarning(
            "NVML did not answer within engine.gpu_free_timeout, and a GPU fault holds the start: the engine's GPUs are chosen once NVML answers (the first tp × dp healthy ones it lists, only their faults holding it); if the fault clears first, it starts without CUDA_VISIBLE_DEVICES",
            { reason: yield* nvml.unavailable, fault: verdict.reason, ...timeoutField }
          )
        }
        if (logged === "none") {
          logged = "waiting"
          yield* Effect.logWarning("waiting for the engine's GPUs before starting it", {
            reason: verdict.reason,
            gpus: (yield* indicesNow).join(","),
            ...(mig === undefined ? {} : { mig })
          })
        }
        if (overdue && logged !== "overdue") {
          logged = "overdue"
          // the reason says which: memory held, or memory NVML cannot report (the GPU cannot be judged free)
          yield* Effect.logError("the engine's GPUs are not free in time; the node is unhealthy until they are", {
            reason: verdict.reason,
            ...timeoutField
          })
        }
        yield* Effect.sleep(POLL)
      }
    })
    const awaitFree = watched ? Effect.ensuring(wait, endWait) : Effect.void

    return GpuGate.of({
      awaitFree,
      runEnv: Effect.map(Ref.get(choice), (c) => c?.env ?? {}),
      spawned: (pgid) => Ref.update(previousPgids, (s) => new Set([...s, pgid])),
      status: SubscriptionRef.get(status),
      problems: SubscriptionRef.changes(status).pipe(Stream.map(gateProblem), Stream.changes)
    })
  })
)
