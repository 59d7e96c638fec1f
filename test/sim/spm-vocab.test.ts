// Pins on the llama_cpp flavor's SentencePiece tokenizer (src/sim/spmVocab.ts) over a small vocabulary written as a
// GGUF here: llama.cpp's rules (src/llama-vocab.cpp) one at a time. test/real/sim-differential-10.test.ts holds the
// counts to the real server over the tiny model's 32000-token vocabulary.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { readSpmVocab, type SpmVocab, spmTokenize } from "../../src/sim/spmVocab.ts"
import { type GgufValue, gv, ValueType, writeGguf } from "../support/gguf.ts"

/** [text, score, GGUF token type]: 1 normal, 2 unknown, 3 control, 6 byte. */
const TOKENS: ReadonlyArray<readonly [string, number, number]> = [
  ["<unk>", 0, 2],
  ["<s>", 0, 3],
  ["</s>", 0, 3],
  ...Array.from({ length: 256 }, (_, b) => [`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`, 0, 6] as const),
  ["▁", -10, 1],
  ["a", -11, 1],
  ["b", -12, 1],
  ["c", -13, 1],
  ["▁a", -1, 1],
  ["ab", -0.5, 1],
  ["bc", -0.2, 1],
  ["aa", -2, 1]
]
const id = (t: string): number => TOKENS.findIndex((x) => x[0] === t)

let dir: string
const vocabFile = (name: string, extra: Record<string, GgufValue> = {}, model = "llama"): string => {
  const meta = new Map<string, GgufValue>([
    ["general.architecture", gv.str("llama")],
    ["tokenizer.ggml.model", gv.str(model)],
    ["tokenizer.ggml.tokens", { type: ValueType.ARRAY, elementType: ValueType.STRING, value: TOKENS.map((t) => t[0]) }],
    [
      "tokenizer.ggml.scores",
      { type: ValueType.ARRAY, elementType: ValueType.FLOAT32, value: TOKENS.map((t) => t[1]) }
    ],
    [
      "tokenizer.ggml.token_type",
      { type: ValueType.ARRAY, elementType: ValueType.INT32, value: TOKENS.map((t) => t[2]) }
    ],
    ["tokenizer.ggml.bos_token_id", gv.u32(1)],
    ...Object.entries(extra)
  ])
  const file = path.join(dir, name)
  fs.writeFileSync(file, writeGguf(meta, []))
  return file
}

let v: SpmVocab
beforeAll(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-spm-"))
  v = readSpmVocab(vocabFile("v.gguf")) as SpmVocab
})
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }))

describe("llama SentencePiece tokenizer (llm_tokenizer_spm_session)", () => {
  it("reads the vocabulary; a file of another tokenizer, or none, has none", () => {
    expect([v.pieces.length, v.addBos, v.addSpacePrefix, v.bos]).toEqual([TOKENS.length, true, true, 1])
    expect(readSpmVocab(vocabFile("gpt2.gguf", {}, "gpt2"))).toBeUndefined()
    expect(readSpmVocab(path.join(dir, "missing.gguf"))).toBeUndefined()
  })

  it("the BOS where asked, a space before the text, the best-scored bigram merged first", () => {
    // "▁abc": bc (-0.2) before ab (-0.5, then stale) and ▁a (-1)
    expect(spmTokenize(v, "abc", true)).toEqual([1, id("▁a"), id("bc")])
    expect(spmTokenize(v, "abc", false)).toEqual([id("▁a"), id("bc")])
    expect(spmTokenize(v, "", true)).toEqual([1])
  })

  it("spaces are ▁; what no token holds falls back to its UTF-8 bytes", () => {
    expect(spmTokenize(v, "a b", false)).toEqual([id("▁a"), id("▁"), id("b")])
    expect(spmTokenize(v, "é", false)).toEqual([id("▁"), id("<0xC3>"), id("<0xA9>")])
    expect(spmTokenize(v, "\n", false)).toEqual([id("▁"), id("<0x0A>")])
  })

  it("special tokens in the text are split out first, and the text after one gets its space", () => {
    expect(spmTokenize(v, "a</s>b<unk>", true)).toEqual([1, id("▁a"), 2, id("▁"), id("b"), 0])
    expect(spmTokenize(v, "<s><s>", false)).toEqual([1, 1])
  })

  it("equal scores: the leftmost bigram first (add_space_prefix false in the file)", () => {
    const bare = readSpmVocab(vocabFile("bare.gguf", { "tokenizer.ggml.add_space_prefix": { type: 7, value: false } }))
    expect(bare?.addSpacePrefix).toBe(false)
    expect(spmTokenize(bare as SpmVocab, "aaa", false)).toEqual([id("aa"), id("a")])
  })
})
