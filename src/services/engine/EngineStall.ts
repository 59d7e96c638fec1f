/**
 * EngineStall: whether the engine has stopped producing. The Generate stall watchdog (layers/grpc/StallWatchdog.ts)
 * reports each stream it ends for engine.stream_idle_timeout and each tick in which some call completed (its engine
 * stream ended as the engine ends one); while the last stall is newer than the last completion, no call has
 * completed since a stream stalled: the engine is wedged, and the node says so (unhealthy, with the reason) instead
 * of taking more calls. A new engine run clears it. Completion, not progress: an engine that stalls every stream
 * after a few tokens moves each new stream, and every call on it still fails (a chaos soak's finding).
 */
import { Context, type Effect, type Stream } from "effect"

export interface StallState {
  /** When a stream last ended for sending nothing (epoch ms), or undefined. */
  readonly lastStallAt: number | undefined
  /** When a call last completed (epoch ms), or undefined. */
  readonly lastCompletedAt: number | undefined
  /** Streams ended for sending nothing since a call last completed. */
  readonly stalledStreams: number
  /** When the engine was taken as stalled (the first stall since a call last completed), or undefined. */
  readonly stalledSince: number | undefined
}

export const noStall: StallState = {
  lastStallAt: undefined,
  lastCompletedAt: undefined,
  stalledStreams: 0,
  stalledSince: undefined
}

/** Whether a stream stalled and no call has completed since. */
export const isStalled = (s: StallState): boolean =>
  s.lastStallAt !== undefined && (s.lastCompletedAt === undefined || s.lastStallAt > s.lastCompletedAt)

/** A stream ended at `now` for sending nothing. */
export const onStall = (s: StallState, now: number): StallState => ({
  lastStallAt: now,
  lastCompletedAt: s.lastCompletedAt,
  stalledStreams: s.stalledStreams + 1,
  stalledSince: isStalled(s) ? s.stalledSince : now
})

/**
 * A call completed at `now`: the new state when that clears a stall, else undefined (nothing changes: completions
 * alone must not wake every subscriber on each watchdog tick).
 */
export const onCompleted = (s: StallState, now: number): StallState | undefined =>
  s.lastStallAt !== undefined && (s.lastCompletedAt ?? 0) <= s.lastStallAt
    ? { lastStallAt: s.lastStallAt, lastCompletedAt: now, stalledStreams: 0, stalledSince: undefined }
    : undefined

/**
 * When a stalled engine is due for a restart (epoch ms): `afterMs` (engine.stall_restart_after) past the moment it
 * was taken as stalled, and no sooner than `idleMs` (engine.stream_idle_timeout) after a stream older than the stall
 * last moved (`preStallMovedAt`): such a stream proves the engine generates (a request queued behind long
 * generations stalls while they go on), and the restart would cut it. Streams begun since the stall do not count: an
 * engine that stalls every stream after a few tokens moves each new one. Undefined while it is not stalled, or with
 * `afterMs` 0 (never).
 */
export const stallRestartAt = (
  s: StallState,
  afterMs: number,
  idleMs = 0,
  preStallMovedAt: number | undefined = undefined
): number | undefined => {
  if (afterMs <= 0 || !isStalled(s) || s.stalledSince === undefined) return undefined
  const due = s.stalledSince + afterMs
  return preStallMovedAt === undefined || preStallMovedAt < s.stalledSince
    ? due
    : Math.max(due, preStallMovedAt + idleMs)
}

/** The reason the node is unhealthy, or undefined while the engine is not known to be stalled. */
export const stallProblem = (s: StallState, idleTimeout: string): string | undefined =>
  isStalled(s)
    ? `engine stalled: ${s.stalledStreams} stream(s) sent nothing for ${idleTimeout} (engine.stream_idle_timeout) and no call has completed since`
    : undefined

export interface EngineStallService {
  readonly stalled: (now: number) => Effect.Effect<void>
  readonly completed: (now: number) => Effect.Effect<void>
  /** Some stream read from the engine at `now`; `oldestSince`: when the oldest of them was requested. */
  readonly moved: (now: number, oldestSince: number) => Effect.Effect<void>
  readonly state: Effect.Effect<StallState>
  /** Every change of state, for prompt health writes. */
  readonly changes: Stream.Stream<StallState>
}

export class EngineStall extends Context.Service<EngineStall, EngineStallService>()("cgn-agent/EngineStall") {}
