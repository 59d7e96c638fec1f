/**
 * GpuGate: keeps an engine from (re)starting on GPUs that cannot take it. Before every spawn the supervisor
 * awaits `awaitFree`: the engine's GPUs must be healthy, hold no process of an earlier run of this agent's
 * engine, and have their used memory below `[engine].gpu_free_below_mib` (a dead engine's forked worker still
 * holding 70 GiB is the classic crash loop at restart). `problem` is what makes the node unhealthy: a faulty
 * GPU (lost, uncorrected ECC) at once, or memory still held past `[engine].gpu_free_timeout`.
 * The decisions are pure (services/node/Gpus.ts); layers/engine/GpuGate.ts samples NVML and waits.
 */
import { Context, type Effect, type Stream } from "effect"
import type { Gpu } from "../../gen/cgn/agent/v1/agent.ts"
import { type Assignment, assignGpus, type Holder } from "../node/Gpus.ts"
import { nvmlAbsent } from "../node/NvmlAbsence.ts"
import type { XidRule } from "../node/Xid.ts"

export interface GpuWait {
  /** When this wait began (epoch ms, Effect Clock). */
  readonly since: number
  readonly reason: string
  readonly holders: ReadonlyArray<Holder>
  /** Past `gpu_free_timeout`: the node is reported unhealthy while it keeps waiting. */
  readonly overdue: boolean
  /** The wait is for NVML to list the GPUs the engine's are chosen from (`lateChoice`), not for their memory. */
  readonly forNvml?: boolean
}

export interface GpuGateStatus {
  /** NVML indices the engine is given; empty when unknown (no NVML), not chosen yet (`lateChoice`) or not a GPU engine. */
  readonly gpus: ReadonlyArray<number>
  /** The MIG device the engine is given (its UUID), on the GPU in `gpus`; absent: whole GPUs. */
  readonly mig?: string
  /** A (re)start waiting for its GPUs, or undefined. */
  readonly waiting: GpuWait | undefined
  /** A fault on one of the engine's GPUs in the latest sample (lost, uncorrected ECC), or undefined. */
  readonly fault: string | undefined
}

/** The one line that makes the node unhealthy, or undefined. */
export const gateProblem = (s: GpuGateStatus): string | undefined =>
  s.fault ??
  (s.waiting?.overdue
    ? `waiting for ${s.waiting.forNvml === true ? "NVML" : "GPU memory"}: ${s.waiting.reason}`
    : undefined)

/** What a start does about the engine's GPUs when the plan could not choose them (`lateChoice`). */
export type LateChoice =
  /**
   * Chosen now: NVML lists GPUs (`Assigned`); or `Unknown`, the engine seeing them all: no NVML to wait for (no library,
   * switched off), NVML answering with none listed, or the start's wait for it given up.
   */
  | { readonly _tag: "Chosen"; readonly assignment: Assignment }
  /** NVML fails or hangs: the start waits for it, at most engine.gpu_free_timeout. */
  | { readonly _tag: "Waiting"; readonly reason: string }
  /** NVML lists too few GPUs for the engine: the start is held, the node unhealthy. */
  | { readonly _tag: "Refused"; readonly reason: string }

/**
 * The automatic choice of the engine's GPUs (`key`, models.<name>.gpus, unset) when NVML listed none at the agent's
 * start (not answering, its driver not loaded yet): made before the first spawn with assignGpus's rule (the first
 * `needed` healthy GPUs, faulty ones filling in), once NVML lists GPUs; `gpus` and `unavailable` are one sample of it.
 * Spawning at once without CUDA_VISIBLE_DEVICES gave the engine every GPU and held it on a fault of any of them. NVML
 * that answers with no GPUs (a container given none) is taken at its word, as at the start; one that does not answer
 * is waited for until `gaveUp` (the start waited engine.gpu_free_timeout): then, as without NVML, no choice, so that an
 * NVML that never answers (a CPU host with the NVIDIA libraries but no driver) never keeps the engine from serving.
 * That no-choice is kept only by a start that then goes on (layers/engine/GpuGate.ts): one a GPU fault still holds
 * asks again, and NVML's later answer chooses its GPUs.
 */
export const lateChoice = (
  key: string,
  needed: number,
  gpus: ReadonlyArray<Gpu>,
  unavailable: string | undefined,
  rule: XidRule,
  gaveUp = false
): LateChoice => {
  const unknown: LateChoice = { _tag: "Chosen", assignment: { _tag: "Unknown" } }
  if (unavailable !== undefined && nvmlAbsent(unavailable)) return unknown
  if (unavailable !== undefined)
    return gaveUp
      ? unknown
      : {
          _tag: "Waiting",
          reason: `NVML is not answering (${unavailable}): the engine's GPUs (${key} unset) are chosen once it lists them (on a host without GPUs, CGN_NVML_LIBRARY=none)`
        }
  if (gpus.length === 0) return unknown
  const assignment = assignGpus([], needed, gpus, rule)
  return assignment._tag === "Impossible"
    ? { _tag: "Refused", reason: `${key}: ${assignment.reason}` }
    : { _tag: "Chosen", assignment }
}

export interface GpuGateService {
  /** Returns once the engine's GPUs can take a new run; waits (never fails) while they cannot. */
  readonly awaitFree: Effect.Effect<void>
  /**
   * The CUDA variables of GPUs chosen after the agent's start (`lateChoice`), which the plan's env lacks; empty
   * otherwise. Asked after `awaitFree`, for the run it let start; the plan's env goes over it ([engine].env last).
   */
  readonly runEnv: Effect.Effect<Readonly<Record<string, string>>>
  /** Records a spawned run's process group, so its leftovers are recognised before the next start. */
  readonly spawned: (pgid: number) => Effect.Effect<void>
  readonly status: Effect.Effect<GpuGateStatus>
  /** `gateProblem` of every status change (deduplicated), for prompt health writes. */
  readonly problems: Stream.Stream<string | undefined>
}

export class GpuGate extends Context.Service<GpuGate, GpuGateService>()("cgn-agent/GpuGate") {}
