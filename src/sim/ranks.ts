// Data-parallel engines behind one API server (vLLM `--data-parallel-size`): each rank is an engine core
// with its own scheduler (its own `--max-num-seqs`), its own KV usage and its own counters, and the API
// server routes each request to one rank. vLLM's /metrics then carries one series per rank, told apart by
// the `engine` label (metrics.ts). Every other flavor here runs one rank.
import { Scheduler } from "./scheduler.ts"
import { Stats } from "./stats.ts"

/** One engine core: its scheduler, counters and the KV blocks its requests hold. */
export class Rank {
  readonly index: number
  readonly scheduler: Scheduler
  readonly stats = new Stats()
  /** Blocks past the pinned full prompt blocks (partial prompt block, decode blocks) of its running requests. */
  decodeBlocks = 0
  private readonly pins = new Map<bigint, number>()

  constructor(index: number, maxSeqs: number) {
    this.index = index
    this.scheduler = new Scheduler(maxSeqs)
  }

  /** Counts a request's prompt blocks as held by this rank (shared prefixes once). */
  pin(hashes: ReadonlyArray<bigint>): void {
    for (const h of hashes) this.pins.set(h, (this.pins.get(h) ?? 0) + 1)
  }

  unpin(hashes: ReadonlyArray<bigint>): void {
    for (const h of hashes) {
      const n = this.pins.get(h) ?? 0
      if (n <= 1) this.pins.delete(h)
      else this.pins.set(h, n - 1)
    }
  }

  /** Distinct prompt blocks held by this rank's running requests. */
  get pinnedBlocks(): number {
    return this.pins.size
  }
}

export class Engines {
  readonly ranks: ReadonlyArray<Rank>

  constructor(dataParallel: number, maxSeqs: number) {
    this.ranks = Array.from({ length: Math.max(1, dataParallel) }, (_, i) => new Rank(i, maxSeqs))
  }

  get running(): number {
    return this.ranks.reduce((n, r) => n + r.scheduler.running, 0)
  }

  get waiting(): number {
    return this.ranks.reduce((n, r) => n + r.scheduler.waiting, 0)
  }

  /**
   * The rank a new request goes to: the lowest `waiting * 4 + running`, the first one on a tie, as vLLM's
   * API server picks the engine core (vllm-project/vllm vllm/v1/engine/core_client.py,
   * DPLBAsyncMPClient.get_core_engine_for_request). vLLM scores counts the DP coordinator publishes every
   * 100 ms plus its own increments; the simulator scores the live counts.
   */
  pick(): Rank {
    let best = this.ranks[0] as Rank
    let min = Number.POSITIVE_INFINITY
    for (const r of this.ranks) {
      const score = r.scheduler.waiting * 4 + r.scheduler.running
      if (score < min) {
        min = score
        best = r
      }
    }
    return best
  }
}
