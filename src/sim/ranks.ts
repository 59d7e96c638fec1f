// Data-parallel engines behind one API server: vLLM's `--data-parallel-size` and SGLang's `--dp-size`. Each
// rank is an engine core (vLLM) or scheduler replica (SGLang) with its own scheduler (its own
// `--max-num-seqs` / `--max-running-requests`), its own KV cache (its own prefix cache, as large as a single
// engine's, whose KV events go out on the rank's own publisher) and its own counters. Which rank a request
// goes to is the engine's balancer: vLLM's API server scores the load the DP coordinator last published
// (VllmDpLb, below); SGLang's DataParallelController follows --load-balance-method (dpController.ts). The
// /metrics page then carries one series per rank (metrics.ts). llama.cpp and mlx run one rank.
import { blockHash, KvBlocks, type KvEvent } from "./kvblocks.ts"
import { SlotBook } from "./llamaSlots.ts"
import type { Gauges } from "./metricPages.ts"
import { Scheduler } from "./scheduler.ts"
import { Stats } from "./stats.ts"
import { Core } from "./wedge.ts"

/** One engine core: its scheduler, its KV blocks and counters. */
export class Rank {
  readonly index: number
  readonly scheduler: Scheduler
  readonly stats = new Stats()
  /** llama-server's slots' tasks, for /slots. */
  readonly slotBook = new SlotBook()
  /** The rank's own block table: its prefix cache, pins and evictions, and the KV events they make. */
  readonly kv: KvBlocks
  /** Blocks past the pinned full prompt blocks (partial prompt block, decode blocks) of its running requests. */
  decodeBlocks = 0
  /** Whether this rank's core runs or hangs alone (the `wedged_rank` fault), with its gauges as it hung. */
  readonly core = new Core<Gauges>()

  constructor(index: number, maxSeqs: number, kv: KvBlocks) {
    this.index = index
    this.scheduler = new Scheduler(maxSeqs)
    this.kv = kv
  }

  /** Blocks in use: pinned prompt blocks (running requests and P/D holds) and the running requests' others. */
  get usedBlocks(): number {
    return this.kv.pinnedBlocks + this.decodeBlocks
  }

  /** KV-cache usage, 0..1, as the scheduler reports it (`kv_cache_usage`). */
  get kvUsage(): number {
    return Math.min(1, this.usedBlocks / this.kv.capacity)
  }
}

/** What a balancer may route by besides the ranks' load: the request's P/D bootstrap room (SGLang prefill). */
export interface PickHint {
  readonly bootstrapRoom?: string | undefined
}

/** An engine's way of choosing the rank for a new request (called only with more than one rank). */
export interface Balancer {
  pick(ranks: ReadonlyArray<Rank>, hint: PickHint): number
}

/**
 * How often the DP coordinator publishes the engines' load to the API server while it changes
 * (vllm-project/vllm vllm/v1/engine/coordinator.py, DPCoordinator.__init__: `min_stats_update_interval_ms
 * = 0 if external_lb else 100`; CoordinatorProc.process_input_socket publishes at that interval when the
 * stats changed, else every 4 s, when they are the same anyway).
 */
export const LB_STATS_INTERVAL_MS = 100

export interface EnginesOptions {
  readonly dataParallel: number
  readonly maxSeqs: number
  readonly blockSize: number
  /** Each rank's KV capacity in blocks: a DP rank's cache is as large as a single engine's. */
  readonly kvBlocks: number
  /** Rank 0's block-hash seed (vLLM's NONE_HASH). */
  readonly seed: bigint
  /**
   * Whether every rank hashes from the same seed: vLLM draws NONE_HASH per engine-core process, random
   * unless PYTHONHASHSEED is set (vllm-project/vllm vllm/v1/core/kv_cache_utils.py, init_none_hash, called
   * from EngineCore.__init__ in vllm/v1/engine/core.py). Otherwise rank r > 0 gets a seed of its own.
   */
  readonly sharedSeed: boolean
  /** The engine's balancer; default vLLM's (VllmDpLb). */
  readonly balancer?: Balancer | undefined
  /** Clock in ms (tests inject one), for vLLM's balancer; default performance.now. */
  readonly now?: () => number
  /** The coordinator's publication period; default LB_STATS_INTERVAL_MS. */
  readonly statsIntervalMs?: number
}

export class Engines {
  readonly ranks: ReadonlyArray<Rank>
  private readonly balancer: Balancer

  constructor(o: EnginesOptions) {
    const n = Math.max(1, o.dataParallel)
    this.ranks = Array.from({ length: n }, (_, i) => {
      const seed = i === 0 || o.sharedSeed ? o.seed : blockHash(o.seed, [0x64700000 + i])
      return new Rank(i, o.maxSeqs, new KvBlocks(o.blockSize, o.kvBlocks, seed))
    })
    this.balancer =
      o.balancer ?? new VllmDpLb(n, o.now ?? (() => performance.now()), o.statsIntervalMs ?? LB_STATS_INTERVAL_MS)
  }

