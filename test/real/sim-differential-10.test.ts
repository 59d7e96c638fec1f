// Differential check of the llama_cpp simulator against the real llama-server: a prompt's tokens are counted by the
// model's tokenizer (the tiny model's llama SentencePiece vocabulary, read from the GGUF: src/sim/spmVocab.ts), not
// as whitespace words. ASCII, accents, CJK, emoji (byte fallback), newlines and runs of spaces, special tokens in the
// text, token ids mixed with strings, a chat's rendering: usage.prompt_tokens exactly; a prompt too long for the
// slot's context refused alike (exceed_context_size_error, its count in the body).
import { beforeAll, describe, expect, it } from "vitest"
import { postOnOwnConnection as post } from "./engine.ts"
import { answersOf, type Pair, pairs, sameAnswers } from "./simPair.ts"

const diff = pairs("cgn-real-diff10-")
let pair: Pair
let small: Pair

beforeAll(async () => {
  ;[pair, small] = [await diff.pair(), await diff.pair({ ctx: 64, np: 1 })]
}, 30 * 60_000)

const PROMPTS: ReadonlyArray<unknown> = [
  "hello world",
  "the quick brown fox jumps over the lazy dog",
  "héllo wörld 日本語のテキスト 😀🎉 ünïcödé",
  "😀".repeat(30),
  " ",
  "a\nb\n\nc\r\n",
  "  two  spaces \t tab ",
  "<s></s>[INST] <|im_start|>system\nhi<|im_end|>",
  "The quick brown fox. 1234567890!@#$%^&*() don't stop-believing; it's 3.14",
  "Ω≈ç√∫˜µ≤≥÷ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
  Array.from({ length: 120 }, (_, i) => `word${i}`).join(" "),
  ["several", "prompts"],
  ["mixed", 1000, "ids and text"],
  [500, "text after an id"],
  { prompt_string: "an object's prompt string" }
]

/** Every choice's prompt_tokens: llama-server reports one usage, the first prompt's (several prompts: each in turn). */
const promptTokens = async (base: string, path: string, body: Record<string, unknown>) => {
  const r = await post(base, path, { max_tokens: 1, ...body })
  expect(r.status, r.text).toBe(200)
  return (JSON.parse(r.text) as { usage: { prompt_tokens: number } }).usage.prompt_tokens
}

describe("prompt tokens: the simulator counts with the model's tokenizer, as the real server does", () => {
  it("completions: the same usage.prompt_tokens for each prompt", async () => {
    for (const prompt of PROMPTS) {
      const real = await promptTokens(pair.real, "/v1/completions", { prompt })
      expect([prompt, await promptTokens(pair.sim, "/v1/completions", { prompt })]).toEqual([prompt, real])
    }
  })

  it("chats: the rendered template's tokens", async () => {
    for (const content of ["hi", "héllo 😀\nthere", "<s> in a message", " leading and trailing "]) {
      const body = {
        messages: [
          { role: "system", content: "be brief" },
          { role: "user", content }
        ]
      }
      const real = await promptTokens(pair.real, "/v1/chat/completions", body)
      expect([content, await promptTokens(pair.sim, "/v1/chat/completions", body)]).toEqual([content, real])
    }
  })

  it("a prompt too long for the slot's context in tokens, though short in words, is refused alike", async () => {
    // -c 64 -np 1 is a slot of 256 tokens (llamaContext.ts): 70 emoji are 282 tokens, one word
    for (const prompt of ["😀".repeat(70), "日本語のテキスト ".repeat(40), "😀".repeat(60)]) {
      const answers = await answersOf(small, "/v1/completions", { prompt, max_tokens: 1 })
      expect(answers).toEqual(sameAnswers(answers))
    }
    const refused = await answersOf(small, "/v1/completions", { prompt: "😀".repeat(70), max_tokens: 1 })
    expect(refused[0]).toBe(400)
    expect(String(refused[1])).toContain("exceed_context_size_error")
  })
})
