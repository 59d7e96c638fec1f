/**
 * EngineStall: whether the engine has stopped producing, from two sources. The Generate stall watchdog
 * (layers/grpc/StallWatchdog.ts) reports each stream it ends for engine.stream_idle_timeout and each tick in which
 * some call completed (its engine stream ended as the engine ends one); while the last stall is newer than the last
 * completion, no call has completed since a stream stalled. Completion, not progress: an engine that stalls every
 * stream after a few tokens moves each new stream, and every call on it still fails (a chaos soak's finding). And
 * the engine's own progress counters (EngineProgress.ts, at each metrics scrape): work held and no counter moved for
 * engine.stream_idle_timeout. That one sees what no stream shows: a wedged vLLM prefill engine, whose legs are
 * single non-streaming requests. And the agent's own test completion, sent to an engine that has had no call for
 * engine.idle_probe_after, that got no answer within engine.stream_idle_timeout: an engine that wedged while idle
 * (its counters have no work to stand still on) or a llama-server whose loop hangs (its /metrics, served by that
 * loop, then fails, so the counters say nothing). Any of the three: the engine is wedged, and the node says so
 * (unhealthy, with the reason) instead of taking more calls. A completed call clears all (it is progress); a counter
 * that moves clears the second; a new engine run clears all.
 */
import { Context, type Effect, type Stream } from "effect"
import type { ProgressReading } from "./EngineProgress.ts"

/** The engine's counters stood still with work held (EngineProgress.ts, verdict Stuck). */
export interface NoProgress {
  /** When the engine was taken as not progressing (epoch ms): the scrape that completed the window. */
  readonly since: number
  /** Requests the engine held at that scrape (running + waiting). */
  readonly held: number
  /** The progress counters that stood still. */
  readonly counters: ReadonlyArray<string>
}

/** The test completion sent to an idle engine got no answer (layers/grpc/stallProbe.ts). */
export interface IdleProbeFailure {
  /** When the engine was taken as stalled (epoch ms): the moment the answer was overdue. */
  readonly since: number
  /** How long the engine had had no call when the test was sent (engine.idle_probe_after), for the reason. */
  readonly idleFor: string
}

export interface StallState {
  /** When a stream last ended for sending nothing (epoch ms), or undefined. */
  readonly lastStallAt: number | undefined
  /** When a call last completed (epoch ms), or undefined. */
  readonly lastCompletedAt: number | undefined
  /** Streams ended for sending nothing since a call last completed. */
  readonly stalledStreams: number
  /** When the engine was taken as stalled (the first stall since a call last completed), or undefined. */
  readonly stalledSince: number | undefined
  /** The engine's counters say it makes no progress on the work it holds; absent or undefined: not so. */
  readonly noProgress?: NoProgress | undefined
  /** The test completion sent while idle got no answer; absent or undefined: not so. */
  readonly idleProbe?: IdleProbeFailure | undefined
}

export const noStall: StallState = {
  lastStallAt: undefined,
  lastCompletedAt: undefined,
  stalledStreams: 0,
  stalledSince: undefined
}

/** Whether a stream stalled and no call has completed since. */
const streamsStalled = (s: StallState): boolean =>
  s.lastStallAt !== undefined && (s.lastCompletedAt === undefined || s.lastStallAt > s.lastCompletedAt)

/** Whether the engine is taken as stalled, by any source. */
export const isStalled = (s: StallState): boolean =>
  streamsStalled(s) || s.noProgress !== undefined || s.idleProbe !== undefined

/** When the engine was taken as stalled: the earliest of the sources' starts; undefined while it is not. */
export const stallStart = (s: StallState): number | undefined => {
  const starts = [streamsStalled(s) ? s.stalledSince : undefined, s.noProgress?.since, s.idleProbe?.since].filter(
    (t) => t !== undefined
  )
  return starts.length === 0 ? undefined : Math.min(...starts)
}

