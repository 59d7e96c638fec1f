// ChunkDecoder: every chunk decodes to exactly what JSON.parse gives (values and key order), throws where
// JSON.parse throws, and the template shortcut is actually taken for the engines' token chunks.
import { describe, expect, it } from "vitest"
import {
  ChunkDecoder,
  learnTemplate,
  MAX_FRUITLESS_TEMPLATES,
  matchTemplate
} from "../../src/services/engine/ChunkDecoder.ts"
import type { JsonObject } from "../../src/services/engine/EngineClient.ts"

const lit = (s: string): string => JSON.stringify(s)

// Token chunks as the engines write them (field order and spacing from their serializers).
const vllmCompletion = (t: string, finish = "null") =>
  `{"id":"cmpl-4842f3b5","object":"text_completion","created":1796322202,"model":"m","choices":[{"index":0,"text":${lit(t)},"logprobs":null,"finish_reason":${finish},"stop_reason":null}]}`
const vllmChat = (t: string) =>
  `{"id":"chatcmpl-3678","object":"chat.completion.chunk","created":1796322202,"model":"m","choices":[{"index":0,"delta":{"content":${lit(t)}},"logprobs":null,"finish_reason":null}]}`
const vllmChatRole =
  '{"id":"chatcmpl-3678","object":"chat.completion.chunk","created":1796322202,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}'
const llamaChat = (t: string, created: number) =>
  `{"choices":[{"finish_reason":null,"index":0,"delta":{"content":${lit(t)}}}],"created":${created},"id":"chatcmpl-ab","model":"gpt-3.5-turbo","system_fingerprint":"b1-xyz","object":"chat.completion.chunk"}`
const spaced = (t: string) =>
  `{ "id": "x", "choices": [ { "index": 0, "text" :  ${lit(t)} , "finish_reason": null } ] }`
const usage =
  '{"id":"cmpl-4842f3b5","object":"text_completion","created":1796322202,"model":"m","choices":[],"usage":{"prompt_tokens":3,"total_tokens":7,"completion_tokens":4}}'

const TEXTS = [
  "Hello",
  " world",
  "",
  "\n",
  'say "hi"',
  "back\\slash",
  "é",
  "世界",
  "😀",
  "\u0001",
  "\ud800",
  "}]},{",
  '","x":"'
]

/** Decodes every chunk and checks it against JSON.parse, key order included; returns the decoder. */
const decodeAll = (chunks: ReadonlyArray<string>): ChunkDecoder => {
  const d = new ChunkDecoder()
  for (const c of chunks) {
    let want: unknown
    let wantError: unknown
    try {
      want = JSON.parse(c)
    } catch (e) {
      wantError = e
    }
    if (wantError !== undefined) {
      expect(() => d.decode(c), c).toThrow(SyntaxError)
      continue
    }
    const got = d.decode(c)
    expect(got, c).toStrictEqual(want)
    expect(JSON.stringify(got), c).toBe(JSON.stringify(want))
  }
  return d
}

