// A request's KV blocks past its prompt (src/sim/requestBlocks.ts): vLLM caches and publishes a block once every token
// in it is computed (a sampled token is computed one step later), SGLang caches the finished sequence, llama.cpp and
// mlx-lm none; the blocks chain from the prompt's, so the next turn's prompt (prompt + answer) finds them cached.
import { describe, expect, it } from "vitest"
import { KvBlocks, type KvEvent } from "../../src/sim/kvblocks.ts"
import { RequestBlocks } from "../../src/sim/requestBlocks.ts"

const PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 9] // two full blocks of 4, and one token more
const ANSWER = [10, 11, 12, 13, 14]

const stored = (events: ReadonlyArray<KvEvent>) =>
  events.flatMap((e) =>
    e.type === "BlockStored" ? [{ hashes: e.blockHashes, parent: e.parentBlockHash, tokens: e.tokenIds }] : []
  )

const run = (flavor: "vllm" | "sglang" | "llama_cpp", tokens = ANSWER) => {
  const kv = new KvBlocks(4, 100, 7n)
  const admission = kv.admit(PROMPT)
  const blocks = new RequestBlocks(kv, flavor, PROMPT, admission, undefined)
  const perToken = tokens.map((t) => stored(blocks.token(t)))
  const atFinish = stored(blocks.finish())
  return { kv, admission, blocks, perToken, atFinish }
}

describe("RequestBlocks", () => {
  it("vLLM: the third block is stored with the step after it fills (tokens 10-12 fill it at the 3rd, computed at the 4th)", () => {
    const { admission, perToken, atFinish, blocks, kv } = run("vllm")
    expect(perToken.map((p) => p.length)).toEqual([0, 0, 0, 1, 0])
    expect(perToken[3]?.[0]).toEqual({
      hashes: [kv.hashesOf([...PROMPT, ...ANSWER])[2]],
      parent: admission.hashes[1],
      tokens: [9, 10, 11, 12]
    })
    expect(atFinish).toEqual([])
    expect(blocks.pinned).toHaveLength(3)
    expect(kv.pinnedBlocks).toBe(3)
    // 14 tokens: four blocks, three of them pinned full ones
    expect(blocks.loose).toBe(1)
  })

  it("vLLM: a block whose last token is the request's last is never computed, so never stored", () => {
    const { perToken, blocks } = run("vllm", [10, 11, 12])
    expect(perToken.flat()).toEqual([])
    expect(blocks.pinned).toHaveLength(2)
  })

  it("SGLang: nothing while it runs; the finished sequence's full pages when it ends", () => {
    const { perToken, atFinish, admission } = run("sglang")
    expect(perToken.flat()).toEqual([])
    expect(atFinish).toHaveLength(1)
    expect(atFinish[0]?.parent).toBe(admission.hashes[1])
    expect(atFinish[0]?.tokens).toEqual([9, 10, 11, 12])
  })

  it("llama.cpp: its cache is per slot; generated blocks stay loose", () => {
    const { perToken, atFinish, blocks } = run("llama_cpp")
    expect([...perToken.flat(), ...atFinish]).toEqual([])
    expect(blocks.pinned).toHaveLength(2)
    expect(blocks.loose).toBe(2)
  })

  it("the next turn's prompt (the prompt and the answer) hits the blocks the answer filled", () => {
    const { kv, blocks } = run("vllm")
    kv.release(blocks.pinned)
    const next = kv.admit([...PROMPT, ...ANSWER, 20, 21])
    expect(next.hitTokens).toBe(12)
    expect(stored(next.events)).toHaveLength(1)
  })
})
