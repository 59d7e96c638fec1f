/**
 * ChunkDecoder: `JSON.parse` for one stream's SSE `data:` texts, with a shortcut for the chunks that differ from
 * the one before only in their token text (pure, I/O free).
 *
 * An engine's token chunks repeat everything but the text: vLLM and SGLang keep `id`, `created` and `model` for
 * the whole request, llama.cpp changes `created` once a second. Parsing each whole chunk (~0.5 µs and ~300 bytes
 * of garbage per token here) was the largest cost of a relayed token where tokens come batched (docs/bench.md,
 * "Chunks decoded against the one before"). So the decoder learns, from a parsed chunk, the JSON text before and
 * after the string literal of its token text (`choices[0].text`, or `choices[0].delta.content` for chat), and
 * decodes a later chunk with the same text around that literal by parsing the literal alone and copying the
 * learned object with the new text.
 *
 * Why the result is always what `JSON.parse` returns: the later chunk is `prefix + literal + suffix`, and
 * `JSON.parse(literal)` accepts only one complete string token, so the chunk's tokens are the learned chunk's with
 * that one string replaced, and its value is the learned object with that one leaf replaced. Which leaf that is
 * was checked when learning, by parsing the chunk once with a marker in the literal's place (duplicate keys and a
 * `"text":` inside another value fail that check and leave the decoder parsing whole chunks). Anything else (a
 * finish or usage chunk, another choice index, a malformed literal) is parsed whole, as before.
 */
import { isJsonObject, type JsonObject } from "./EngineClient.ts"

/** What a chunk's token text is read from, as ChunkReader reads it: the delta's content when there is a delta. */
type TextPath = "text" | "delta"

/** Parsed whole chunks in a row whose template never matched, after which the decoder stops learning. */
export const MAX_FRUITLESS_TEMPLATES = 3

/** A marker no engine sends as a token, put in the literal's place to check which leaf the literal is. */
const MARKER = "\u0000cgn-template-marker"
const MARKER_LITERAL = JSON.stringify(MARKER)

/** The learned chunk: its JSON text around the token literal (quotes included on both sides) and its object. */
export interface ChunkTemplate {
  readonly prefix: string
  readonly suffix: string
  readonly object: JsonObject
  readonly path: TextPath
}

const isText = (v: unknown): boolean => typeof v === "string" && v !== ""

/**
 * Where the single choice's token text is, or undefined when the chunk has no token text. A chunk with empty text
 * (a chat stream's role chunk, a finish chunk) is no token's shape: learning from it would be wasted.
 */
const textPathOf = (o: JsonObject): TextPath | undefined => {
  const choices = o.choices
  if (!Array.isArray(choices) || choices.length !== 1 || !isJsonObject(choices[0])) return undefined
  const c = choices[0]
  if (c.delta !== undefined) return isJsonObject(c.delta) && isText(c.delta.content) ? "delta" : undefined
  return isText(c.text) ? "text" : undefined
}

const textAt = (o: unknown, path: TextPath): unknown => {
  if (!isJsonObject(o) || !Array.isArray(o.choices) || !isJsonObject(o.choices[0])) return undefined
  const c = o.choices[0]
  return path === "text" ? c.text : isJsonObject(c.delta) ? c.delta.content : undefined
}

/** The learned object with its token text replaced: the same keys in the same order, as JSON.parse builds them. */
export const withText = (t: ChunkTemplate, text: string): JsonObject => {
  const c = (t.object.choices as ReadonlyArray<JsonObject>)[0]!
  const choice = t.path === "text" ? { ...c, text } : { ...c, delta: { ...(c.delta as JsonObject), content: text } }
  return { ...t.object, choices: [choice] }
}

/** Index of the quote that closes the string literal opened at `open`, or -1. */
const closingQuote = (json: string, open: number): number => {
  for (let i = open + 1; i < json.length; i++) {
    const ch = json.charCodeAt(i)
    if (ch === 92 /* \ */) i++
    else if (ch === 34 /* " */) return i
  }
  return -1
}

/** A copy that holds no reference to the (larger) text it was sliced from. */
const detached = (s: string): string => JSON.parse(JSON.stringify(s)) as string

/**
 * The template of `json`, whose parse is `object`, or undefined when its token text cannot be located for
 * certain. Costs one more parse of the chunk (the marker check).
 */
export const learnTemplate = (json: string, object: JsonObject): ChunkTemplate | undefined => {
  const path = textPathOf(object)
  if (path === undefined) return undefined
  const key = path === "text" ? '"text"' : '"content"'
  for (let at = json.indexOf(key); at !== -1; at = json.indexOf(key, at + 1)) {
    let open = at + key.length
    while (json.charCodeAt(open) !== 58 /* : */ && open < json.length && json.charCodeAt(open) <= 32) open++
    if (json.charCodeAt(open) !== 58) continue
    open++
    while (open < json.length && json.charCodeAt(open) <= 32) open++
    if (json.charCodeAt(open) !== 34) continue
    const close = closingQuote(json, open)
    if (close === -1) return undefined
    const prefix = json.slice(0, open)
    const suffix = json.slice(close + 1)
    let probe: unknown
    try {
      probe = JSON.parse(prefix + MARKER_LITERAL + suffix)
    } catch {
      continue
    }
    if (textAt(probe, path) !== MARKER) continue
    return { prefix: detached(`${prefix}"`), suffix: detached(`"${suffix}`), object, path }
  }
  return undefined
}

/** The object `json` parses to if it is the template's chunk with another token text, else undefined. */
export const matchTemplate = (t: ChunkTemplate, json: string): JsonObject | undefined => {
  const p = t.prefix.length
  const s = t.suffix.length
  if (json.length < p + s || json.slice(0, p) !== t.prefix || json.slice(json.length - s) !== t.suffix) return undefined
  let text: unknown
  try {
    // The literal with both its quotes: the prefix ends with the opening one, the suffix starts with the closing.
    text = JSON.parse(json.slice(p - 1, json.length - s + 1))
  } catch {
    return undefined
  }
  return withText(t, text as string)
}

/**
 * One stream's decoder: `decode` returns what `JSON.parse(json)` returns, and throws where it throws. It learns
 * from the second whole chunk on, so that a call of one token pays nothing for it. Values off the text's path
 * (a `logprobs` object, say) are shared between the chunks one template decodes: chunks are read, never changed.
 */
export class ChunkDecoder {
  private template: ChunkTemplate | undefined = undefined
  private hits = 0
  private fruitless = 0
  private parsed = 0
  /** Chunks decoded by their template, not parsed whole, and templates learned (for tests). */
  templated = 0
  learned = 0

  decode(json: string): unknown {
    const t = this.template
    if (t !== undefined) {
      const v = matchTemplate(t, json)
      if (v !== undefined) {
        this.hits++
        this.templated++
        return v
      }
    }
    const v: unknown = JSON.parse(json)
    if (++this.parsed < 2 || this.fruitless >= MAX_FRUITLESS_TEMPLATES || !isJsonObject(v)) return v
    const learned = learnTemplate(json, v)
    if (learned === undefined) return v
    // A template replaced before it ever matched counts against learning more.
    if (t !== undefined) this.fruitless = this.hits === 0 ? this.fruitless + 1 : 0
    this.template = learned
    this.hits = 0
    this.learned++
    return v
  }
}
