/**
 * Nvml: the GPUs of this host as NVML sees them (memory, utilization, temperature, power, throttling, ECC,
 * processes). Owns the service interface; the pure helpers around NVML values live, free of `effect`, in
 * NvmlValues.ts (re-exported here). The live layer is layers/node/Nvml.ts, which runs NVML in a worker thread
 * (programs/nvmlWorker.ts) so that a slow or hung NVML call never blocks the event loop. A host without NVML is a
 * normal case: `gpus` is then empty, never an error; and an NVML that fails (no driver yet, "Unknown Error" after
 * hours, a driver upgraded underneath) is opened again with backoff, never a reason to stop serving.
 */
import { Context, type Effect, Schema } from "effect"
import type { Gpu, GpuXid } from "../../gen/cgn/agent/v1/agent.ts"
import type { GpuRef } from "./Gpus.ts"

export type { Gpu } from "../../gen/cgn/agent/v1/agent.ts"

/** The GPUs whose Xids `clearXids` forgot, with what each had (its index when NVML lists it now). */
export type ClearedXids = ReadonlyArray<{
  readonly uuid: string
  readonly index: number | undefined
  readonly xids: ReadonlyArray<GpuXid>
}>

/** `clearXids` was asked for a GPU that is neither listed by NVML nor remembered. */
export class UnknownGpu extends Schema.TaggedError<UnknownGpu>()("UnknownGpu", {
  ref: Schema.Union([Schema.Number, Schema.String])
}) {
  override get message(): string {
    return `no GPU ${JSON.stringify(this.ref)} on this host (neither listed by NVML nor with Xids remembered)`
  }
}

/** `clearXids` was asked for a GPU NVML lists but cannot name now (its UUID unreadable, or no GPU listed). */
export class GpuNotIdentified extends Schema.TaggedError<GpuNotIdentified>()("GpuNotIdentified", {
  ref: Schema.Union([Schema.Number, Schema.String]),
  reason: Schema.String
}) {
  override get message(): string {
    return `GPU ${JSON.stringify(this.ref)} cannot be told by its UUID: ${this.reason}`
  }
}

/** The Xid record in agent.state_dir could not be written (or not in time): a clear is refused and undone. */
export class XidRecordError extends Schema.TaggedError<XidRecordError>()("XidRecordError", {
  file: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return `cannot write the GPU Xid record ${this.file}: ${this.reason} (check agent.state_dir)`
  }
}

/** What an NVML sampler answers: the live one (layers/node/Nvml.ts) before its Xid memory is added. */
export interface NvmlSampler {
  /**
   * The GPUs as last sampled; empty on a host without NVML. Never waits on NVML: it is read on the status path (the
   * heartbeat's record, /status, /metrics, GetNodeHealth); a sample older than `maxAge` is answered all the same,
   * while a newer one is taken, and a call stuck past its deadline answers empty.
   */
  readonly gpus: Effect.Effect<ReadonlyArray<Gpu>>
  /**
   * A sample taken now (waits for it, up to the call's deadline), for decisions that must not act on an old one
   * (the GPU wait before a spawn). Not for the status path.
   */
  readonly sampleNow: Effect.Effect<ReadonlyArray<Gpu>>
  /**
   * Why NVML is not in use now (library missing, init failed, NVML gone from under a running agent, a call that has
   * not answered within its deadline, disabled), or undefined while it is. The live layer opens it again with
   * backoff, so this changes over time.
   */
  readonly unavailable: Effect.Effect<string | undefined>
}

export interface NvmlService extends NvmlSampler {
  /**
   * Forgets the Xids of GPU `gpu` (an index or UUID; every GPU when undefined) kept for this boot
   * (layers/node/xidMemory.ts): the operator has reset it (nvidia-smi -r). Later Xids count again. Answered once the
   * record in state_dir says so (XidRecordError, and nothing cleared, when it cannot).
   */
  readonly clearXids: (gpu?: GpuRef) => Effect.Effect<ClearedXids, UnknownGpu | GpuNotIdentified | XidRecordError>
  /**
   * The Xids kept for this boot, by GPU UUID, whether NVML lists the GPU now or not (the record in agent.state_dir
   * read at start included): what the GPU gate holds a start on while NVML has not answered since the agent started.
   */
  readonly remembered: Effect.Effect<ReadonlyArray<{ readonly uuid: string; readonly xids: ReadonlyArray<GpuXid> }>>
}

export class Nvml extends Context.Service<Nvml, NvmlService>()("cgn-agent/Nvml") {}

/** The library loaded when nothing else is configured (the driver ships it under this soname). */
export const DEFAULT_NVML_LIBRARY = "libnvidia-ml.so.1"

export {
  cString,
  type GpuIdentity,
  gpuWith,
  nameGpus,
  nvmlReturnName,
  toNumber
} from "./NvmlValues.ts"