describe("ChunkDecoder", () => {
  it("decodes vLLM completion chunks by their template, the finish and usage chunks whole", () => {
    const d = decodeAll([...TEXTS.map((t) => vllmCompletion(t)), vllmCompletion("", '"length"'), usage])
    // The first two are parsed (learning starts at the second), every other token chunk takes the template;
    // the finish chunk (empty text) teaches nothing.
    expect(d.templated).toBe(TEXTS.length - 2)
    expect(d.learned).toBe(1)
  })

  it("learns past a chat stream's role chunk", () => {
    const d = decodeAll([vllmChatRole, ...TEXTS.map(vllmChat)])
    expect(d.templated).toBe(TEXTS.length - 1)
    expect(learnTemplate(vllmChatRole, JSON.parse(vllmChatRole))).toBeUndefined()
  })

  it("relearns when a field around the text changes (llama.cpp's created, once a second)", () => {
    const d = decodeAll([...TEXTS.map((t) => llamaChat(t, 1000)), ...TEXTS.map((t) => llamaChat(t, 1001))])
    // The first chunk of the new second misses and is parsed; the decoder learns from it at once.
    expect(d.learned).toBe(2)
    expect(d.templated).toBe(2 * TEXTS.length - 3)
  })

  it("keeps the engine's spacing and still takes the template", () => {
    expect(decodeAll(TEXTS.map(spaced)).templated).toBe(TEXTS.length - 2)
  })

  it("throws where JSON.parse throws, also when the text around the literal matches", () => {
    const good = vllmCompletion("a")
    const [head, tail] = good.split('"a"') as [string, string]
    const bad = ['"a"b"', '"a\\"', '"\\x"', '"a\nb"', '"a', '"a" , "b"', '"\\u12"'].map((l) => head + l + tail)
    const d = decodeAll([good, good, ...bad, good])
    expect(d.templated).toBe(1)
  })

  it("matches JSON.parse for random literals between a learned prefix and suffix", () => {
    const alphabet = ['"', "\\", "u", "0", "a", ",", ":", "}", "]", "{", " ", "\n", "\u0001", "é", "n", "/"]
    let seed = 7
    const next = () => {
      seed = (seed * 1103515245 + 12345) & 0x7fffffff
      return seed
    }
    const [head, tail] = vllmCompletion("x").split('"x"') as [string, string]
    const chunks = [vllmCompletion("a"), vllmCompletion("b")]
    for (let i = 0; i < 2000; i++) {
      let m = ""
      const n = next() % 8
      for (let j = 0; j < n; j++) m += alphabet[next() % alphabet.length]
      chunks.push(`${head}"${m}"${tail}`)
    }
    expect(decodeAll(chunks).templated).toBeGreaterThan(100)
  })

  it("locates the choice's text, not another text key or a duplicate", () => {
    const decoy = (t: string) =>
      `{"model":"m","meta":{"text":"x"},"note":"\\"text\\":\\"y\\"","choices":[{"index":0,"text":${lit(t)}}]}`
    expect(decodeAll(TEXTS.map(decoy)).templated).toBe(TEXTS.length - 2)
    // With a duplicate key the later one wins; the template, if any, must give the same.
    decodeAll(TEXTS.map((t) => `{"choices":[{"text":${lit(t)},"text":"fixed"}]}`))
    decodeAll(TEXTS.map((t) => `{"choices":[{"text":"fixed","text":${lit(t)}}]}`))
  })

  it("learns nothing from chunks without one choice's text", () => {
    const o = (s: string) => JSON.parse(s) as JsonObject
    expect(learnTemplate(usage, o(usage))).toBeUndefined()
    const error = '{"object":"error","message":"boom","type":"BadRequestError","code":400}'
    expect(learnTemplate(error, o(error))).toBeUndefined()
    const two = '{"choices":[{"index":0,"text":"a"},{"index":1,"text":"b"}]}'
    expect(learnTemplate(two, o(two))).toBeUndefined()
    const t = learnTemplate(vllmCompletion("a"), o(vllmCompletion("a")))
    expect(t).toBeDefined()
    expect(matchTemplate(t!, vllmChat("a"))).toBeUndefined()
    expect(matchTemplate(t!, vllmCompletion("zz"))).toStrictEqual(o(vllmCompletion("zz")))
  })

  it("gives up learning after templates that never match (n > 1: the choice index alternates)", () => {
    const alternating = TEXTS.filter((t) => t !== "").flatMap((t) => [
      `{"id":"c","choices":[{"index":0,"text":${lit(t)}}]}`,
      `{"id":"c","choices":[{"index":1,"text":${lit(t)}}]}`
    ])
    const d = decodeAll([...alternating, ...alternating])
    // The last template stays (it is right for every other chunk); nothing more is learned.
    expect(d.learned).toBe(MAX_FRUITLESS_TEMPLATES + 1)
    expect(d.templated).toBeLessThanOrEqual(alternating.length)
  })
})