/** A stream ended at `now` for sending nothing. */
export const onStall = (s: StallState, now: number): StallState => ({
  ...s,
  lastStallAt: now,
  stalledStreams: s.stalledStreams + 1,
  stalledSince: streamsStalled(s) ? s.stalledSince : now
})

/**
 * A call completed at `now`: the new state when that clears a stall (of any source: a completion is progress),
 * else undefined (nothing changes: completions alone must not wake every subscriber on each watchdog tick).
 */
export const onCompleted = (s: StallState, now: number): StallState | undefined =>
  (s.lastStallAt !== undefined && (s.lastCompletedAt ?? 0) <= s.lastStallAt) ||
  s.noProgress !== undefined ||
  s.idleProbe !== undefined
    ? { lastStallAt: s.lastStallAt, lastCompletedAt: now, stalledStreams: 0, stalledSince: undefined }
    : undefined

/** The counters stood still with work held: the new state, or undefined when the engine is already so taken. */
export const onNoProgress = (s: StallState, np: NoProgress): StallState | undefined =>
  s.noProgress === undefined ? { ...s, noProgress: np } : undefined

/** The idle engine's test completion got no answer: the new state, or undefined when it is already so taken. */
export const onIdleProbeFailed = (s: StallState, f: IdleProbeFailure): StallState | undefined =>
  s.idleProbe === undefined ? { ...s, idleProbe: f } : undefined

/** A progress counter moved: the new state when that clears the counters' stall, else undefined. */
export const onProgress = (s: StallState): StallState | undefined => {
  if (s.noProgress === undefined) return undefined
  const { noProgress: _, ...rest } = s
  return rest
}

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
  const start = stallStart(s)
  if (afterMs <= 0 || start === undefined) return undefined
  const due = start + afterMs
  return preStallMovedAt === undefined || preStallMovedAt < start ? due : Math.max(due, preStallMovedAt + idleMs)
}

/** `a`, `a and b`, `a, b and c`. */
const names = (all: ReadonlyArray<string>): string =>
  all.length <= 1 ? (all[0] ?? "") : `${all.slice(0, -1).join(", ")} and ${all.at(-1)}`

/**
 * The reason the node is unhealthy, or undefined while the engine is not known to be stalled. The streams' reason
 * first when more than one holds (it names the calls that failed), then the counters'.
 */
export const stallProblem = (s: StallState, idleTimeout: string): string | undefined => {
  if (streamsStalled(s))
    return `engine stalled: ${s.stalledStreams} stream(s) sent nothing for ${idleTimeout} (engine.stream_idle_timeout) and no call has completed since`
  const np = s.noProgress
  if (np !== undefined)
    return `engine stalled: it made no progress for ${idleTimeout} (engine.stream_idle_timeout) with ${np.held} request(s) held (${names(np.counters)} unchanged)`
  const ip = s.idleProbe
  return ip === undefined
    ? undefined
    : `engine stalled: a test completion sent after ${ip.idleFor} without calls (engine.idle_probe_after) got no answer within ${idleTimeout} (engine.stream_idle_timeout)`
}

export interface EngineStallService {
  readonly stalled: (now: number) => Effect.Effect<void>
  /** A call completed at `now`; `cause` says what, for the log line of a stall it ends ("a call completed"). */
  readonly completed: (now: number, cause?: string) => Effect.Effect<void>
  /** Some stream read from the engine at `now`; `oldestSince`: when the oldest of them was requested. */
  readonly moved: (now: number, oldestSince: number) => Effect.Effect<void>
  /** The test completion sent to the idle engine got no answer in time. */
  readonly idleProbeFailed: (failure: IdleProbeFailure) => Effect.Effect<void>
  /** One metrics scrape of the engine, for its progress counters (undefined: the scrape failed). */
  readonly scraped: (reading: ProgressReading | undefined) => Effect.Effect<void>
  readonly state: Effect.Effect<StallState>
  /** Every change of state, for prompt health writes. */
  readonly changes: Stream.Stream<StallState>
}

export class EngineStall extends Context.Service<EngineStall, EngineStallService>()("cgn-agent/EngineStall") {}
