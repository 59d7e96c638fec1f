/**
 * What one line of the engine's output shows once scrubbed of the run's secrets: the text kept for /status, and the
 * log line's message and fields. Pure; the run's pumps (layers/engine/run.ts) log and keep what this gives.
 *
 * An engine that logs JSON objects (the simulator; vLLM with a JSON logging config) has its object's `msg` (else
 * `message`) logged as the message and its other keys as `engine_fields`, nested JSON, not a string escaped inside a
 * string. Those are decoded, so they are scrubbed decoded: scrubbed only as it came, a secret the engine wrote with
 * escapes of its own (`\u0041`, Go's `\u0026`, upper-case hex) came out in plain text, and one inside a JSON document
 * or a repr held in a string in its escaped form (security re-checks). The fields are the scrubbed object itself, never
 * the line decoded again (a review found a deep line's fields logged unscrubbed); a line whose strings cannot all be
 * scrubbed (nested deeper than the scrub's stack) is not shown.
 */
import { isJsonObject } from "./EngineClient.ts"
import type { Redactor } from "./LineRedactor.ts"
import { MAX_LINE_CHARS, type OutputLine } from "./OutputLines.ts"
import { REDACTED } from "./Secrets.ts"

export interface ShownLine {
  /** The line as /status keeps it: scrubbed; a JSON object line as JSON.stringify writes it again. */
  readonly text: string
  /** The log line's message. */
  readonly message: string
  /** A JSON object line's keys but its message, every string in them (keys too) scrubbed decoded. */
  readonly fields?: Readonly<Record<string, unknown>>
}

/**
 * `u` with every string in it (keys too) passed through `scrub`; deep input throws RangeError (the caller's catch).
 * Objects are built from entries (a `__proto__` key stays a key, as JSON.parse made it, not the prototype's setter).
 */
const scrubStrings = (u: unknown, scrub: (s: string) => string): unknown => {
  if (typeof u === "string") return scrub(u)
  if (Array.isArray(u)) return u.map((v) => scrubStrings(v, scrub))
  if (typeof u !== "object" || u === null) return u
  return Object.fromEntries(Object.entries(u).map(([k, v]) => [scrub(k), scrubStrings(v, scrub)]))
}

/**
 * A JSON object line (as printed) parsed, every number whose printed digits hold a secret taken as REDACTED (the
 * reviver sees each number's source text), then every string (keys too) scrubbed by `scrub`, and that object as
 * JSON.stringify writes it; undefined for any other line; "too deep" for one nested deeper than the parse with a
 * reviver, the scrub or JSON.stringify can go. Parsing the line as printed, not scrubbed first: a secret replaced in a
 * number made the line no JSON, and another secret in its strings, escaped, was then never scrubbed decoded (review).
 */
const scrubbedObject = (
  line: string,
  scrub: (s: string) => string
): { readonly object: Record<string, unknown>; readonly json: string } | "too deep" | undefined => {
  if (!line.startsWith("{")) return undefined
  let parsed: unknown
  try {
    parsed = JSON.parse(line, (_key, value: unknown, context?: { readonly source?: string }) =>
      typeof value === "number" && context?.source !== undefined && scrub(context.source) !== context.source
        ? REDACTED
        : value
    )
  } catch (e) {
    return e instanceof SyntaxError ? undefined : "too deep"
  }
  if (!isJsonObject(parsed)) return undefined
  try {
    const object = scrubStrings(parsed, scrub) as Record<string, unknown>
    return { object, json: JSON.stringify(object) }
  } catch {
    return "too deep"
  }
}

/**
 * What `line` shows: a cut one (which the splitter gave the longest secret form's length past MAX_LINE_CHARS, so that
 * a secret that starts before the cut is whole) up to its MAX_LINE_CHARS-th character as it came, a secret across the
 * cut replaced whole, and marked; a JSON object line with each number (by its printed digits: written again, one past
 * 2^53 would show most of them) and each string decoded scrubbed, then the whole written again scrubbed once more;
 * another scrubbed as it came.
 */
export const shownLine = (line: OutputLine, redact: Redactor): ShownLine => {
  // The splitter cuts past MAX_LINE_CHARS and the longest form: a line between the two is shown cut too.
  if (line.cut || line.text.length > MAX_LINE_CHARS) {
    const text = `${redact.head(line.text, MAX_LINE_CHARS)} … (line cut: only its first ${MAX_LINE_CHARS} characters are logged)`
    return { text, message: text }
  }
  const scrubbed = scrubbedObject(line.text, redact)
  if (scrubbed === undefined) {
    const text = redact(line.text)
    return { text, message: text }
  }
  if (scrubbed === "too deep") {
    // Its strings hold escapes within escapes no scrub has read: not shown (no engine writes such lines).
    const text = `(a JSON line of ${line.text.length} characters nested too deeply to scrub of secrets: not shown)`
    return { text, message: text }
  }
  const { object, json } = scrubbed
  const text = redact(json)
  // A secret only the whole line shows (across two strings, with JSON's punctuation): the line as text, no fields.
  if (text !== json) return { text, message: text }
  const key = typeof object.msg === "string" ? "msg" : typeof object.message === "string" ? "message" : undefined
  if (key === undefined) return { text, message: text }
  const { [key]: message, ...fields } = object
  return Object.keys(fields).length === 0
    ? { text, message: String(message) }
    : { text, message: String(message), fields }
}
