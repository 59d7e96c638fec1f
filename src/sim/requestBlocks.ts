// One request's KV blocks in the simulator (pure): its prompt's full blocks pinned at admission, then the blocks its
// generated tokens fill, cached when the engine caches them, and the loose ones (a partial block) it holds besides.
// vLLM caches a block as soon as every token in it is computed, at each scheduler step (vllm/v1/core/
// kv_cache_manager.py KVCacheManager.allocate_slots: `num_tokens_to_cache = min(num_computed_tokens +
// num_new_tokens, request.num_tokens)`, then BlockPool.cache_full_blocks publishes BlockStored); a sampled token is
// computed one step later, so the last token of a request never is. SGLang inserts a request's sequence into its radix
// tree when it finishes (python/sglang/srt/mem_cache/radix_cache.py cache_finished_req: prompt and output up to
// `kv_committed_len`, page-aligned), publishing the new pages then. llama.cpp and mlx-lm publish nothing, and their
// caches are per slot: their decode blocks stay loose.

import type { Admission, KvBlocks, KvEvent } from "./kvblocks.ts"
import type { Flavor } from "./simConfig.ts"

/** When generated tokens' full blocks are cached: at each step (vLLM), when the request finishes (SGLang), never. */
type CachedWhen = "step" | "finish" | "never"

const CACHED_WHEN: Record<Flavor, CachedWhen> = { vllm: "step", sglang: "finish", llama_cpp: "never", mlx: "never" }

export class RequestBlocks {
  private readonly kv: KvBlocks
  private readonly salt: string | undefined
  private readonly ids: Array<number>
  private readonly when: CachedWhen
  /** Hashes of the full blocks pinned: the prompt's, then those its tokens filled. */
  readonly pinned: Array<bigint>

  constructor(
    kv: KvBlocks,
    flavor: Flavor,
    promptIds: ReadonlyArray<number>,
    admission: Admission,
    salt: string | undefined
  ) {
    this.kv = kv
    this.salt = salt
    this.ids = [...promptIds]
    this.when = CACHED_WHEN[flavor]
    this.pinned = [...admission.hashes]
  }

  /** A token was made: the KV events of blocks it completed (vLLM). */
  token(id: number): ReadonlyArray<KvEvent> {
    this.ids.push(id)
    return this.when === "step" ? this.cacheComputed() : []
  }

  /** The request finished: the KV events of the blocks cached with it (SGLang). */
  finish(): ReadonlyArray<KvEvent> {
    return this.when === "finish" ? this.cacheComputed() : []
  }

  /** Blocks held beyond the pinned full ones: the partial last one, and full ones not cached (yet). */
  get loose(): number {
    return Math.ceil(this.ids.length / this.kv.blockSize) - this.pinned.length
  }

  /** Caches the full blocks of every token but the last (not computed yet); their events. */
  private cacheComputed(): ReadonlyArray<KvEvent> {
    const computed = this.ids.length - 1
    if (Math.floor(computed / this.kv.blockSize) <= this.pinned.length) return []
    const { hashes, events } = this.kv.extend(this.ids.slice(0, computed), this.pinned.length, this.salt)
    this.pinned.push(...hashes)
    return events
  }
}
