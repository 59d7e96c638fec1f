// ChunkDecoder (services/engine/ChunkDecoder.ts): what chunk-decoder.test.ts does not pin. A chat delta's other
// fields survive the template (SGLang sends them on every token), the decoder learns from a chunk whose token text
// holds an escaped quote, and a template that matched before it was replaced does not count against learning, so a
// llama.cpp stream of many seconds (its `created` changes once a second) keeps its shortcut to the end, while a
// template that never matched does, also after an earlier one that did.
import { describe, expect, it } from "vitest"
import { ChunkDecoder, MAX_FRUITLESS_TEMPLATES } from "../../src/services/engine/ChunkDecoder.ts"

const lit = (s: string): string => JSON.stringify(s)

/** Decodes every chunk, checking it against JSON.parse (key order included); returns the decoder. */
const decodeAll = (chunks: ReadonlyArray<string>): ChunkDecoder => {
  const d = new ChunkDecoder()
  for (const c of chunks) {
    const got = d.decode(c)
    expect(got, c).toStrictEqual(JSON.parse(c))
    expect(JSON.stringify(got), c).toBe(JSON.stringify(JSON.parse(c)))
  }
  return d
}

// SGLang's chat chunk: DeltaMessage serialized with its unset fields as null (python/sglang/srt/entrypoints/openai/
// protocol.py, ChatCompletionStreamResponse / DeltaMessage).
const sglangChat = (t: string) =>
  `{"id":"5f1c","object":"chat.completion.chunk","created":1796322202,"model":"m","choices":[{"index":0,"delta":{"role":null,"content":${lit(t)},"reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}`
// llama.cpp's chat chunk (tools/server/server.cpp): `created` is the time in seconds, so it changes once a second.
const llamaChat = (t: string, created: number) =>
  `{"choices":[{"finish_reason":null,"index":0,"delta":{"content":${lit(t)}}}],"created":${created},"id":"chatcmpl-ab","model":"gpt-3.5-turbo","system_fingerprint":"b1-xyz","object":"chat.completion.chunk"}`
const vllmCompletion = (t: string) =>
  `{"id":"cmpl-4842f3b5","object":"text_completion","created":1796322202,"model":"m","choices":[{"index":0,"text":${lit(t)},"logprobs":null,"finish_reason":null,"stop_reason":null}]}`

describe("ChunkDecoder learning", () => {
  it("a chat delta's other fields are kept in the templated chunks, as JSON.parse gives them", () => {
    const d = decodeAll(["Hello", " world", ",", " how", " are"].map(sglangChat))
    expect(d.learned).toBe(1)
    expect(d.templated).toBe(3)
  })

  it("learns from a chunk whose token text holds an escaped quote", () => {
    // the literal's closing quote is found past its escapes: `"say \"hi\""` ends at its last quote
    const d = decodeAll([vllmCompletion("a"), vllmCompletion('say "hi"'), vllmCompletion("b"), vllmCompletion("c")])
    expect(d.learned).toBe(1)
    expect(d.templated).toBe(2)
  })

  it("a llama.cpp stream over many seconds relearns each second and keeps the shortcut to the end", () => {
    const tokens = ["a", "b", "c", "d", "e"]
    const chunks = Array.from({ length: 8 }, (_, s) => tokens.map((t) => llamaChat(t, 1_000 + s))).flat()
    const d = decodeAll(chunks)
    // learned from the 2nd chunk, then from each second's first chunk (a miss, parsed whole): 8 templates
    expect(d.learned).toBe(8)
    // every chunk but the first two and each later second's first is templated
    expect(d.templated).toBe(chunks.length - 2 - 7)
  })

  it("templates that never match stop the learning also after one that matched: the count starts from each template", () => {
    const choice = (index: number, t: string) => `{"id":"c","choices":[{"index":${index},"text":${lit(t)}}]}`
    const letters = "abcdefghijklmnopqrstuvwxyz".split("")
    // a run of one choice (its template matches), then two choices alternating (n > 1: none matches the next chunk)
    const d = decodeAll([...letters.slice(0, 6).map((t) => choice(0, t)), ...letters.map((t, i) => choice(i % 2, t))])
    // the matched template, the first one replacing it, then MAX_FRUITLESS_TEMPLATES that never matched
    expect(d.learned).toBe(1 + 1 + MAX_FRUITLESS_TEMPLATES)
  })
})
