// A tiny llama model written at test time, for running a real llama-server on CPU in the tests: 2 layers,
// 64 wide, 4 heads, F32 tensors, the tokenizer copied from llama.cpp's vocab-only
// `models/ggml-vocab-llama-spm.gguf` (32000 SentencePiece tokens). The weights are seeded noise, except:
//
// - "words": residual dimension 0 is held at a constant by every token embedding and written by no layer
//   (row 0 of attn_output and ffn_down is zero), so after the final RMS norm it is a large positive value;
//   the output layer's column 0 is +BIAS for plain lower-case word tokens and -BIAS for every other token
//   (control tokens such as EOS, byte tokens, punctuation). Sampling then picks words, never EOS, so every
//   stream runs to its max_tokens; the other 63 dimensions make the choice among words vary.
// - "random": no such bias, anything can come out (EOS, byte tokens, text the server's parsers reject).
import * as fs from "node:fs"
import { prng } from "../../src/sim/tokens.ts"
import { type GgufTensor, type GgufValue, gv, readGgufMetadata, writeGguf } from "./gguf.ts"

export type TinyVariant = "words" | "random"

const N_EMBD = 64
const N_LAYER = 2
const N_HEAD = 4
const N_FF = 128
const BIAS = 4

/** A plain word piece: SentencePiece's word-start mark and two or more lower-case letters. */
const isWord = (piece: string): boolean => /^\u2581[a-z]{2,}$/.test(piece)

/** The GGUF image of the tiny model; `contextLength` is its trained context (the server's default -c). */
export const tinyLlama = (vocabFile: string, variant: TinyVariant, contextLength = 2048): Buffer => {
  const vocab = readGgufMetadata(fs.readFileSync(vocabFile))
  const tokensValue = vocab.get("tokenizer.ggml.tokens")
  if (tokensValue?.type !== 9) throw new Error(`${vocabFile}: no tokenizer.ggml.tokens array`)
  const tokens = tokensValue.value as ReadonlyArray<string>
  const nVocab = tokens.length
  const rand = prng(variant === "words" ? 11 : 23)
  const noise = (n: number, scale: number): Float32Array => {
    const a = new Float32Array(n)
    for (let i = 0; i < n; i++) a[i] = (rand() * 2 - 1) * scale
    return a
  }
  const ones = (n: number) => new Float32Array(n).fill(1)

  const tokEmbd = noise(N_EMBD * nVocab, 0.15)
  const output = noise(N_EMBD * nVocab, 0.5)
  if (variant === "words") {
    for (let t = 0; t < nVocab; t++) {
      tokEmbd[t * N_EMBD] = 1
      output[t * N_EMBD] = isWord(tokens[t] ?? "") ? BIAS : -BIAS
    }
  }
  const tensors: Array<GgufTensor> = [{ name: "token_embd.weight", dims: [N_EMBD, nVocab], data: tokEmbd }]
  for (let l = 0; l < N_LAYER; l++) {
    const wo = noise(N_EMBD * N_EMBD, 0.1)
    const down = noise(N_FF * N_EMBD, 0.1)
    if (variant === "words") {
      wo.fill(0, 0, N_EMBD) // output row 0: the layer never writes residual dimension 0
      down.fill(0, 0, N_FF)
    }
    const blk = `blk.${l}`
    tensors.push(
      { name: `${blk}.attn_norm.weight`, dims: [N_EMBD], data: ones(N_EMBD) },
      { name: `${blk}.attn_q.weight`, dims: [N_EMBD, N_EMBD], data: noise(N_EMBD * N_EMBD, 0.2) },
      { name: `${blk}.attn_k.weight`, dims: [N_EMBD, N_EMBD], data: noise(N_EMBD * N_EMBD, 0.2) },
      { name: `${blk}.attn_v.weight`, dims: [N_EMBD, N_EMBD], data: noise(N_EMBD * N_EMBD, 0.2) },
      { name: `${blk}.attn_output.weight`, dims: [N_EMBD, N_EMBD], data: wo },
      { name: `${blk}.ffn_norm.weight`, dims: [N_EMBD], data: ones(N_EMBD) },
      { name: `${blk}.ffn_gate.weight`, dims: [N_EMBD, N_FF], data: noise(N_EMBD * N_FF, 0.2) },
      { name: `${blk}.ffn_up.weight`, dims: [N_EMBD, N_FF], data: noise(N_EMBD * N_FF, 0.2) },
      { name: `${blk}.ffn_down.weight`, dims: [N_FF, N_EMBD], data: down }
    )
  }
  tensors.push(
    { name: "output_norm.weight", dims: [N_EMBD], data: ones(N_EMBD) },
    { name: "output.weight", dims: [N_EMBD, nVocab], data: output }
  )

  const meta = new Map<string, GgufValue>([
    ["general.architecture", gv.str("llama")],
    ["general.name", gv.str(`cgn-tiny-${variant}`)],
    ["general.alignment", gv.u32(32)],
    ["llama.context_length", gv.u32(contextLength)],
    ["llama.embedding_length", gv.u32(N_EMBD)],
    ["llama.block_count", gv.u32(N_LAYER)],
    ["llama.feed_forward_length", gv.u32(N_FF)],
    ["llama.attention.head_count", gv.u32(N_HEAD)],
    ["llama.attention.head_count_kv", gv.u32(N_HEAD)],
    ["llama.attention.layer_norm_rms_epsilon", gv.f32(1e-5)],
    ["llama.rope.dimension_count", gv.u32(N_EMBD / N_HEAD)],
    ["llama.vocab_size", gv.u32(nVocab)]
  ])
  for (const [k, v] of vocab) if (k.startsWith("tokenizer.")) meta.set(k, v)
  return writeGguf(meta, tensors)
}

/** Writes the tiny model to `file` (its size is about 17 MB: two 64 x 32000 F32 matrices dominate). */
export const writeTinyLlama = (vocabFile: string, file: string, variant: TinyVariant, contextLength?: number): void =>
  fs.writeFileSync(file, tinyLlama(vocabFile, variant, contextLength))
