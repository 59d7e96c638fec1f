/**
 * EngineStall: whether the engine has stopped producing. The Generate stall watchdog (layers/grpc/StallWatchdog.ts)
 * reports each stream it ends for engine.stream_idle_timeout and each tick in which some stream made progress;
 * while the last stall is newer than the last progress, no stream has moved since a stream stalled: the engine
 * is wedged, and the node says so (unhealthy, with the reason) instead of taking more calls. A new engine run
 * clears it. Progress is seen on the watchdog's coarse tick, never per token.
 */
import { Context, type Effect, type Stream } from "effect"

export interface StallState {
  /** When a stream last ended for sending nothing (epoch ms), or undefined. */
  readonly lastStallAt: number | undefined
  /** When a stream last made progress (epoch ms), or undefined. */
  readonly lastProgressAt: number | undefined
  /** Streams ended for sending nothing since the engine last made progress. */
  readonly stalledStreams: number
}

export const noStall: StallState = { lastStallAt: undefined, lastProgressAt: undefined, stalledStreams: 0 }

/** The reason the node is unhealthy, or undefined while the engine is not known to be stalled. */
export const stallProblem = (s: StallState, idleTimeout: string): string | undefined =>
  s.lastStallAt !== undefined && (s.lastProgressAt === undefined || s.lastStallAt > s.lastProgressAt)
    ? `engine stalled: ${s.stalledStreams} stream(s) sent nothing for ${idleTimeout} (engine.stream_idle_timeout) and no stream has made progress since`
    : undefined

export interface EngineStallService {
  readonly stalled: (now: number) => Effect.Effect<void>
  readonly progressed: (now: number) => Effect.Effect<void>
  readonly state: Effect.Effect<StallState>
  /** Every change of state, for prompt health writes. */
  readonly changes: Stream.Stream<StallState>
}

export class EngineStall extends Context.Service<EngineStall, EngineStallService>()("cgn-agent/EngineStall") {}
