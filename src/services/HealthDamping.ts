/**
 * Flap damping of the node state written to etcd (pure). A new state reaches the cluster only after it
 * has been observed `threshold` consecutive times ([agent].health_damping), so one slow probe does not
 * make routers reshuffle traffic. Draining and shutdown bypass it: they are written at once.
 * The first observation is published at once too: before it there is nothing in etcd to protect.
 */
import type { NodeState } from "./NodeStatus.ts"

export interface DampingState {
  /** The state the cluster sees (undefined before the first observation). */
  readonly published: NodeState | undefined
  /** A state seen but not yet published, and how many consecutive times it was seen. */
  readonly candidate: NodeState | undefined
  readonly count: number
}

export const initialDamping: DampingState = { published: undefined, candidate: undefined, count: 0 }

/** States that are written at once, whatever the threshold. */
export const isImmediate = (s: NodeState): boolean => s === "draining"

/** Folds one observation in. `immediate` forces publication (the shutdown path). */
export const observe = (
  state: DampingState,
  observed: NodeState,
  threshold: number,
  immediate = false
): DampingState => {
  if (state.published === undefined || immediate || isImmediate(observed) || threshold <= 1) {
    return { published: observed, candidate: undefined, count: 0 }
  }
  if (observed === state.published) return { published: state.published, candidate: undefined, count: 0 }
  const count = state.candidate === observed ? state.count + 1 : 1
  if (count >= threshold) return { published: observed, candidate: undefined, count: 0 }
  return { published: state.published, candidate: observed, count }
}
