// Token generation of the simulator (pure): echo the prompt's words, or seeded random words.
// A "token" is one word with its leading space, so streamed text concatenates back to readable output.
// Token ids (for KV block hashing) are stable per word, so equal prompts give equal block hashes.

/** mulberry32: small, fast, seedable PRNG; returns floats in [0, 1). */
export const prng = (seed: number): (() => number) => {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

/** The words of random mode (and of a logprobs list's alternatives). */
export const WORDS =
  "the of and to in is that for it as with was on be by at this from or an are not have which but all one their has more can will about there when also so what some into only other time than then its new two first any like these may such over most where after well just".split(
    " "
  )

/** Whitespace words of a prompt. */
export const words = (text: string): Array<string> => text.split(/\s+/).filter((w) => w.length > 0)

/** The simulated vocabulary's size (llama.cpp's /v1/models meta.n_vocab; its prompts' token ids are below it). */
export const N_VOCAB = 32000

/** A stable id in [0, N_VOCAB) for a word (FNV-1a). */
export const tokenId = (word: string): number => {
  let h = 0x811c9dc5
  for (let i = 0; i < word.length; i++) h = Math.imul(h ^ word.charCodeAt(i), 0x01000193)
  return (h >>> 0) % N_VOCAB
}

/**
 * The seed of a greedy request's words: its prompt's tokens (FNV-1a over their ids), so the same prompt gives the
 * same text, as greedy sampling does in every engine (requestChecks.ts greedySampling).
 */
export const promptSeed = (tokens: ReadonlyArray<string>): number => {
  let h = 0x811c9dc5
  for (const t of tokens) h = Math.imul(h ^ tokenId(t), 0x01000193)
  return h >>> 0
}

export interface Generation {
  /** Output tokens, each a text piece. */
  readonly tokens: ReadonlyArray<string>
  readonly finishReason: "stop" | "length"
}

/**
 * Plans a generation: echo stops with "stop" when the prompt's words run out (the end-of-sequence token),
 * "length" when max_tokens is reached first; with `ignoreEos` (the engines' `ignore_eos`) it goes on, the
 * prompt's words again, to max_tokens. Random always runs to max_tokens ("length"); with `firstSpace` its first word
 * has its leading space too: llama-server's every piece is its token's text as the vocabulary has it
 * (ggml-org/llama.cpp common/common.cpp common_token_to_piece; SentencePiece's "▁will" is " will", the first of a
 * completion's or a chat's answer as well: measured against the real server).
 */
export const plan = (
  mode: "echo" | "random",
  promptWords: ReadonlyArray<string>,
  maxTokens: number,
  rand: () => number,
  ignoreEos = false,
  firstSpace = false
): Generation => {
  const tokens: Array<string> = []
  if (mode === "echo") {
    const n = ignoreEos && promptWords.length > 0 ? maxTokens : Math.min(promptWords.length, maxTokens)
    for (let i = 0; i < n; i++) {
      const w = promptWords[i % promptWords.length] ?? ""
      tokens.push(i === 0 ? w : ` ${w}`)
    }
    // The end-of-sequence token would be one more: at exactly max_tokens words the budget ends it first.
    const capped = promptWords.length >= maxTokens || (ignoreEos && n === maxTokens)
    return { tokens, finishReason: capped ? "length" : "stop" }
  }
  for (let i = 0; i < maxTokens; i++) {
    const w = WORDS[Math.floor(rand() * WORDS.length)] ?? "the"
    tokens.push(i === 0 && !firstSpace ? w : ` ${w}`)
  }
  return { tokens, finishReason: "length" }
}
