/**
 * EngineStall: whether the engine has stopped producing. The Generate stall watchdog (layers/grpc/StallWatchdog.ts)
 * reports each stream it ends for engine.stream_idle_timeout and each tick in which some call completed (its engine
 * stream ended as the engine ends one); while the last stall is newer than the last completion, no call has
 * completed since a stream stalled: the engine is wedged, and the node says so (unhealthy, with the reason) instead
 * of taking more calls. A new engine run clears it. Completion, not progress: an engine that stalls every stream
 * after a few tokens moves each new stream, and every call on it still fails (a chaos soak's finding).
 * A prefill leg is one non-streaming request the watchdog cannot see move: one past [agent].handoff_timeout that
 * only the engine can be blamed for is a stall too (layers/grpc/EngineLegs.ts reports it); a wedged prefill engine
 * showed nothing else.
 */
import { Context, Duration, type Effect, type Stream } from "effect"
import type { AgentConfig } from "../config/Config.ts"

/** What stalled: a stream that sent nothing, or a prefill leg the engine did not answer in time. */
export type StallKind = "stream" | "prefill"

export interface StallState {
  /** When a stream last ended for sending nothing (epoch ms), or undefined. */
  readonly lastStallAt: number | undefined
  /** When a call last completed (epoch ms), or undefined. */
  readonly lastCompletedAt: number | undefined
  /** Streams ended for sending nothing since a call last completed. */
  readonly stalledStreams: number
  /** Prefill legs the engine did not answer within [agent].handoff_timeout since a call last completed. */
  readonly stalledPrefills: number
  /** When the engine was taken as stalled (the first stall since a call last completed), or undefined. */
  readonly stalledSince: number | undefined
}

export const noStall: StallState = {
  lastStallAt: undefined,
  lastCompletedAt: undefined,
  stalledStreams: 0,
  stalledPrefills: 0,
  stalledSince: undefined
}

/** Whether a stream stalled and no call has completed since. */
export const isStalled = (s: StallState): boolean =>
  s.lastStallAt !== undefined && (s.lastCompletedAt === undefined || s.lastStallAt > s.lastCompletedAt)

/** A stream ended at `now` for sending nothing, or a prefill leg for its deadline (`kind`). */
export const onStall = (s: StallState, now: number, kind: StallKind = "stream"): StallState => ({
  lastStallAt: now,
  lastCompletedAt: s.lastCompletedAt,
  stalledStreams: s.stalledStreams + (kind === "stream" ? 1 : 0),
  stalledPrefills: s.stalledPrefills + (kind === "prefill" ? 1 : 0),
  stalledSince: isStalled(s) ? s.stalledSince : now
})

/**
 * A call completed at `now`: the new state when that clears a stall, else undefined (nothing changes: completions
 * alone must not wake every subscriber on each watchdog tick).
 */
export const onCompleted = (s: StallState, now: number): StallState | undefined =>
  s.lastStallAt !== undefined && (s.lastCompletedAt ?? 0) <= s.lastStallAt
    ? {
        lastStallAt: s.lastStallAt,
        lastCompletedAt: now,
        stalledStreams: 0,
        stalledPrefills: 0,
        stalledSince: undefined
      }
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

/** The two deadlines a stall is told against, as configured and formatted ("5m", "30s"). */
export interface StallTimeouts {
  readonly streamIdle: string
  readonly handoff: string
}

export const stallTimeouts = (config: AgentConfig): StallTimeouts => ({
  streamIdle: Duration.format(config.engine.stream_idle_timeout),
  handoff: Duration.format(config.agent.handoff_timeout)
})

/** The reason the node is unhealthy, or undefined while the engine is not known to be stalled. */
export const stallProblem = (s: StallState, timeouts: StallTimeouts): string | undefined => {
  if (!isStalled(s)) return undefined
  const what = [
    ...(s.stalledStreams > 0
      ? [`${s.stalledStreams} stream(s) sent nothing for ${timeouts.streamIdle} (engine.stream_idle_timeout)`]
      : []),
    ...(s.stalledPrefills > 0
      ? [`${s.stalledPrefills} prefill leg(s) did not finish within ${timeouts.handoff} ([agent].handoff_timeout)`]
      : [])
  ]
  return `engine stalled: ${what.join(", ")} and no call has completed since`
}

export interface EngineStallService {
  /** A stream (`kind` "stream", the default) or a prefill leg stalled at `now`. */
  readonly stalled: (now: number, kind?: StallKind) => Effect.Effect<void>
  readonly completed: (now: number) => Effect.Effect<void>
  /** Some stream read from the engine at `now`; `oldestSince`: when the oldest of them was requested. */
  readonly moved: (now: number, oldestSince: number) => Effect.Effect<void>
  readonly state: Effect.Effect<StallState>
  /** Every change of state, for prompt health writes. */
  readonly changes: Stream.Stream<StallState>
}

export class EngineStall extends Context.Service<EngineStall, EngineStallService>()("cgn-agent/EngineStall") {}
