/**
 * Which events to log when a client can make them as often as it likes (connections refused or closed for abuse,
 * client certificates refused):
 * at most one line per key (a peer and a reason) per interval, that line carrying how many were left unlogged
 * since the key's last line, and at most `maxKeys` keys remembered (past them, every key's events share one
 * overflow key, so a client with many addresses still gets one line per interval). Pure: the caller passes the
 * time; the counts are in the metrics either way.
 */

/** One line per peer and reason a minute: an attack's lines stay a handful, its totals are in the metrics. */
export const LOG_INTERVAL_MS = 60_000
const MAX_KEYS = 1024
/** The key the events of keys past `maxKeys` share. */
export const OVERFLOW_KEY = "(other peers)"

interface Entry {
  lastMs: number
  suppressed: number
}

export class RateLimitedLog {
  readonly #intervalMs: number
  readonly #maxKeys: number
  readonly #entries = new Map<string, Entry>()

  constructor(intervalMs = LOG_INTERVAL_MS, maxKeys = MAX_KEYS) {
    this.#intervalMs = intervalMs
    this.#maxKeys = maxKeys
  }

  /**
   * An event of `key` at `nowMs`: undefined when it is not to be logged (then counted as suppressed), else the key
   * it is logged under and how many of that key's events were suppressed since its last line.
   */
  note(key: string, nowMs: number): { readonly key: string; readonly suppressed: number } | undefined {
    let k = key
    let e = this.#entries.get(k)
    if (e === undefined && this.#entries.size >= this.#maxKeys) {
      this.#prune(nowMs)
      if (this.#entries.size >= this.#maxKeys) {
        k = OVERFLOW_KEY
        e = this.#entries.get(k)
      }
    }
    if (e === undefined) {
      this.#entries.set(k, { lastMs: nowMs, suppressed: 0 })
      return { key: k, suppressed: 0 }
    }
    if (nowMs - e.lastMs < this.#intervalMs) {
      e.suppressed++
      return undefined
    }
    const suppressed = e.suppressed
    e.lastMs = nowMs
    e.suppressed = 0
    return { key: k, suppressed }
  }

  /**
   * Forgets the keys whose interval is over: their next event would be logged at once anyway (what they suppressed
   * since is then not told; the metrics have it).
   */
  #prune(nowMs: number): void {
    for (const [k, e] of this.#entries) if (nowMs - e.lastMs >= this.#intervalMs) this.#entries.delete(k)
  }
}
