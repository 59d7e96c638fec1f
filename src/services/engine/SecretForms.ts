/**
 * The forms a secret takes when an engine prints it encoded (pure): the engine's output is scrubbed of each of them,
 * not only of the value as it is (LineRedactor.ts, `lineRedactor`). Computed once per engine run, when its
 * secrets are known; never per line.
 *
 * - Escaped in a string literal: JSON (`"` and `\` escaped; `/` as `\/` too, as PHP and some Java encoders write it;
 *   non-ASCII as `\uXXXX`, Python's `json.dumps` default, `ensure_ascii=True`, in lower- or upper-case hex; `<>&`
 *   as Go's encoding/json escapes them) and Python's `repr` (vLLM logs its non-default args as a dict's repr: `\`
 *   and `'` escaped).
 * - Percent-encoded: JavaScript's `encodeURIComponent`, RFC 3986 strict (Python's `urllib.parse.quote(v, safe="")`,
 *   which also encodes `!'()*`), either with `/` left as it is (`quote`'s default `safe="/"`) and with a space as `+`
 *   (form encoding: `quote_plus`, Go's `url.QueryEscape`); also every byte encoded; the hex in upper and lower case.
 * - Base64 (standard and URL-safe, padded or not) of the value's UTF-8 bytes, alone, and inside a longer base64 text:
 *   the value may start at any byte of what was encoded (`Basic base64(user:password)`, whatever the user; a JSON
 *   document that holds it), so for each of the three alignments (`base64InText`) the characters of the groups of 3
 *   bytes that lie wholly in the value are found as they are, and the one to three at each end that carry its first
 *   and last bits (with a neighbour's, some) are checked beside them, so that no bit of it is left shown. The same for each escaped form that differs
 *   from the value (a JSON document holds `pa\"ss`, not `pa"ss`).
 */

const jsonEscaped = (v: string): string => JSON.stringify(v).slice(1, -1)

const hex4 = (c: string): string => c.charCodeAt(0).toString(16).padStart(4, "0")

/** As Python's `json.dumps` writes non-ASCII characters by default: `\u` and 4 lower-case hex digits per UTF-16 unit. */
const asciiJsonEscaped = (v: string): string => jsonEscaped(v).replace(/[^\x00-\x7f]/g, (c) => `\\u${hex4(c)}`)

/** As Go's encoding/json writes `<`, `>` and `&` by default (HTML-safe: `\u003c`, `\u003e`, `\u0026`). */
const htmlSafeJsonEscaped = (v: string): string => jsonEscaped(v).replace(/[<>&]/g, (c) => `\\u${hex4(c)}`)

/** `\uXXXX` escapes with upper-case hex, as Jackson (Java) writes them. */
const upperHex = (escaped: string): string =>
  escaped.replace(/\\u[0-9a-f]{4}/g, (e) => e.toUpperCase().replace("\\U", "\\u"))

const pythonReprEscaped = (v: string): string => v.replaceAll("\\", "\\\\").replaceAll("'", "\\'")

/** Every UTF-16 unit as `\uXXXX` (an encoder that escapes all, or a line written to hide a value). */
const allEscaped = (v: string): string =>
  Array.from({ length: v.length }, (_, i) => `\\u${v.charCodeAt(i).toString(16).padStart(4, "0")}`).join("")

const escapedForms = (v: string): ReadonlyArray<string> => {
  const json = jsonEscaped(v)
  const ascii = asciiJsonEscaped(v)
  const all = allEscaped(v)
  return [
    json,
    json.replaceAll("/", "\\/"),
    ascii,
    ascii.replaceAll("/", "\\/"),
    upperHex(ascii),
    htmlSafeJsonEscaped(v),
    all,
    upperHex(all),
    pythonReprEscaped(v)
  ]
}

