/**
 * ServiceTimes: what a call on this node needs once it holds an admission slot, learnt from recent calls, so that
 * Admission can shed a queued call that can no longer finish before its deadline instead of spending an engine slot
 * on it (the FIFO-with-deadlines collapse: under overload, legs admitted with too little time left were aborted at
 * their deadline while the calls behind them waited and timed out in turn).
 *
 * What is measured, from the slot (Clock ms): a prefill leg's whole answer (its handoff_timeout bounds the answer), a
 * decode leg's and a normal call's first chunk (a decode leg's deadline bounds its start; a normal call needs at least
 * its first chunk before the caller's deadline, so its first chunk is a lower bound of what it needs).
 *
 * The estimate is conservative on purpose: a shed call that would have finished is a loss the router sees, a call
 * sent that cannot finish only wastes what today's behaviour wastes. So it is a low percentile (the 10th) of a bounded
 * window of the last calls that got there, and none (never shed) before MIN_SAMPLES of them. Only calls that got there
 * count: one cut off before would have needed more, so leaving it out biases the estimate low. (Counting the time such
 * a call held its slot, a lower bound, was tried: under overload those bounds sit just above the shedding threshold
 * and kept it there: a soak at 3x capacity got 36 calls OK of 482 with them, 161 of 470 without.)
 * Pure: no clock, no I/O.
 */

/** The kinds of call whose needs differ: a node has one role, so in practice it sees one kind. */
export type ServiceKind = "prefill" | "decode" | "normal"

/** The last calls an estimate reads: recent enough to follow load, enough for a 10th percentile to mean something. */
export const WINDOW = 64
/**
 * No estimate (never shed) before this many calls of a kind got there. Few, since a node already in the collapse
 * shedding ends gets few calls through (a soak at 3x capacity from the start: 6 in its first 10 s, then one in 50 s);
 * with so few samples the estimate is their fastest, which only sheds calls that the fastest call seen would miss.
 */
export const MIN_SAMPLES = 4
/** The percentile taken (nearest rank): up to 10 samples the fastest one, with 64 the 7th fastest. */
export const PERCENTILE = 0.1

/** A ring of the last WINDOW measurements of one kind and its low percentile. */
export class ServiceTimeWindow {
  readonly #samples: Float64Array
  readonly #minSamples: number
  #count = 0
  #next = 0
  /** The estimate as of the last sample; recomputed lazily (a sort of at most WINDOW numbers). */
  #cached: number | undefined = undefined
  #dirty = false

  constructor(size: number = WINDOW, minSamples: number = MIN_SAMPLES) {
    if (!Number.isInteger(size) || size < 1) throw new RangeError("size must be an integer >= 1")
    if (!Number.isInteger(minSamples) || minSamples < 1 || minSamples > size)
      throw new RangeError("minSamples must be an integer in 1..size")
    this.#samples = new Float64Array(size)
    this.#minSamples = minSamples
  }

  /** Measurements held (at most the window's size). */
  get count(): number {
    return this.#count
  }

  /** One call's time from its slot to what it needed, in ms; a negative or non-finite value is ignored. */
  record(ms: number): void {
    if (!Number.isFinite(ms) || ms < 0) return
    this.#samples[this.#next] = ms
    this.#next = (this.#next + 1) % this.#samples.length
    if (this.#count < this.#samples.length) this.#count++
    this.#dirty = true
  }

  /** The low percentile of the window in ms, or undefined while fewer than minSamples calls were measured. */
  estimate(): number | undefined {
    if (this.#dirty) {
      this.#dirty = false
      this.#cached = this.#count < this.#minSamples ? undefined : lowPercentile(this.#samples.subarray(0, this.#count))
    }
    return this.#cached
  }
}

/** The PERCENTILE-th value of `values` by nearest rank (never interpolated: always a time some call took). */
export const lowPercentile = (values: Float64Array): number => {
  const sorted = Float64Array.from(values).sort()
  const rank = Math.max(1, Math.ceil(PERCENTILE * sorted.length))
  return sorted[rank - 1]!
}

/** One window per kind. */
export class ServiceTimes {
  readonly #windows = new Map<ServiceKind, ServiceTimeWindow>()
  readonly #make: () => ServiceTimeWindow

  constructor(make: () => ServiceTimeWindow = () => new ServiceTimeWindow()) {
    this.#make = make
  }

  record(kind: ServiceKind, ms: number): void {
    let w = this.#windows.get(kind)
    if (w === undefined) {
      w = this.#make()
      this.#windows.set(kind, w)
    }
    w.record(ms)
  }

  /** What a call of `kind` needs from its slot, in ms; undefined: no estimate yet (never shed). */
  need(kind: ServiceKind): number | undefined {
    return this.#windows.get(kind)?.estimate()
  }

  /** The estimates there are, rounded to ms (for /status). */
  snapshot(): Partial<Record<ServiceKind, number>> {
    const out: Partial<Record<ServiceKind, number>> = {}
    for (const [kind, w] of this.#windows) {
      const e = w.estimate()
      if (e !== undefined) out[kind] = Math.round(e)
    }
    return out
  }
}

/**
 * The shedding rule, the same at arrival and at the slot: a call whose time left is below what calls of its kind
 * need here cannot finish in time. No estimate, or no deadline, never sheds.
 */
export const cannotFinish = (leftMs: number | undefined, needMs: number | undefined): boolean =>
  leftMs !== undefined && needMs !== undefined && leftMs < needMs
