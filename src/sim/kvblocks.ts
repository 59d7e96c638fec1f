// KV block manager of the simulator (pure): prefix-cached blocks keyed by chained 64-bit hashes, pinned by
// running requests, LRU-evicted past capacity. It returns the KV events vLLM would publish for each change.
// Hashes chain from a per-process seed (like vLLM's NONE_HASH), so equal prompts on one engine share blocks.

export type KvEvent =
  | {
      readonly type: "BlockStored"
      readonly blockHashes: ReadonlyArray<bigint>
      readonly parentBlockHash: bigint | null
      readonly tokenIds: ReadonlyArray<number>
      readonly blockSize: number
      /** The request's `cache_salt`, when it had one (its blocks hash apart from unsalted ones). */
      readonly cacheSalt?: string
    }
  | { readonly type: "BlockRemoved"; readonly blockHashes: ReadonlyArray<bigint> }
  | { readonly type: "AllBlocksCleared" }

interface Block {
  readonly id: number
  refs: number
}

export interface Admission {
  readonly hashes: ReadonlyArray<bigint>
  readonly blockIds: ReadonlyArray<number>
  /** Prompt tokens found in the prefix cache. */
  readonly hitTokens: number
  readonly events: ReadonlyArray<KvEvent>
}

const M64 = (1n << 64n) - 1n

/** Chained block hash: 64 bits from two 32-bit murmur-style lanes over parent hash and tokens. */
export const blockHash = (parent: bigint, tokens: ReadonlyArray<number>): bigint => {
  let h1 = Number(parent & 0xffffffffn) ^ 0x9e3779b9
  let h2 = Number((parent >> 32n) & 0xffffffffn) ^ 0x85ebca6b
  for (const t of tokens) {
    h1 = Math.imul(h1 ^ t, 0xcc9e2d51)
    h1 = (h1 << 15) | (h1 >>> 17)
    h2 = Math.imul(h2 ^ h1, 0x1b873593)
    h2 = (h2 << 13) | (h2 >>> 19)
    h1 = (h1 + h2) | 0
  }
  h1 = Math.imul(h1 ^ (h1 >>> 16), 0x85ebca6b)
  h2 = Math.imul(h2 ^ (h2 >>> 13), 0xc2b2ae35)
  h1 ^= h2 >>> 16
  h2 ^= h1 >>> 15
  return ((BigInt(h2 >>> 0) << 32n) | BigInt(h1 >>> 0)) & M64
}

export class KvBlocks {
  readonly blockSize: number
  readonly capacity: number
  private readonly seed: bigint
  private readonly blocks = new Map<bigint, Block>()
  private nextId = 0
  private pinned = 0

  constructor(blockSize: number, capacity: number, seed: bigint) {
    this.blockSize = Math.max(1, blockSize)
    this.capacity = Math.max(1, capacity)
    this.seed = seed
  }

  /** Hashes of the prompt's full blocks; a salt changes every hash of the chain (the engines salt the first block). */
  hashesOf(tokenIds: ReadonlyArray<number>, salt?: string): Array<bigint> {
    const out: Array<bigint> = []
    let parent =
      salt === undefined
        ? this.seed
        : blockHash(
            this.seed,
            Array.from(salt, (c) => c.codePointAt(0) ?? 0)
          )
    for (let i = 0; i + this.blockSize <= tokenIds.length; i += this.blockSize) {
      parent = blockHash(parent, tokenIds.slice(i, i + this.blockSize))
      out.push(parent)
    }
    return out
  }

  /** Pins the prompt's full blocks, storing missing ones (and evicting unpinned ones past capacity). */
  admit(tokenIds: ReadonlyArray<number>, salt?: string): Admission {
    const { hashes, blockIds, hitTokens, events } = this.pin(tokenIds, 0, salt)
    // The partial last block is allocated too (it is handed off in P/D) but never cached or published.
    const partial = tokenIds.length % this.blockSize !== 0 || tokenIds.length === 0 ? [this.nextId++] : []
    return { hashes, blockIds: [...blockIds, ...partial], hitTokens, events }
  }

  /**
   * Pins the full blocks of `tokenIds` from block `from` on (those before are the caller's already): the blocks a
   * running request fills with its generated tokens, cached as vLLM caches each full, computed block
   * (KVCacheManager.allocate_slots) and SGLang a finished request's (RadixCache.cache_finished_req).
   */
  extend(tokenIds: ReadonlyArray<number>, from: number, salt?: string): Pick<Admission, "hashes" | "events"> {
    const { hashes, events } = this.pin(tokenIds, from, salt)
    return { hashes: hashes.slice(from), events }
  }

  private pin(tokenIds: ReadonlyArray<number>, from: number, salt?: string): Admission {
    const hashes = this.hashesOf(tokenIds, salt)
    const events: Array<KvEvent> = []
    const blockIds: Array<number> = []
    let hitTokens = 0
    let run: { start: number; hashes: Array<bigint> } | undefined
    const flush = () => {
      if (run === undefined) return
      const start = run.start
      events.push({
        type: "BlockStored",
        blockHashes: run.hashes,
        parentBlockHash: start === 0 ? null : (hashes[start - 1] ?? null),
        tokenIds: tokenIds.slice(start * this.blockSize, (start + run.hashes.length) * this.blockSize),
        blockSize: this.blockSize,
        ...(salt !== undefined ? { cacheSalt: salt } : {})
      })
      run = undefined
    }
    let prefix = true
    for (let i = from; i < hashes.length; i++) {
      const h = hashes[i] as bigint
      const existing = this.blocks.get(h)
      if (existing !== undefined) {
        flush()
        if (prefix) hitTokens += this.blockSize
        this.blocks.delete(h)
        this.blocks.set(h, existing)
        if (existing.refs === 0) this.pinned++
        existing.refs++
        blockIds.push(existing.id)
        continue
      }
      prefix = false
      const block = { id: this.nextId++, refs: 1 }
      this.pinned++
      this.blocks.set(h, block)
      blockIds.push(block.id)
      run ??= { start: i, hashes: [] }
      run.hashes.push(h)
    }
    flush()
    const removed = this.evict()
    if (removed.length > 0) events.push({ type: "BlockRemoved", blockHashes: removed })
    return { hashes, blockIds, hitTokens, events }
  }

  /** Unpins blocks (they stay cached until evicted). */
  release(hashes: ReadonlyArray<bigint>): void {
    for (const h of hashes) {
      const b = this.blocks.get(h)
      if (b !== undefined && b.refs > 0) {
        b.refs--
        if (b.refs === 0) this.pinned--
      }
    }
  }

  /** Pins blocks again (a P/D hold). */
  retain(hashes: ReadonlyArray<bigint>): void {
    for (const h of hashes) {
      const b = this.blocks.get(h)
      if (b !== undefined) {
        if (b.refs === 0) this.pinned++
        b.refs++
      }
    }
  }

  /** Drops every block: the AllBlocksCleared event. */
  clear(): KvEvent {
    this.blocks.clear()
    this.pinned = 0
    return { type: "AllBlocksCleared" }
  }

  get pinnedBlocks(): number {
    return this.pinned
  }

  get cachedBlocks(): number {
    return this.blocks.size
  }

  private evict(): Array<bigint> {
    const removed: Array<bigint> = []
    if (this.blocks.size <= this.capacity) return removed
    for (const [h, b] of this.blocks) {
      if (this.blocks.size - removed.length <= this.capacity) break
      if (b.refs === 0) removed.push(h)
    }
    for (const h of removed) this.blocks.delete(h)
    return removed
  }
}
