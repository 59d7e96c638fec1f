// Whether llama-server takes a request's `json_schema` (pure): its converter's error for the top level, so the
// llama_cpp flavor refuses what the real server refuses (test/real/sim-differential-3.test.ts and -6 hold it to it).
// Source, ggml-org/llama.cpp common/json-schema-to-grammar.cpp (common_schema_converter::visit).

/** json-schema-to-grammar.cpp PRIMITIVE_RULES: the `type`s a schema may name. */
const PRIMITIVES = new Set([
  "boolean",
  "decimal-part",
  "integral-part",
  "number",
  "integer",
  "value",
  "object",
  "array",
  "uuid",
  "char",
  "string",
  "null"
])

/**
 * Keys visit() acts on before a string `type` is looked at: `$ref` (its resolution's errors are not modelled),
 * oneOf/anyOf, const, enum. Every later branch asks for no type, or for "object", "array" or "string" (properties,
 * allOf, items, pattern, format, ...), so beside an unknown type they change nothing: measured against the real
 * llama-server (test/real/sim-differential-6.test.ts).
 */
const EARLIER = ["$ref", "oneOf", "anyOf", "const", "enum"]

/**
 * The converter's error for the top level of a `json_schema`, or undefined where the simulator takes it. Modelled:
 * visit()'s last branch, "Unrecognized schema: <dump>": a value that is no object and no array (a string, a
 * number, a boolean), or an object whose `type` is a string no primitive rule has and that has none of the keys
 * visit() acts on first. Not modelled (taken): errors inside nested schemas and `$ref`s. The dump is
 * JSON.stringify's: the real one (nlohmann's ordered_json) keeps the keys as sent, a JS object puts integer-like
 * keys first, and prints some numbers otherwise (5.0 is "5.0" to it; the simulator sees the parsed 5).
 */
export const jsonSchemaError = (schema: unknown): string | undefined => {
  const unrecognized = () => `JSON schema conversion failed:\nUnrecognized schema: ${JSON.stringify(schema)}`
  if (schema === null || Array.isArray(schema)) return undefined
  if (typeof schema !== "object") return unrecognized()
  const o = schema as Record<string, unknown>
  const type = o.type
  if (typeof type !== "string" || PRIMITIVES.has(type) || EARLIER.some((k) => k in o)) return undefined
  return unrecognized()
}
