// Pure KV pins of the simulator that the engine-facing tests leave open (a mutation audit found them unguarded):
// vLLM's BlockStored `extra_keys` carrying the cache_salt on the first block of a chain only, and prefix-cache
// hits counted up to the first miss only.
import { describe, expect, it } from "vitest"
import { KvBlocks, type KvEvent } from "../../src/sim/kvblocks.ts"
import { encodeEvent } from "../../src/sim/kvpublisher.ts"

describe("vLLM BlockStored extra_keys", () => {
  // vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys: the salt is an extra key of the block that
  // starts at token 0 only; vllm/distributed/kv_events.py BlockStored.extra_keys has one entry per block.
  const stored = (parent: bigint | null, cacheSalt?: string): KvEvent => ({
    type: "BlockStored",
    blockHashes: [11n, 12n, 13n],
    parentBlockHash: parent,
    tokenIds: [1, 2, 3, 4, 5, 6],
    blockSize: 2,
    ...(cacheSalt === undefined ? {} : { cacheSalt })
  })
  const extraKeys = (e: KvEvent) => (encodeEvent(e, "map", false) as { extra_keys: unknown }).extra_keys

  it("carries the salt on the chain's first block alone, none without a salt or after a parent", () => {
    expect(extraKeys(stored(null, "tenant-a"))).toEqual([["tenant-a"], null, null])
    expect(extraKeys(stored(null))).toEqual([null, null, null])
    expect(extraKeys(stored(10n, "tenant-a"))).toEqual([null, null, null])
  })
})

describe("KvBlocks prefix-cache hits", () => {
  // vLLM KVCacheManager.get_computed_blocks (find_longest_cache_hit) and SGLang RadixCache.match_prefix: only
  // the longest cached prefix is a hit, so a later block still cached behind an evicted one counts nothing.
  it("stops counting at the first block missing from the cache", () => {
    const kv = new KvBlocks(2, 2, 7n)
    const prompt = [1, 2, 3, 4]
    const first = kv.admit(prompt)
    expect(first.hitTokens).toBe(0)
    kv.release(first.hashes)
    // A third block past capacity 2 evicts the least recently used: the prompt's first block, not its second.
    const other = kv.admit([9, 9])
    expect(other.events).toContainEqual({ type: "BlockRemoved", blockHashes: [first.hashes[0]] })
    kv.release(other.hashes)
    const again = kv.admit(prompt)
    expect(again.hitTokens).toBe(0)
    // With both blocks cached the whole prompt is a hit.
    kv.release(again.hashes)
    expect(kv.admit(prompt).hitTokens).toBe(4)
  })
})