const percentForms = (v: string): ReadonlyArray<string> => {
  let component: string
  try {
    component = encodeURIComponent(v)
  } catch {
    return [] // a lone surrogate: no encoder prints it either
  }
  const strict = component.replace(/[!'()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`)
  const out: Array<string> = []
  for (const e of [component, strict]) {
    for (const f of [e, e.replaceAll("%2F", "/")]) out.push(f, f.replaceAll("%20", "+"))
  }
  // Every byte encoded (some encoders do), and each form with lower-case hex (as others write it).
  const everyByte = [...Buffer.from(v, "utf8")].map((b) => `%${b.toString(16).toUpperCase().padStart(2, "0")}`).join("")
  out.push(everyByte)
  return [...out, ...out.map((f) => f.replace(/%[0-9A-F]{2}/g, (e) => e.toLowerCase()))]
}

const urlSafe = (b64: string): string => b64.replaceAll("+", "-").replaceAll("/", "_")

/** The value's base64 alone: standard and URL-safe, padded or not. */
const base64Forms = (v: string): ReadonlyArray<string> => {
  const whole = Buffer.from(v, "utf8").toString("base64")
  const out = [whole, whole.replace(/=+$/, "")]
  return [...out, ...out.map(urlSafe)]
}

const STANDARD_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
const ALPHABETS = [STANDARD_ALPHABET, urlSafe(STANDARD_ALPHABET)]

/** The characters of `alphabet` for the 6-bit values `fixed` with any `free` bits. */
const sextet = (alphabet: string, fixed: number, free: number): string => {
  let chars = ""
  for (let v = 0; v < 64; v++) if ((v & ~free) === fixed) chars += alphabet.charAt(v)
  return chars
}

/**
 * A value's bytes inside a longer base64 text, at one of the three places it may start at in a group of 3 bytes:
 * `core`, the characters of the groups of 3 bytes that lie wholly in it, as they are; `lead` and `trail`, the one to
 * three characters before and after the core that carry its first and last bits, each as the characters it may be
 * (one, or several where it carries a neighbour's bits too).
 */
export type Base64InText = {
  readonly core: string
  readonly lead: ReadonlyArray<string>
  readonly trail: ReadonlyArray<string>
}

/**
 * The value's forms inside a longer base64 text, standard and URL-safe. Only where its whole groups cover `minBytes`
 * of it: a core of fewer would blank text at random.
 */
const base64InTextForms = (v: string, minBytes: number): ReadonlyArray<Base64InText> => {
  const bytes = Buffer.from(v, "utf8")
  const bitOf = (i: number): number => ((bytes[i >> 3] ?? 0) >> (7 - (i & 7))) & 1
  const out: Array<Base64InText> = []
  for (let lead = 0; lead < 3; lead++) {
    const skipped = (3 - lead) % 3
    const wholeGroups = Math.floor((bytes.length - skipped) / 3)
    if (wholeGroups * 3 < minBytes) continue
    // In characters of the base64 text, from the start of the group the value starts in.
    const start = lead * 8
    const end = start + bytes.length * 8
    const coreFrom = ((lead + skipped) / 3) * 4
    const coreTo = coreFrom + wholeGroups * 4
    for (const alphabet of ALPHABETS) {
      const char = (c: number): string => {
        let fixed = 0
        let free = 0
        for (let b = 0; b < 6; b++) {
          const bit = c * 6 + b
          const mask = 1 << (5 - b)
          if (bit < start || bit >= end) free |= mask
          else if (bitOf(bit - start) === 1) fixed |= mask
        }
        return sextet(alphabet, fixed, free)
      }
      const range = (from: number, to: number) => Array.from({ length: to - from }, (_, k) => char(from + k))
      out.push({
        core: range(coreFrom, coreTo).join(""),
        lead: range(Math.floor(start / 6), coreFrom),
        trail: range(coreTo, Math.floor((end - 1) / 6) + 1)
      })
    }
  }
  return out
}

/** The encoded forms of a secret value that differ from it, each once. */
export const encodedForms = (value: string): ReadonlyArray<string> => {
  const escaped = escapedForms(value)
  // The base64 of a JSON document (or a repr) that holds the value holds its escaped form, where that differs.
  const encodedEscapes = [...new Set(escaped)].filter((e) => e !== value).flatMap(base64Forms)
  const forms = new Set([...escaped, ...percentForms(value), ...base64Forms(value), ...encodedEscapes])
  forms.delete(value)
  return [...forms]
}

/**
 * The value, and each escaped form of it, inside a longer base64 text. `minBytes`: the fewest bytes of it the whole
 * groups of 3 of a form must cover.
 */
export const base64InText = (value: string, minBytes: number): ReadonlyArray<Base64InText> => {
  const texts = new Set([value, ...escapedForms(value)])
  return [...texts].flatMap((t) => base64InTextForms(t, minBytes))
}
