/**
 * The forms a secret takes when an engine prints it encoded (pure): the engine's output is scrubbed of each of them,
 * not only of the value as it is (services/engine/Secrets.ts, `lineRedactor`). Computed once per engine run, when its
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
 *   document that holds it), so for each of the three alignments the groups of 3 bytes that lie wholly in the value
 *   are taken, whose base64 appears as it is in any base64 of a text that contains the value at such an offset. A
 *   form that covers fewer than `minBytes` of the value is not taken: 4 base64 characters would blank text at random.
 *   The same for each escaped form that differs from the value (a JSON document holds `pa\"ss`, not `pa"ss`).
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

const base64Forms = (v: string, minBytes: number): ReadonlyArray<string> => {
  const bytes = Buffer.from(v, "utf8")
  const whole = bytes.toString("base64")
  const out = [whole, whole.replace(/=+$/, "")]
  for (let first = 0; first < 3; first++) {
    const groups = Math.floor((bytes.length - first) / 3)
    if (groups * 3 >= minBytes) out.push(bytes.subarray(first, first + groups * 3).toString("base64"))
  }
  return [...out, ...out.map(urlSafe)]
}

/**
 * The encoded forms of a secret value that differ from it, each once. `minBytes`: the fewest bytes of the value a
 * partial base64 form must cover.
 */
export const encodedForms = (value: string, minBytes: number): ReadonlyArray<string> => {
  const escaped = escapedForms(value)
  // The base64 of a JSON document (or a repr) that holds the value holds its escaped form, where that differs.
  const encodedEscapes = [...new Set(escaped)].filter((e) => e !== value).flatMap((e) => base64Forms(e, minBytes))
  const forms = new Set([...escaped, ...percentForms(value), ...base64Forms(value, minBytes), ...encodedEscapes])
  forms.delete(value)
  return [...forms]
}
