// A llama SentencePiece vocabulary read from a GGUF model file, and llama.cpp's tokenizer over it, so the llama_cpp
// flavor counts a prompt's tokens as llama-server does (usage.prompt_tokens, the context-size refusal, /slots).
// ggml-org/llama.cpp src/llama-vocab.cpp: llama_vocab::impl::load (tokenizer.ggml.tokens, scores, token_type; "llama"
// is SPM, whose add_space_prefix and add_bos are true unless the file says otherwise; token_to_id keeps a text's last
// id), tokenize (the special tokens split out first: tokenizer_st_partition; a space before a text that starts the
// prompt or follows a special token; spaces escaped to U+2581) and llm_tokenizer_spm_session (the highest-scored
// bigram that is a token merged first, the leftmost among equals; what is no token falls back to its <0xXX> bytes).
// Texts are handled as UTF-8 bytes, one char each (latin1 strings), as the C++ handles std::string.
import { ARRAY, readGgufHeader, SCALAR_SIZE, STRING } from "./ggufMeta.ts"

export interface SpmVocab {
  /** Each token's text as it is in the file (UTF-8). */
  readonly pieces: ReadonlyArray<string>
  /** Each token's type (llama_token_type: 1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte). */
  readonly types: ReadonlyArray<number>
  readonly scores: Float32Array
  /** A token's text as UTF-8 bytes -> its id (the last of equal texts). */
  readonly ids: ReadonlyMap<string, number>
  /** Control, user-defined and unknown tokens as bytes, the longest first: split out of a text before the rest. */
  readonly special: ReadonlyArray<readonly [string, number]>
  readonly addSpacePrefix: boolean
  readonly addBos: boolean
  readonly bos: number
}

/** GGUF token types (llama_token_type) that tokenizer_st_partition splits out: unknown, control, user-defined. */
const SPECIAL_TYPES = new Set([2, 3, 4])
const F32 = 6

const bytes = (s: string): string => Buffer.from(s, "utf8").toString("latin1")

/** The vocabulary of a GGUF file whose tokenizer.ggml.model is "llama"; undefined for any other file or none. */
export const readSpmVocab = (file: string): SpmVocab | undefined =>
  readGgufHeader(file, (r, kvs) => {
    let model: string | undefined
    let pieces: Array<string> = []
    let scores = new Float32Array(0)
    let types: Array<number> = []
    const flags = new Map<string, number>()
    for (let i = 0; i < kvs; i++) {
      const key = r.str()
      const type = r.u32()
      if (key === "tokenizer.ggml.model" && type === STRING) model = r.str()
      else if (type === ARRAY && key.startsWith("tokenizer.ggml.")) {
        const inner = r.u32()
        const n = r.u64()
        if (key === "tokenizer.ggml.tokens" && inner === STRING) pieces = Array.from({ length: n }, () => r.str())
        else if (key === "tokenizer.ggml.scores" && inner === F32)
          scores = Float32Array.from({ length: n }, () => r.f32())
        else if (key === "tokenizer.ggml.token_type" && SCALAR_SIZE[inner] === 4)
          types = Array.from({ length: n }, () => r.scalar(inner))
        else for (let j = 0; j < n; j++) r.skipValue(inner)
      } else if (key.startsWith("tokenizer.ggml.") && SCALAR_SIZE[type] !== undefined) flags.set(key, r.scalar(type))
      else r.skipValue(type)
    }
    if (model !== "llama" || pieces.length === 0) return undefined
    // llama_vocab::impl::load names an empty token "[EMPTY_<id>]" (src/llama-vocab.cpp), its text from then on
    pieces = pieces.map((p, i) => (p === "" ? `[EMPTY_${i}]` : p))
    const ids = new Map<string, number>()
    for (const [id, p] of pieces.entries()) ids.set(bytes(p), id)
    const special = pieces
      .map((p, id) => [bytes(p), id] as const)
      .filter(([p, id]) => p !== "" && SPECIAL_TYPES.has(types[id] ?? 1))
      .sort((a, b) => b[0].length - a[0].length)
    const flag = (k: string, dflt: boolean) => (flags.has(k) ? flags.get(k) !== 0 : dflt)
    return {
      pieces,
      types: pieces.map((_, id) => types[id] ?? 1),
      scores: scores.length === pieces.length ? scores : new Float32Array(pieces.length),
      ids,
      special,
      addSpacePrefix: flag("tokenizer.ggml.add_space_prefix", true),
      addBos: flag("tokenizer.ggml.add_bos_token", true),
      bos: flags.get("tokenizer.ggml.bos_token_id") ?? 1
    }
  })

interface Symbol {
  start: number
  n: number
  prev: number
  next: number
}

interface Bigram {
  readonly left: number
  readonly right: number
  readonly score: number
  readonly size: number
}

/** llm_bigram_spm::comparator's order: the higher score first, then the leftmost. */
const before = (a: Bigram, b: Bigram): boolean => a.score > b.score || (a.score === b.score && a.left < b.left)

