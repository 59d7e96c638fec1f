/**
 * What services/kv/KvEvents.ts accepts off the wire, frame by frame, where a looser reading would turn a bad frame
 * into a plausible batch. The layouts are the engines' (vllm-project/vllm vllm/distributed/kv_events.py,
 * ZmqEventPublisher; sgl-project/sglang python/sglang/srt/disaggregation/kv_events.py): the seq frame is
 * `seq.to_bytes(8, "big")`, and the replay ROUTER answers `[identity, b"", ...]`, which a DEALER receives with the
 * identity stripped and the empty delimiter first.
 */
import { encode } from "@msgpack/msgpack"
import { describe, expect, it } from "vitest"
import {
  decodeMessage,
  decodePayload,
  readSeq,
  seqFrame,
  splitMessage,
  splitReplayReply
} from "../../src/services/kv/KvEvents.ts"

const topic = new TextEncoder().encode("kv")
const empty = new Uint8Array(0)
const payloadOf = (events: ReadonlyArray<unknown>): Uint8Array => encode([1.5, events, 0], { useBigInt64: true })

describe("KV event frames", () => {
  it("reads a seq only from a frame of exactly 8 bytes: a longer one is not its first 8 bytes", () => {
    const nine = new Uint8Array(9)
    nine.set(seqFrame(3n))
    expect(readSeq(seqFrame(3n))).toBe(3n)
    expect(readSeq(nine)).toBeUndefined()
    expect(splitMessage([topic, nine, payloadOf([])])).toEqual({
      ok: false,
      seq: undefined,
      error: "seq frame has 9 bytes, not 8"
    })
    expect(decodeMessage([topic, nine, payloadOf([])])).toMatchObject({ ok: false, seq: undefined })
  })

  it("takes a replay reply only when its first frame is the empty delimiter", () => {
    const payload = payloadOf([{ type: "AllBlocksCleared" }])
    const stray = new TextEncoder().encode("x")
    expect(splitReplayReply([empty, seqFrame(4n), payload], "kv")).toMatchObject({ end: false, ok: true })
    // A reply whose first frame is not empty is some other layout (an identity not stripped, a frame lost in front):
    // read as the 3- or 4-frame layout it would put the wrong frame in the seq's place.
    expect(splitReplayReply([stray, seqFrame(4n), payload], "kv")).toEqual({
      end: false,
      ok: false,
      error: "unexpected replay reply of 3 frames"
    })
    expect(splitReplayReply([stray, topic, seqFrame(4n), payload], "kv")).toMatchObject({ end: false, ok: false })
  })

  it("refuses a block hash that is a non-integer number: the batch is malformed, not a truncated hash", () => {
    // vLLM hashes are uint64, SGLang's int64 (msgpack integers) or digest bytes; a float is no hash of either.
    const d = decodeMessage([topic, seqFrame(7n), payloadOf([{ type: "BlockRemoved", block_hashes: [1.5] }])])
    expect(d).toEqual({ ok: false, seq: 7n, error: "block hash is number" })
    const ok = decodeMessage([topic, seqFrame(7n), payloadOf([{ type: "BlockRemoved", block_hashes: [2] }])])
    expect(ok).toMatchObject({ ok: true, batch: { events: [{ type: "BlockRemoved", blockHashes: [2n] }] } })
  })

  it("decodes a BlockStored without block_size as an unknown size (null), never 0", () => {
    // The kvcached wire's block_size is nullable (services/kv/KvcachedRpc.ts): null says the engine did not tell,
    // and the Hello's block size applies; a 0 would be a size, and a wrong one.
    const stored = { type: "BlockStored", block_hashes: [1n], parent_block_hash: null, token_ids: [1, 2] }
    const d = decodeMessage([topic, seqFrame(0n), payloadOf([stored])])
    expect(d).toMatchObject({ ok: true, batch: { events: [{ type: "BlockStored", blockSize: null }] } })
    const legacy = decodeMessage([topic, seqFrame(0n), payloadOf([["BlockStored", [1n], null, [1, 2]]])])
    expect(legacy).toMatchObject({ ok: true, batch: { events: [{ type: "BlockStored", blockSize: null }] } })
  })

  it("counts the positions past the known ones of a legacy (array) event as unknown keys, as the map form's keys", () => {
    // A newer engine appends fields at the end of the tagged array (vLLM added lora_name, extra_keys, group_idx and
    // the spec fields so); they are skipped and counted, for /status `unknownKeys` to say the engine is newer.
    const removed = ["BlockRemoved", [1n], "GPU", 0, "newer field"]
    const cleared = ["AllBlocksCleared", "newer field", 2]
    const d = decodePayload(encode([1.5, [removed, cleared]], { useBigInt64: true }))
    expect(d.unknownKeys).toBe(3)
    expect(d.events).toEqual([
      { type: "BlockRemoved", blockHashes: [1n], medium: "GPU", groupIdx: 0 },
      { type: "AllBlocksCleared" }
    ])
  })

  it("keeps SGLang's spec-decode token pairs as pairs, and refuses token_ids that are not a list", () => {
    // spec-decode paths may send [t, t+1] pairs (services/kv/KvEvents.ts tokens; sgl-project/sglang
    // python/sglang/srt/disaggregation/kv_events.py): a pair is kept as it came, never read as one number
    const stored = (tokenIds: unknown) => ({
      type: "BlockStored",
      block_hashes: [1n],
      parent_block_hash: null,
      token_ids: tokenIds
    })
    expect(decodeMessage([topic, seqFrame(1n), payloadOf([stored([[1, 2], [3, 4], 5])])])).toMatchObject({
      ok: true,
      batch: { events: [{ tokenIds: [[1, 2], [3, 4], 5] }] }
    })
    expect(decodeMessage([topic, seqFrame(1n), payloadOf([stored(null)])])).toMatchObject({
      ok: true,
      batch: { events: [{ tokenIds: [] }] }
    })
    expect(decodeMessage([topic, seqFrame(1n), payloadOf([stored("1 2 3")])])).toEqual({
      ok: false,
      seq: 1n,
      error: "token_ids is not an array"
    })
  })
})
