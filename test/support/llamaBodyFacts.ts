// What the real llama-server (scripts/real-engine-build.mjs's build) was measured to answer to a POST body it cannot
// read as JSON: cpp-httplib's bare 400 for a multipart/form-data content type without a usable boundary, and
// nlohmann's 500 for a lone UTF-16 surrogate escape. test/real/sim-differential-7.test.ts sends these to both it and
// the simulator; test/sim/llama-json-body.test.ts holds the simulator alone to them.

/** The body sent with each content type: a completion's, as JSON. */
export const COMPLETION_BODY = JSON.stringify({ prompt: "a b", max_tokens: 2 })

/**
 * Content types answered cpp-httplib's bare 400 (no body, no content type, the connection closed) on every POST
 * route, before the route reads the body: the boundary over 70 characters (quotes dropped before it is measured), the
 * media type read up to the `;` and trimmed.
 */
export const BARE_400_TYPES: ReadonlyArray<string> = [
  `multipart/form-data; boundary=${"b".repeat(71)}`,
  `multipart/form-data; boundary="${"b".repeat(71)}"`,
  "multipart/form-data ;charset=x",
  "multipart/form-data ; boundary="
]

/** Content types whose body is read as JSON: the media type is matched case-sensitively. */
export const JSON_READ_TYPES: ReadonlyArray<string> = ["Multipart/Form-Data", "Multipart/Form-Data; boundary="]

/** A JSON body with a lone surrogate escape, and nlohmann's parse error for it (a 500 on /v1/completions and /tokenize). */
export interface SurrogateFact {
  readonly body: string
  readonly message: string
}

const parseError = (column: number, read: string) =>
  `[json.exception.parse_error.101] parse error at line 1, column ${column}: syntax error while parsing value - invalid string: surrogate U+DC00..U+DFFF must follow U+D800..U+DBFF; last read: '"${read}'`

export const LONE_LOW_SURROGATES: ReadonlyArray<SurrogateFact> = [
  { body: '{"prompt":"\\udc00","max_tokens":2}', message: parseError(17, "\\udc00") },
  { body: '{"content":"\\udfff"}', message: parseError(18, "\\udfff") },
  // a pair, then a low one alone: the error at the second
  { body: '{"content":"\\udbff\\udc00 \\udc00"}', message: parseError(31, "\\udbff\\udc00 \\udc00") }
]