/** A binary heap of bigrams (std::priority_queue). */
class Queue {
  private readonly h: Array<Bigram> = []
  get size(): number {
    return this.h.length
  }
  push(b: Bigram): void {
    const h = this.h
    h.push(b)
    for (let i = h.length - 1; i > 0; ) {
      const p = (i - 1) >> 1
      if (!before(h[i] as Bigram, h[p] as Bigram)) break
      ;[h[i], h[p]] = [h[p] as Bigram, h[i] as Bigram]
      i = p
    }
  }
  pop(): Bigram {
    const h = this.h
    const top = h[0] as Bigram
    const last = h.pop() as Bigram
    if (h.length > 0) {
      h[0] = last
      for (let i = 0; ; ) {
        const [l, r] = [2 * i + 1, 2 * i + 2]
        let m = i
        if (l < h.length && before(h[l] as Bigram, h[m] as Bigram)) m = l
        if (r < h.length && before(h[r] as Bigram, h[m] as Bigram)) m = r
        if (m === i) break
        ;[h[i], h[m]] = [h[m] as Bigram, h[i] as Bigram]
        i = m
      }
    }
    return top
  }
}

/** unicode_len_utf8: a UTF-8 sequence's length by its first byte's high nibble. */
const UTF8_LEN = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4]

/** llm_tokenizer_spm_session::tokenize of one escaped text (bytes), its ids appended to `out`. */
const session = (v: SpmVocab, text: string, out: Array<number>): void => {
  const symbols: Array<Symbol> = []
  for (let offs = 0; offs < text.length; ) {
    const n = Math.min(UTF8_LEN[text.charCodeAt(offs) >> 4] ?? 1, text.length - offs)
    const index = symbols.length
    offs += n
    symbols.push({ start: offs - n, n, prev: index - 1, next: offs === text.length ? -1 : index + 1 })
  }
  const queue = new Queue()
  const revMerge = new Map<string, readonly [number, number]>()
  const symText = (s: Symbol, n = s.n) => text.slice(s.start, s.start + n)
  const tryAdd = (left: number, right: number) => {
    if (left === -1 || right === -1) return
    const [l, r] = [symbols[left] as Symbol, symbols[right] as Symbol]
    const t = symText(l, l.n + r.n)
    const id = v.ids.get(t)
    if (id === undefined) return
    queue.push({ left, right, score: v.scores[id] ?? 0, size: t.length })
    revMerge.set(t, [left, right])
  }
  for (let i = 1; i < symbols.length; i++) tryAdd(i - 1, i)
  while (queue.size > 0) {
    const b = queue.pop()
    const [l, r] = [symbols[b.left] as Symbol, symbols[b.right] as Symbol]
    if (l.n === 0 || r.n === 0 || l.n + r.n !== b.size) continue
    l.n += r.n
    r.n = 0
    l.next = r.next
    if (r.next >= 0) (symbols[r.next] as Symbol).prev = b.left
    tryAdd(l.prev, b.left)
    tryAdd(b.left, l.next)
  }
  const resegment = (s: Symbol) => {
    const t = symText(s)
    const id = v.ids.get(t)
    if (id !== undefined) return void out.push(id)
    const p = revMerge.get(t)
    if (p === undefined) {
      for (let j = 0; j < t.length; j++) {
        const c = t.charCodeAt(j)
        const hex = `<0x${c.toString(16).toUpperCase().padStart(2, "0")}>`
        out.push(v.ids.get(hex) ?? v.ids.get(t[j] as string) ?? 0)
      }
      return
    }
    resegment(symbols[p[0]] as Symbol)
    resegment(symbols[p[1]] as Symbol)
  }
  for (let i = 0; symbols.length > 0 && i !== -1; i = (symbols[i] as Symbol).next) resegment(symbols[i] as Symbol)
}

/** A text or a special token's id, after tokenizer_st_partition. */
type Fragment = string | number

/**
 * tokenizer_st_partition: each special token, the longest first, split out of the raw texts; without parse_special
 * only the user-defined ones (control and unknown tokens are left in the text: src/llama-vocab.cpp).
 */
const partition = (v: SpmVocab, text: string, parseSpecial: boolean): Array<Fragment> => {
  let frags: Array<Fragment> = text === "" ? [] : [text]
  for (const [t, id] of v.special) {
    if (!parseSpecial && v.types[id] !== 4) continue
    frags = frags.flatMap((f) => {
      if (typeof f === "number" || !f.includes(t)) return [f]
      const parts = f.split(t)
      return parts.flatMap((p, i) => (i === 0 ? (p === "" ? [] : [p]) : p === "" ? [id] : [id, p]))
    })
  }
  return frags
}

const SPACE = bytes("\u2581")

/**
 * llama_vocab::tokenize of an SPM vocabulary: the ids. Special tokens are parsed as in llama-server's prompts unless
 * `parseSpecial` is false (/tokenize's parse_special).
 */
export const spmTokenize = (v: SpmVocab, text: string, addSpecial: boolean, parseSpecial = true): Array<number> => {
  const out: Array<number> = addSpecial && v.addBos ? [v.bos] : []
  let prevSpecial = true
  for (const f of partition(v, bytes(text), parseSpecial)) {
    if (typeof f === "number") {
      out.push(f)
      prevSpecial = true
      continue
    }
    const raw = v.addSpacePrefix && prevSpecial ? ` ${f}` : f
    session(v, raw.replaceAll(" ", SPACE), out)
    prevSpecial = false
  }
  return out
}

/** A text's tokens as the prompt's token strings: each token's text (the BOS is "<s>"). */
export const spmPieces = (v: SpmVocab, text: string, addSpecial: boolean): Array<string> =>
  spmTokenize(v, text, addSpecial).map((id) => v.pieces[id] ?? "")
