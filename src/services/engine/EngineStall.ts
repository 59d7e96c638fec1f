/**
 * EngineStall: whether the engine has stopped producing, from two sources. The Generate stall watchdog
 * (layers/grpc/StallWatchdog.ts, through the engine's watch, layers/engine/engineWatch.ts) reports each stream it ends for engine.stream_idle_timeout and each tick in which
 * some call completed (its engine stream ended as the engine ends one); while the last stall is newer than the last
 * completion, no call has completed since a stream stalled. Completion, not progress: an engine that stalls every
 * stream after a few tokens moves each new stream, and every call on it still fails (a chaos soak's finding). And
 * the engine's own progress counters (EngineProgress.ts, at each metrics scrape): work held and no counter moved for
 * engine.stream_idle_timeout. That one sees what no stream shows: a wedged vLLM prefill engine, whose legs are
 * single non-streaming requests. And the agent's own test completion that got no answer within
 * engine.stream_idle_timeout: sent to an engine that has had no call for engine.idle_probe_after, it finds one that
 * wedged while idle (its counters have no work to stand still on) or a llama-server whose loop hangs (its /metrics,
 * served by that loop, then fails, so the counters say nothing); sent to each data-parallel rank after a stream
 * stalled, it finds the rank that hangs alone while the others complete calls. Any of the three: the engine is
 * wedged, and the node says so (unhealthy, with the reason) instead of taking more calls. A fourth source is not a
 * wedge but is shown and healed as one: engine.failed_calls_unhealthy calls in a row that the engine failed
 * (FailedCalls.ts), an engine that answers every call with an error (held for flapping, FlapDamping.ts, when taken so
 * again and again: then not cleared by completions nor the test). A completed call clears all (it is progress) but
 * a hung rank's test, which only a test every rank completes clears; a counter that moves clears the second; a new
 * engine run clears all.
 */
import { Context, type Effect, type Stream } from "effect"
import type { ProgressReading } from "./EngineProgress.ts"
import { type FailingCalls, failingProblem } from "./FailedCalls.ts"

/** The engine's counters stood still with work held (EngineProgress.ts, verdict Stuck). */
export interface NoProgress {
  /** When the engine was taken as not progressing (epoch ms): the scrape that completed the window. */
  readonly since: number
  /** Requests the engine held at that scrape (running + waiting). */
  readonly held: number
  /** The progress counters that stood still. */
  readonly counters: ReadonlyArray<string>
}

