/**
 * GpuGate: keeps an engine from (re)starting on GPUs that cannot take it. Before every spawn the supervisor
 * awaits `awaitFree`: the engine's GPUs must be healthy, hold no process of an earlier run of this agent's
 * engine, and have their used memory below `[engine].gpu_free_below_mib` (a dead engine's forked worker still
 * holding 70 GiB is the classic crash loop at restart). `problem` is what makes the node unhealthy: a faulty
 * GPU (lost, uncorrected ECC) at once, or memory still held past `[engine].gpu_free_timeout`.
 * The decisions are pure (services/node/Gpus.ts); layers/engine/GpuGate.ts samples NVML and waits.
 */
import { Context, type Effect, type Stream } from "effect"
import type { Holder } from "../node/Gpus.ts"

export interface GpuWait {
  /** When this wait began (epoch ms, Effect Clock). */
  readonly since: number
  readonly reason: string
  readonly holders: ReadonlyArray<Holder>
  /** Past `gpu_free_timeout`: the node is reported unhealthy while it keeps waiting. */
  readonly overdue: boolean
}

export interface GpuGateStatus {
  /** NVML indices the engine is given; empty when unknown (no NVML) or not a GPU engine. */
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
  s.fault ?? (s.waiting?.overdue ? `waiting for GPU memory: ${s.waiting.reason}` : undefined)

export interface GpuGateService {
  /** Returns once the engine's GPUs can take a new run; waits (never fails) while they cannot. */
  readonly awaitFree: Effect.Effect<void>
  /** Records a spawned run's process group, so its leftovers are recognised before the next start. */
  readonly spawned: (pgid: number) => Effect.Effect<void>
  readonly status: Effect.Effect<GpuGateStatus>
  /** `gateProblem` of every status change (deduplicated), for prompt health writes. */
  readonly problems: Stream.Stream<string | undefined>
}

export class GpuGate extends Context.Service<GpuGate, GpuGateService>()("cgn-agent/GpuGate") {}