  get running(): number {
    return this.ranks.reduce((n, r) => n + r.scheduler.running, 0)
  }

  get waiting(): number {
    return this.ranks.reduce((n, r) => n + r.scheduler.waiting, 0)
  }

  /** The rank a new request goes to (the only one when there is one); `pinned`: the one the client named. */
  pick(hint: PickHint = {}, pinned?: number): Rank {
    if (pinned !== undefined) return this.ranks[pinned] as Rank
    if (this.ranks.length === 1) return this.ranks[0] as Rank
    return this.ranks[this.balancer.pick(this.ranks, hint)] as Rank
  }
}

/** What the API server knows of one engine: [waiting, running, kv_cache_usage] as last published. */
interface LbCounts {
  waiting: number
  running: number
  kvUsage: number
}

/**
 * vLLM's API server picks the engine core with the internal load balancer (vllm-project/vllm
 * vllm/v1/engine/core_client.py, DPLBAsyncMPClient.get_core_engine_for_request): it scores `lb_engines`, the
 * [waiting, running, kv_cache_usage] per engine that the DP coordinator publishes every 100 ms
 * (DPAsyncMPClient._ensure_stats_update_task), never the live queues. The scan starts at `eng_start_index`
 * (0 for one API server) and keeps the first lowest score, where a score is `max(client_count * inflight,
 * waiting + running)` (inflight: this client's unfinished requests on that engine, exact) plus
 * `waiting * 6 * max(0, kv_cache_usage - 0.5)` when requests wait. After choosing it adds `client_count` (1)
 * to the chosen engine's local waiting count, so the requests between two publications spread, and rotates
 * `eng_start_index` by one so ties do not always favour one engine. (Before vLLM PRs #47420 and #49204 the
 * score was `waiting * 4 + running` from a fixed start.) Requests sent one after another within a period
 * therefore alternate ranks. The snapshot is refreshed lazily: on a pick, when the last one is a period old.
 */
export class VllmDpLb implements Balancer {
  private readonly now: () => number
  private readonly interval: number
  /** The coordinator's last publication (`lb_engines`), with this client's increments since. */
  private lb: Array<LbCounts>
  private lbAt = Number.NEGATIVE_INFINITY
  /** `eng_start_index`: the client index scaled to the engines (0 for one API server), then rotated. */
  private startIndex = 0

  constructor(n: number, now: () => number, intervalMs: number) {
    this.now = now
    this.interval = intervalMs
    this.lb = Array.from({ length: n }, () => ({ waiting: 0, running: 0, kvUsage: 0 }))
  }

  pick(ranks: ReadonlyArray<Rank>): number {
    const n = ranks.length
    const now = this.now()
    if (now - this.lbAt >= this.interval) {
      this.lb = ranks.map((r) => ({ waiting: r.scheduler.waiting, running: r.scheduler.running, kvUsage: r.kvUsage }))
      this.lbAt = now
    }
    let chosen = 0
    let min = Number.POSITIVE_INFINITY
    for (let i = 0; i < n; i++) {
      const idx = (this.startIndex + i) % n
      const c = this.lb[idx] as LbCounts
      const r = ranks[idx] as Rank
      // The sim's API server is the engines' only client: its unfinished requests on a rank are the
      // rank's live waiting + running (a request takes its place in the rank's queue when it is routed).
      const inflight = r.scheduler.waiting + r.scheduler.running
      let score = Math.max(inflight, c.waiting + c.running)
      if (c.waiting > 0) score += c.waiting * 6 * Math.max(0, c.kvUsage - 0.5)
      if (score < min) {
        min = score
        chosen = idx
      }
    }
    ;(this.lb[chosen] as LbCounts).waiting += 1
    this.startIndex = (this.startIndex + 1) % n
    return chosen
  }
}

/**
 * The ranks' KV caches seen together (SimContext.kv): their block size and per-rank capacity, the blocks
 * cached and pinned summed over the ranks (each rank caches its own copy of a prefix it served), and
 * `clear()`, which empties every rank's cache and returns the AllBlocksCleared event that each rank's
 * publisher sends at load.
 */
export class KvCaches {
  private readonly ranks: ReadonlyArray<Rank>
  constructor(ranks: ReadonlyArray<Rank>) {
    this.ranks = ranks
  }
  private get first(): KvBlocks {
    return (this.ranks[0] as Rank).kv
  }
  get blockSize(): number {
    return this.first.blockSize
  }
  /** One rank's capacity (each rank's cache is as large as a single engine's). */
  get capacity(): number {
    return this.first.capacity
  }
  get cachedBlocks(): number {
    return this.ranks.reduce((n, r) => n + r.kv.cachedBlocks, 0)
  }
  get pinnedBlocks(): number {
    return this.ranks.reduce((n, r) => n + r.kv.pinnedBlocks, 0)
  }
  clear(): KvEvent {
    let e: KvEvent = { type: "AllBlocksCleared" }
    for (const r of this.ranks) e = r.kv.clear()
    return e
  }
}