/** The agent's test completion got no answer (layers/engine/stallProbe.ts). */
export interface TestFailure {
  /** When the engine was taken as stalled (epoch ms): the moment the answer was overdue. */
  readonly since: number
  /** Why it was sent, for the reason: "after 2m without calls (engine.idle_probe_after)", "after a stream stalled". */
  readonly sentAfter: string
  /**
   * The data-parallel ranks that did not answer, where the test went to each rank and some answered: a call another
   * rank completed says nothing of these. Undefined: the engine as a whole (no rank, or none answered).
   */
  readonly ranks?: ReadonlyArray<number> | undefined
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
  /** The agent's test completion got no answer; absent or undefined: not so. */
  readonly testFailed?: TestFailure | undefined
  /** engine.failed_calls_unhealthy calls in a row failed in the engine (FailedCalls.ts); absent or undefined: not so. */
  readonly failing?: FailingCalls | undefined
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
  streamsStalled(s) || s.noProgress !== undefined || s.testFailed !== undefined || s.failing !== undefined

/** When the engine was taken as stalled: the earliest of the sources' starts; undefined while it is not. */
export const stallStart = (s: StallState): number | undefined => {
  const starts = [
    streamsStalled(s) ? s.stalledSince : undefined,
    s.noProgress?.since,
    s.testFailed?.since,
    s.failing?.since
  ].filter((t) => t !== undefined)
  return starts.length === 0 ? undefined : Math.min(...starts)
}

/** Whether failing calls (FailedCalls.ts) are the engine's only stall: a stream, its counters and the test are fine. */
export const onlyFailing = (s: StallState): boolean =>
  s.failing !== undefined && !streamsStalled(s) && s.noProgress === undefined && s.testFailed === undefined

/** `streams` streams ended at `now` for sending nothing (one watchdog tick's, together). */
export const onStall = (s: StallState, now: number, streams = 1): StallState => ({
  ...s,
  lastStallAt: now,
  stalledStreams: s.stalledStreams + streams,
  stalledSince: streamsStalled(s) ? s.stalledSince : now
})

/**
 * A call completed at `now` (`everyRank`: the agent's test, on every data-parallel rank): the new state when that
 * clears a stall (a completion is progress; a hung rank's test failure only for `everyRank`), else undefined
 * (nothing changes: completions alone must not wake every subscriber on each watchdog tick). `keepFailing`: the
 * engine stays taken as failing calls (FailedCalls.ts failingCleared: too few calls completed in a row yet).
 */
export const onCompleted = (
  s: StallState,
  now: number,
  everyRank = false,
  keepFailing = false
): StallState | undefined => {
  const keep = s.testFailed?.ranks !== undefined && !everyRank ? s.testFailed : undefined
  const failing = keepFailing ? s.failing : undefined
  return (s.lastStallAt !== undefined && (s.lastCompletedAt ?? 0) <= s.lastStallAt) ||
    s.noProgress !== undefined ||
    (s.failing !== undefined && failing === undefined) ||
    (s.testFailed !== undefined && keep === undefined)
    ? {
        lastStallAt: s.lastStallAt,
        lastCompletedAt: now,
        stalledStreams: 0,
        stalledSince: undefined,
        ...(keep === undefined ? {} : { testFailed: keep }),
        ...(failing === undefined ? {} : { failing })
      }
    : undefined
}

/** The counters stood still with work held: the new state, or undefined when the engine is already so taken. */
export const onNoProgress = (s: StallState, np: NoProgress): StallState | undefined =>
  s.noProgress === undefined ? { ...s, noProgress: np } : undefined

/** The agent's test completion got no answer: the new state, or undefined when it is already so taken. */
export const onTestFailed = (s: StallState, f: TestFailure): StallState | undefined =>
  s.testFailed === undefined ? { ...s, testFailed: f } : undefined

/** The engine is taken as failing calls: the new state, or undefined when it is already so taken. */
export const onFailing = (s: StallState, f: FailingCalls): StallState | undefined =>
  s.failing === undefined ? { ...s, failing: f } : undefined

/**
 * The engine's failing calls replaced by `f`, or no longer taken as failing (undefined): what a hold for flapping
 * ends with (FlapDamping.ts onRelease), or a longer hold's reason.
 */
export const withFailing = (s: StallState, f: FailingCalls | undefined): StallState => {
  const { failing: _, ...rest } = s
  return f === undefined ? rest : { ...rest, failing: f }
}

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
 * The reason the node is unhealthy, or undefined while the engine is not known to be stalled. A hung rank's first,
 * then the streams' (it names the calls that failed), the failed calls', the counters', and the engine-wide test's.
 */
export const stallProblem = (s: StallState, idleTimeout: string): string | undefined => {
  const t = s.testFailed
  const test =
    t === undefined
      ? undefined
      : `engine stalled: a test completion sent ${t.sentAfter} got no answer${
          t.ranks === undefined
            ? ""
            : ` from data-parallel rank${t.ranks.length === 1 ? "" : "s"} ${names(t.ranks.map(String))}`
        } within ${idleTimeout} (engine.stream_idle_timeout)`
  // a hung rank's reason first: it lasts until every rank answers, where the streams' comes and goes with each
  // stalled stream and each completion on the other ranks (/readyz flipped between the two)
  if (t?.ranks !== undefined) return test
  if (streamsStalled(s))
    return `engine stalled: ${s.stalledStreams} stream(s) sent nothing for ${idleTimeout} (engine.stream_idle_timeout) and no call has completed since`
  if (s.failing !== undefined) return failingProblem(s.failing)
  const np = s.noProgress
  if (np !== undefined)
    return `engine stalled: it made no progress for ${idleTimeout} (engine.stream_idle_timeout) with ${np.held} request(s) held (${names(np.counters)} unchanged)`
  return test
}

export interface EngineStallService {
  /**
   * `streams` streams (1 when absent) ended at `now` for sending nothing: a watchdog tick's all at once, so the line
   * logged as the node becomes stalled counts them all (one at a time, it said "1 stream(s)" where /readyz said 11).
   */
  readonly stalled: (now: number, streams?: number) => Effect.Effect<void>
  /**
   * A call completed at `now`; `cause` says what, for the log line of a stall it ends ("a call completed"), and is
   * given for the agent's test completion only; `everyRank`: that test, completed on every data-parallel rank;
   * `inRow`: the most calls completed in a row (none failed by the engine between them) since the last report, which
   * clear an engine taken as failing calls only once enough (FailedCalls.ts failingCleared; absent: enough), where the
   * test clears it at once.
   */
  readonly completed: (now: number, cause?: string, everyRank?: boolean, inRow?: number) => Effect.Effect<void>
  /** Some stream read from the engine at `now`; `oldestSince`: when the oldest of them was requested. */
  readonly moved: (now: number, oldestSince: number) => Effect.Effect<void>
  /** The agent's test completion got no answer in time. */
  readonly testFailed: (failure: TestFailure) => Effect.Effect<void>
  /**
   * `calls` calls the engine failed (GrpcStatus.engineFailedCall) at `now`, after any completion reported with it,
   * `last` the last one's status message: counted in a row toward engine.failed_calls_unhealthy.
   */
  readonly callsFailed: (now: number, calls: number, last: string) => Effect.Effect<void>
  /**
   * Whether a data-parallel rank's own counters or KV-cache usage changed at a scrape at or after `since` (epoch ms):
   * it is at work. False where the engine names no rank.
   */
  readonly rankMoved: (rank: number, since: number) => Effect.Effect<boolean>
  /** One metrics scrape of the engine, for its progress counters (undefined: the scrape failed). */
  readonly scraped: (reading: ProgressReading | undefined) => Effect.Effect<void>
  readonly state: Effect.Effect<StallState>
  /** Every change of state, for prompt health writes. */
  readonly changes: Stream.Stream<StallState>
}

export class EngineStall extends Context.Service<EngineStall, EngineStallService>()("cgn-agent/EngineStall") {}
