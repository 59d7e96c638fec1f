/**
 * The scrubbing of an engine run's secrets from every line the engine prints (pure), before the agent logs it or keeps
 * it for /status: the values Secrets.ts finds (`secretValues`), as they are and in the forms an engine prints them
 * encoded (SecretForms.ts).
 */
import { type Base64InText, base64InText, encodedForms } from "./SecretForms.ts"
import { REDACTED, type Span } from "./Secrets.ts"

/**
 * Values shorter than this are not scrubbed from engine output: a secret that short is no secret, and blanking
 * it would blank common words and numbers (`true`, `8000`) wherever the engine prints them.
 */
export const MIN_SCRUBBED_LENGTH = 6

const escapeRegExp = (s: string): string => s.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&")

/** Whether `text` has the characters `chars` (each a set of the characters it may be) at `at`. */
const hasAt = (text: string, at: number, chars: ReadonlyArray<string>): boolean =>
  at >= 0 && at + chars.length <= text.length && chars.every((set, k) => set.includes(text.charAt(at + k)))

/**
 * The places of the secrets in `text`, in order, apart: each match of `any`, and for a base64 core (SecretForms.ts,
 * `base64InText`) the characters beside it that carry the value's first and last bits, where they are there.
 */
const secretSpans = function* (
  text: string,
  any: RegExp,
  cores: ReadonlyMap<string, ReadonlyArray<Base64InText>>
): Generator<Span> {
  let open: [number, number] | undefined
  // exec on the one RegExp, not matchAll: matchAll copies it per call, which made a line's scan 60 times slower
  any.lastIndex = 0
  for (let m = any.exec(text); m !== null; m = any.exec(text)) {
    const matchEnd = m.index + m[0].length
    let start = m.index
    let end = matchEnd
    // a core may be several secrets' (two that begin alike): each one's edges are checked beside the core itself
    for (const f of cores.get(m[0]) ?? []) {
      if (hasAt(text, m.index - f.lead.length, f.lead)) start = Math.min(start, m.index - f.lead.length)
      if (hasAt(text, matchEnd, f.trail)) end = Math.max(end, matchEnd + f.trail.length)
    }
    if (open !== undefined && start <= open[1]) open[1] = Math.max(open[1], end)
    else {
      if (open !== undefined) yield open
      open = [start, end]
    }
  }
  if (open !== undefined) yield open
}

/**
 * A function that replaces every occurrence of the given secrets in a line with REDACTED, as they are and in the
 * forms an engine prints them encoded (SecretForms.ts: JSON- or repr-escaped, percent-encoded, base64). Built once per
 * run: the forms are computed here, and one RegExp alternates them all, longest first, so a value that contains
 * another is replaced whole; per line it is one left-to-right scan, and a line with none comes back as it is. One
 * RegExp rather than an `includes` per form: with 10 secrets (70 forms), 1k log lines of 250 characters took 0.9-1.2
 * ms against 1.1-1.6 ms, and 1.3-1.6 ms against 2.7-4.7 ms with 20 (Node 24; with the base64 edges checked at a
 * match, 0.5 ms without a secret in the line and about 0.85 with one, 10 secrets). A value of several lines (a PEM key)
 * is scrubbed line by line, since output comes in lines.
 */
export const lineRedactor = (secrets: Iterable<string>): Redactor => {
  const values = new Set<string>()
  const cores = new Map<string, Array<Base64InText>>()
  for (const s of secrets) {
    for (const part of s.split("\n")) {
      const v = part.endsWith("\r") ? part.slice(0, -1) : part
      if (v.length < MIN_SCRUBBED_LENGTH) continue
      values.add(v)
      for (const f of encodedForms(v)) values.add(f)
      for (const f of base64InText(v, MIN_SCRUBBED_LENGTH)) {
        values.add(f.core)
        cores.set(f.core, [...(cores.get(f.core) ?? []), f])
      }
    }
  }
  if (values.size === 0) return Object.assign((line: string) => line, { longest: 0, head: headOf(undefined, cores) })
  const sorted = [...values].sort((a, b) => b.length - a.length)
  const any = new RegExp(sorted.map(escapeRegExp).join("|"), "g")
  const redact = (line: string): string => {
    let out = ""
    let at = 0
    for (const [start, end] of secretSpans(line, any, cores)) {
      out += line.slice(at, start) + REDACTED
      at = end
    }
    return at === 0 ? line : out + line.slice(at)
  }
  // A core's trail adds up to 3 characters past the longest form.
  return Object.assign(redact, { longest: (sorted[0]?.length ?? 0) + 3, head: headOf(any, cores) })
}

/**
 * Scrubs a line of the run's secrets. `longest`: the longest form it replaces. `head(text, limit)`: the line shown
 * up to the character `limit` of `text` as it came, every secret that starts before it replaced whole (so `text`
 * must hold `longest` characters past `limit`, where it is longer). What is shown is decided by positions in `text`:
 * a slice of the scrubbed text would move the rest left by each replacement shorter than its secret, and a secret cut
 * short at the text's end (not scrubbed) into view.
 */
export type Redactor = ((line: string) => string) & {
  readonly longest: number
  readonly head: (text: string, limit: number) => string
}

const headOf =
  (any: RegExp | undefined, cores: ReadonlyMap<string, ReadonlyArray<Base64InText>>) =>
  (text: string, limit: number): string => {
    if (any === undefined) return text.slice(0, limit)
    let out = ""
    let at = 0
    for (const [start, end] of secretSpans(text, any, cores)) {
      if (start >= limit) break
      out += text.slice(at, start) + REDACTED
      at = end
    }
    return out + text.slice(at, Math.max(at, limit))
  }
