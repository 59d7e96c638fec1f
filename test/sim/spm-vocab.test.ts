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

describe("the vocabulary's settings as the file gives them (llama_vocab::impl::load)", () => {
  /** A vocabulary file of `tokens` ([text, score, type]); `types` false: no tokenizer.ggml.token_type at all. */
  const fileOf = (
    name: string,
    tokens: ReadonlyArray<readonly [string, number, number]>,
    extra: Record<string, GgufValue> = {},
    types = true
  ): string => {
    const meta = new Map<string, GgufValue>([
      ["general.architecture", gv.str("llama")],
      ["tokenizer.ggml.model", gv.str("llama")],
      [
        "tokenizer.ggml.tokens",
        { type: ValueType.ARRAY, elementType: ValueType.STRING, value: tokens.map((t) => t[0]) }
      ],
      [
        "tokenizer.ggml.scores",
        { type: ValueType.ARRAY, elementType: ValueType.FLOAT32, value: tokens.map((t) => t[1]) }
      ],
      ...(types
        ? ([
            [
              "tokenizer.ggml.token_type",
              { type: ValueType.ARRAY, elementType: ValueType.INT32, value: tokens.map((t) => t[2]) }
            ]
          ] as const)
        : []),
      ...Object.entries(extra)
    ])
    const file = path.join(dir, name)
    fs.writeFileSync(file, writeGguf(meta, []))
    return file
  }

  it("the BOS id is the file's tokenizer.ggml.bos_token_id; add_bos_token false: no BOS even where asked", () => {
    const bos2 = readSpmVocab(fileOf("bos2.gguf", TOKENS, { "tokenizer.ggml.bos_token_id": gv.u32(2) })) as SpmVocab
    expect(spmTokenize(bos2, "a", true)).toEqual([2, id("▁a")])
    const noBos = readSpmVocab(
      fileOf("nobos.gguf", TOKENS, { "tokenizer.ggml.add_bos_token": { type: ValueType.BOOL, value: false } })
    ) as SpmVocab
    expect(noBos.addBos).toBe(false)
    expect(spmTokenize(noBos, "a", true)).toEqual([id("▁a")])
  })

  it("two tokens of one text: the text is the last one's (token_to_id keeps the last id)", () => {
    const twice = readSpmVocab(fileOf("twice.gguf", [...TOKENS, ["bc", -0.2, 1]])) as SpmVocab
    expect(spmTokenize(twice, "bc", false)).toEqual([id("▁"), TOKENS.length])
  })

  it("no token types in the file: every token is normal, so none is split out as special", () => {
    const untyped = readSpmVocab(fileOf("untyped.gguf", TOKENS, {}, false)) as SpmVocab
    expect(untyped.special).toEqual([])
    const ids = spmTokenize(untyped, "a</s>", false)
    expect(ids).not.toContain(2)
    expect(ids.slice(0, 3)).toEqual([id("▁a"), id("<0x3C>"), id("<0x2F>")])
  })

  it("the scores are the file's float32 values, as written", () => {
    expect(Array.from(v.scores)).toEqual(TOKENS.map((t) => Math.fround(t[1])))
  })

  it("special tokens are split out the longest first: one that begins with another is kept whole", () => {
    const longer = readSpmVocab(fileOf("longer.gguf", [...TOKENS, ["<s>a", 0, 3]])) as SpmVocab
    expect(spmTokenize(longer, "<s>a", false)).toEqual([TOKENS.length])
    expect(spmTokenize(longer, "b<s>ab", false)).toEqual([id("▁"), id("b"), TOKENS.length, id("▁"), id("b")])
  })
})
