/**
 * Flap damping of the node state written to etcd (pure). A new state reaches the cluster only after it
 * has been observed `threshold` consecutive times ([agent].health_damping), so one slow probe does not
 * make routers reshuffle traffic. Draining and shutdown bypass it: they are written at once.
 * The first observation is published at once too: before it there is nothing in etcd to protect.
 * Damping is for the liveness probe's verdicts only (ready <-> unhealthy while the engine runs): an engine
 * exit or an engine becoming ready is a fact, not a flap, and is published at once (`isFact`).
 */
import type { NodeState } from "../node/NodeStatus.ts"

export interface DampingState {
  /** The state the cluster sees (undefined before the first observation). */
  readonly published: NodeState | undefined
  /** The engine's phase when `published` was published (NodeHealth.engine.phase), or undefined. */
  readonly publishedPhase?: string | undefined
  /** A state seen but not yet published, and how many consecutive times it was seen. */
  readonly candidate: NodeState | undefined
  readonly count: number
}

export const initialDamping: DampingState = { published: undefined, candidate: undefined, count: 0 }

/** States that are written at once, whatever the threshold. */
export const isImmediate = (s: NodeState): boolean => s === "draining"

/**
 * Folds one observation in. `immediate` forces publication (the shutdown path). `phase`: the engine's phase behind
 * the observation, kept with what is published (isFact reads it).
 */
export const observe = (
  state: DampingState,
  observed: NodeState,
  threshold: number,
  immediate = false,
  phase?: string
): DampingState => {
  if (state.published === undefined || immediate || isImmediate(observed) || threshold <= 1) {
    return { published: observed, publishedPhase: phase, candidate: undefined, count: 0 }
  }
  if (observed === state.published) {
    // An unhealthy published for another reason (a stall, a GPU fault) that the liveness probe now also gives is the
    // probe's from here: when both clear, ready again is the probe's recovery, damped (not a fact published at once).
    const probeUnhealthy = observed === "unhealthy" && phase === "unhealthy"
    const publishedPhase = probeUnhealthy ? phase : state.publishedPhase
    return { published: state.published, publishedPhase, candidate: undefined, count: 0 }
  }
  const count = state.candidate === observed ? state.count + 1 : 1
  if (count >= threshold) return { published: observed, publishedPhase: phase, candidate: undefined, count: 0 }
  return { published: state.published, publishedPhase: state.publishedPhase, candidate: observed, count }
}

/**
 * Whether an observed state is a fact to publish at once rather than a probe verdict to damp, given the
 * engine phase behind it (NodeHealth.engine.phase) and what the cluster sees now. Facts: draining; an operator's
 * cordon and uncordon (leaving "cordoned" is one too: a router must not wait heartbeats to learn of it); the engine
 * exited or is (re)starting; the engine stopped (unhealthy while stopping/stopped); the engine became ready
 * after a start, the crash loop's unhealthy included (a chaos soak saw a recovered engine reach etcd two heartbeats
 * late); a fault outside the probe cleared (a stall, a GPU). Flaps: unhealthy while the engine runs (the liveness
 * probe) and ready again after it. `publishedPhase`: the engine's phase when `published` was published.
 */
export const isFact = (
  observed: NodeState,
  enginePhase: string,
  published: NodeState | undefined,
  publishedPhase?: string
): boolean => {
  if (observed === "draining" || observed === "starting" || observed === "cordoned") return true
  if (published === "cordoned") return true
  if (observed === "unhealthy") return enginePhase !== "unhealthy"
  return published !== "unhealthy" || publishedPhase !== "unhealthy"
}
