/**
 * EngineProgress: whether the engine is getting anywhere with the work it holds, read off its own progress counters
 * (MetricNames.progress: tokens it has computed, as it counts them) at each metrics scrape. Pure, no I/O, no clock:
 * the caller passes each scrape's time.
 *
 * The rule asks for proof of no progress, not for slowness: the engine is "stuck" once, over at least `windowMs`
 * (engine.stream_idle_timeout), every answered scrape showed work held and none of the counters moved. Work held
 * means both the engine's own gauges (running + waiting > 0) and the agent's own calls in flight to it (> 0):
 * - the gauges alone are not a fact: vLLM refreshes them only when its engine core steps, so after every request was
 *   aborted at once they keep the last busy figures on an idle engine (vllm-project/vllm issues #22545, #29928);
 * - the agent's calls alone are not work the engine can do: an SGLang prefill server holds a leg until its decode
 *   peer connects, outside its running and waiting queues, and a stream the caller holds back owes the engine
 *   nothing.
 * A counter that moves, goes down (a reset: a new engine process) or appears is progress, and ends the run. A scrape
 * that failed, or that lacks the counters or the gauges, says nothing either way: it neither extends nor ends the
 * run, and the counters are compared with the last scrape that had them (they are cumulative, so no move is missed).
 * A scrape that shows no work held ends the run (an idle engine has nothing to progress on).
 * The engine's own gauges (running, waiting, KV-cache usage) count as counters here: a change in them is the
 * scheduler at work. vLLM adds to prompt_tokens_total only once a prompt's whole prefill is done, so one long
 * chunked prefill alone would stand every counter still past a short window; its KV-cache usage grows with each
 * chunk (the scheduler's stats go out every step, output or not: vllm/v1/core/sched/scheduler.py). A hung core
 * freezes the gauges as it does the counters, so a wedge still reads as one. Only with counters present: gauges
 * alone never start the rule.
 */

/** One answered scrape, as the rule reads it. */
export interface ProgressReading {
  /** When it answered (epoch ms, from the Clock). */
  readonly at: number
  /**
   * The progress counters present in it, each summed over its label sets (data-parallel ranks), and the engine's
   * gauges under GAUGE-prefixed names (compared, never named in a verdict).
   */
  readonly counters: Readonly<Record<string, number>>
  /** Requests the engine says it holds (running + waiting), or undefined when it reports neither. */
  readonly held: number | undefined
  /** The agent's own calls in flight to the engine. */
  readonly inflight: number
  /** Per data-parallel rank, one figure of its counters and KV-cache usage (LoadSignals.rankProgress); absent: none. */
  readonly ranks?: Readonly<Record<string, number>> | undefined
}

/** What the rule keeps between scrapes. */
export interface ProgressWatch {
  /** The counters of the last scrape that had them: what the next one is compared with. */
  readonly baseline: Readonly<Record<string, number>> | undefined
  /** When the current run of scrapes with work held and no counter moved began; undefined: no such run. */
  readonly stillSince: number | undefined
}

export const noWatch: ProgressWatch = { baseline: undefined, stillSince: undefined }

export type ProgressVerdict =
  /** Nothing to judge by: a failed scrape, no counters or gauges in it, or the first counters seen. */
  | { readonly _tag: "Unknown" }
  /** A counter moved (or went down, or appeared): proof of progress. */
  | { readonly _tag: "Moved" }
  /** No counter moved and no work is held. */
  | { readonly _tag: "Idle" }
  /** Work held and no counter moved, for less than the window so far. */
  | { readonly _tag: "Still"; readonly since: number }
  /** Work held and no counter moved for at least the window. */
  | {
      readonly _tag: "Stuck"
      readonly since: number
      /** Requests the engine held at this scrape. */
      readonly held: number
      /** The counters that stood still, in the order the scrape had them. */
      readonly counters: ReadonlyArray<string>
    }

const unknown: ProgressVerdict = { _tag: "Unknown" }

/** The prefix of a gauge's entry among the counters. */
const GAUGE = "gauge:"

const moved = (before: Readonly<Record<string, number>>, now: Readonly<Record<string, number>>): boolean => {
  const names = Object.keys(now)
  if (names.length !== Object.keys(before).length) return true
  return names.some((n) => before[n] !== now[n])
}

/** The next watch and the verdict of one scrape (`reading` undefined: the scrape failed). */
export const observeProgress = (
  watch: ProgressWatch,
  reading: ProgressReading | undefined,
  windowMs: number
): readonly [ProgressWatch, ProgressVerdict] => {
  if (reading === undefined || Object.keys(reading.counters).length === 0) return [watch, unknown]
  const { counters, held, at } = reading
  if (watch.baseline === undefined) return [{ baseline: counters, stillSince: undefined }, unknown]
  if (moved(watch.baseline, counters)) return [{ baseline: counters, stillSince: undefined }, { _tag: "Moved" }]
  if (held === undefined) return [watch, unknown]
  if (held <= 0 || reading.inflight <= 0) return [{ baseline: counters, stillSince: undefined }, { _tag: "Idle" }]
  const since = watch.stillSince ?? at
  const next: ProgressWatch = { baseline: counters, stillSince: since }
  return at - since >= windowMs
    ? [next, { _tag: "Stuck", since, held, counters: Object.keys(counters).filter((n) => !n.startsWith(GAUGE)) }]
    : [next, { _tag: "Still", since }]
}

/** The progress counters and, when there are any, the gauges that move with them (see the header). */
const withGauges = (signals: {
  readonly running: number | undefined
  readonly waiting: number | undefined
  readonly kvUsage?: number | undefined
  readonly progress?: Readonly<Record<string, number>> | undefined
}): Readonly<Record<string, number>> => {
  const counters = signals.progress ?? {}
  if (Object.keys(counters).length === 0) return counters
  const out: Record<string, number> = { ...counters }
  if (signals.running !== undefined) out[`${GAUGE}running`] = signals.running
  if (signals.waiting !== undefined) out[`${GAUGE}waiting`] = signals.waiting
  if (signals.kvUsage !== undefined) out[`${GAUGE}kv_usage`] = signals.kvUsage
  return out
}

/** The rule's reading of one scrape's load signals (undefined: the scrape failed). */
export const progressReading = (
  signals:
    | {
        readonly running: number | undefined
        readonly waiting: number | undefined
        readonly kvUsage?: number | undefined
        readonly progress?: Readonly<Record<string, number>> | undefined
        readonly rankProgress?: Readonly<Record<string, number>> | undefined
      }
    | undefined,
  at: number,
  inflight: number
): ProgressReading | undefined =>
  signals === undefined
    ? undefined
    : {
        at,
        ranks: signals.rankProgress,
        counters: withGauges(signals),
        held:
          signals.running === undefined && signals.waiting === undefined
            ? undefined
            : (signals.running ?? 0) + (signals.waiting ?? 0),
        inflight
      }
