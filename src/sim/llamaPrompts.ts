// How llama-server reads a completion's `prompt` (pure): tools/server/server-common.cpp tokenize_input_prompts and
// tokenize_mixed (ggml-org/llama.cpp). A text's tokens are the model's tokenizer's where the model file has one the
// simulator reads (spmVocab.ts: a llama SentencePiece GGUF), else its whitespace words after a BOS.

import { typeName } from "./llamaFields.ts"
import { BOS, type LlamaInvalid, type LlamaPrompt } from "./llamaRequest.ts"
import { words } from "./tokens.ts"

/**
 * A text's tokens, the BOS first where `addSpecial` (tokenize_mixed: a prompt's first element when a string): the
 * model's tokenizer's, or undefined for the simulator's words.
 */
export type Tokenize = ((text: string, addSpecial: boolean) => ReadonlyArray<string>) | undefined

const asPrompt = (w: ReadonlyArray<string>, bos: boolean): LlamaPrompt => ({ words: w, tokens: bos ? [BOS, ...w] : w })

/** A text prompt: its words, and its tokens as the tokenizer makes them. */
const textPrompt = (s: string, tokenize: Tokenize): LlamaPrompt =>
  tokenize === undefined ? asPrompt(words(s), true) : { words: words(s), tokens: tokenize(s, true) }

const PROMPT_ELEMENTS =
  '"prompt" elements must be a string, a list of tokens, a JSON object containing a prompt string, or a list of mixed strings & tokens.'

const isInt = (v: unknown): boolean => typeof v === "number" && Number.isInteger(v)

/** One sub-prompt (tokenize_input_subprompt): a string, token ids, strings and ids mixed, or {prompt_string}. */
const subPrompt = (p: unknown, tokenize: Tokenize): LlamaPrompt | undefined => {
  if (typeof p === "string") return textPrompt(p, tokenize)
  if (Array.isArray(p)) {
    if (p.length > 0 && p.every(isInt)) return asPrompt(p.map(String), false)
    const mixed =
      p.every((x) => isInt(x) || typeof x === "string") && p.some(isInt) && p.some((x) => typeof x === "string")
    if (mixed && tokenize !== undefined) {
      // the BOS before a first element that is a string; every text with its own space prefix
      const tokens = p.flatMap((x, i) => (typeof x === "string" ? tokenize(x, i === 0) : [String(x)]))
      return { words: p.flatMap((x) => (typeof x === "string" ? words(x) : [String(x)])), tokens }
    }
    if (mixed)
      return asPrompt(
        p.flatMap((x) => (typeof x === "string" ? words(x) : [String(x)])),
        typeof p[0] === "string"
      )
    if (p.length === 0) return asPrompt([], false)
  }
  if (typeof p === "object" && p !== null && !Array.isArray(p) && "prompt_string" in p) {
    const s = (p as { prompt_string: unknown }).prompt_string
    return typeof s === "string" ? textPrompt(s, tokenize) : undefined
  }
  return undefined
}

/**
 * /v1/completions' prompts (tokenize_input_prompts): an array with no integer in it is several prompts, each
 * answered (times `n`) as its own choice; anything else is one. A body that is no object fails at
 * `data.at("prompt")`, as nlohmann words it.
 */
export const llamaPrompts = (body: unknown, tokenize?: Tokenize): Array<LlamaPrompt> | LlamaInvalid => {
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    return { status: 400, message: `[json.exception.type_error.304] cannot use at() with ${typeName(body)}` }
  }
  if (!("prompt" in body)) return { status: 400, message: "[json.exception.out_of_range.403] key 'prompt' not found" }
  const prompt = (body as { prompt: unknown }).prompt
  const many = Array.isArray(prompt) && !prompt.some(isInt)
  const out: Array<LlamaPrompt> = []
  for (const p of many ? (prompt as Array<unknown>) : [prompt]) {
    const one = subPrompt(p, tokenize)
    if (one === undefined) return { status: 400, message: PROMPT_ELEMENTS }
    out.push(one)
  }
  if (out.length === 0) return { status: 400, message: '"prompt" must not be empty' }
  return out
}
