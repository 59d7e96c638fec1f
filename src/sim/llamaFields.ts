// The request fields llama-server reads with handlers of their own (pure), so the llama_cpp flavor refuses what the
// real server refuses, in its words: nlohmann::json's exception texts for a wrong type, the handlers' own errors.
// Source, ggml-org/llama.cpp tools/server/server-schema.cpp make_llama_cmpl_schema (each field's handler),
// tools/server/server-common.h server_grammar_trigger, common/peg-parser.cpp common_peg_arena::from_json; measured
// against the real binary by test/real/sim-differential-8.test.ts.
import { invalidJson } from "./errors.ts"
import { jsonSchemaError } from "./llamaJsonSchema.ts"
import { cppValue } from "./llamaNumbers.ts"

/** nlohmann::json's type_name(). */
export const typeName = (v: unknown): string => {
  if (v === null) return "null"
  if (Array.isArray(v)) return "array"
  if (typeof v === "object") return "object"
  return typeof v === "string" ? "string" : typeof v === "boolean" ? "boolean" : "number"
}

export const typeError = (want: string, v: unknown): string =>
  `[json.exception.type_error.302] type must be ${want}, but is ${typeName(v)}`

/** What the handlers read so far (the schema's earlier fields), and what they leave for later ones. */
export type Values = Map<string, unknown>

/** A handler: the error text (`Field '<name>': ` goes before it) or undefined where the field is taken. */
export type Handler = (b: Record<string, unknown>, name: string, values: Values) => string | undefined

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v)

/** nlohmann's range-for: an array's elements, an object's values, a plain value once, null none. */
const items = (v: unknown): Array<unknown> =>
  Array.isArray(v) ? v : isObject(v) ? Object.values(v) : v === null ? [] : [v]

/** get<std::string>() and get<int>(): the type error, or undefined where the value converts. */
const notString = (v: unknown) => (typeof v === "string" ? undefined : typeError("string", v))
const notNumber = (v: unknown) => (typeof v === "number" || typeof v === "boolean" ? undefined : typeError("number", v))

/** `at(key)`: on no object nlohmann refuses the call, on an object without the key it says so. */
const at = (o: unknown, key: string): { v: unknown } | string => {
  if (!isObject(o)) return `[json.exception.type_error.304] cannot use at() with ${typeName(o)}`
  return key in o ? { v: o[key] } : `[json.exception.out_of_range.403] key '${key}' not found`
}

/** A handler that only reads the field as a string (field_str: generation_prompt, the reasoning budget's tag). */
export const stringField: Handler = (b, name) => notString(b[name])

/** Elements each read with get<std::string>() (preserved_tokens, reasoning_budget_end_tags). */
const firstNotString = (v: unknown): string | undefined =>
  items(v)
    .map(notString)
    .find((e) => e !== undefined)

export const lora: Handler = (b) =>
  Array.isArray(b.lora) ? undefined : "Error: 'lora' must be an array of objects with 'id' and 'scale' fields"

/** json_value(..., vector<string>()): anything but an array of strings is the empty default, refused as such. */
export const drySequenceBreakers: Handler = (b) => {
  const v = b.dry_sequence_breakers
  const ok = Array.isArray(v) && v.length > 0 && v.every((s) => typeof s === "string")
  return ok ? undefined : "Error: dry_sequence_breakers must be a non-empty array of strings"
}

export const chatFormat: Handler = (b) => notNumber(b.chat_format)

const REASONING_FORMATS = ["none", "auto", "deepseek", "deepseek-legacy"]

/** common_reasoning_format_from_name (common/chat.cpp). */
export const reasoningFormat: Handler = (b) => {
  const v = b.reasoning_format
  return notString(v) ?? (REASONING_FORMATS.includes(v as string) ? undefined : `Unknown reasoning format: ${v}`)
}

/**
 * chat_parser: a PEG arena as JSON text (common_peg_arena::load). A syntax error keeps nlohmann's prefix and
 * JSON.parse's detail (as a body's does, errors.ts); of the parsers only the `type` each must have is checked.
 */
export const chatParser: Handler = (b) => {
  const text = b.chat_parser
  if (typeof text !== "string") return typeError("string", text)
  let j: unknown
  try {
    j = JSON.parse(text)
  } catch (err) {
    return invalidJson("llama_cpp", err instanceof Error ? err.message : String(err), text).message
  }
  const o = isObject(j) ? j : {}
  if (!Array.isArray(o.parsers)) return "JSON missing or invalid 'parsers' array"
  if (!isObject(o.rules)) return "JSON missing or invalid 'rules' object"
  if (!("root" in o)) return "JSON missing 'root' field"
  if (!o.parsers.every((p) => isObject(p) && typeof p.type === "string"))
    return "Parser variant JSON missing or invalid 'type' field"
  // ids are size_t: -1 is COMMON_PEG_INVALID_PARSER_ID, which a root may be
  const id = (v: unknown) => BigInt.asUintN(64, BigInt(Math.trunc(Number(v))))
  const n = BigInt(o.parsers.length)
  const rules = Object.entries(o.rules)
  const bad = rules.map(([, v]) => notNumber(v)).find((e) => e !== undefined)
  if (bad !== undefined) return bad
  for (const [name, v] of rules) if (id(v) >= n) return `Rule '${name}' references invalid parser ID: ${id(v)}`
  const root = notNumber(o.root)
  if (root !== undefined) return root
  const r = id(o.root)
  return r !== 2n ** 64n - 1n && r >= n ? `Root references invalid parser ID: ${r}` : undefined
}

/**
 * Whether a text is one token (common_tokenize's ids.size() == 1): the simulator has no vocabulary, so one word with
 * no whitespace around it ("the", "hello"; a rare word the real one splits is one here too).
 */
const oneToken = (s: string): boolean => /^\S+$/.test(s)

/** preserved_tokens: each a string; those that are one token make a WORD grammar trigger of that token valid. */
export const preservedTokens: Handler = (b, _, values) => {
  const v = b.preserved_tokens
  const bad = firstNotString(v)
  if (bad !== undefined) return bad
  values.set("preserved", new Set(items(v).filter((t) => oneToken(t as string))))
  return undefined
}

/**
 * grammar_triggers: each a server_grammar_trigger {type, value, token when type is TOKEN (0)}; a WORD (1) that is
 * one token must be a preserved one; a lazy grammar needs one. A type past PATTERN_FULL (3) makes the real server
 * abort later (common_sampler_init's GGML_ASSERT): the simulator takes it.
 */
export const grammarTriggers: Handler = (b, _, values) => {
  const preserved = (values.get("preserved") as Set<unknown> | undefined) ?? new Set()
  let n = 0
  for (const t of items(b.grammar_triggers)) {
    const type = at(t, "type")
    if (typeof type === "string") return type
    const value = at(t, "value")
    const bad = notNumber(type.v) ?? (typeof value === "string" ? value : notString(value.v))
    if (bad !== undefined) return bad
    const kind = cppValue(type.v as number, "int32")
    if (kind === 0) {
      const token = at(t, "token")
      if (typeof token === "string") return token
      if (notNumber(token.v) !== undefined) return notNumber(token.v)
    }
    const word = (value as { v: string }).v
    if (kind === 1 && oneToken(word) && !preserved.has(word))
      return `Grammar trigger word should be marked as preserved token: ${word}`
    n++
  }
  return values.get("grammar_lazy") === true && n === 0 ? "Error: no triggers set for lazy grammar!" : undefined
}

/** reasoning_budget_end_tags (each a string) or, where that key is absent (null counts as present), _end_tag. */
export const reasoningBudgetEndTags: Handler = (b) =>
  "reasoning_budget_end_tags" in b ? firstNotString(b.reasoning_budget_end_tags) : notString(b.reasoning_budget_end_tag)

/** samplers: an array is read as strings; a string is sampler chars; anything else is ignored. */
export const samplers: Handler = (b) => (Array.isArray(b.samplers) ? firstNotString(b.samplers) : undefined)

/**
 * `stop`: a string is one stop string, an array's strings each one (an element nlohmann calls empty, null or
 * [] or {}, is skipped; "" is not), anything else is ignored; an array element of another type is refused.
 */
export const stop: Handler = (b, _, values) => {
  const s = b.stop
  const out: Array<string> = typeof s === "string" ? [s] : []
  for (const w of Array.isArray(s) ? s : []) {
    if (typeof w === "string") out.push(w)
    else if (w === null || (typeof w === "object" && Object.keys(w).length === 0)) continue
    else return typeError("string", w)
  }
  values.set("stop", out)
  return undefined
}

/**
 * The json_schema field's handler (alias grammar): a `json_schema` with no `grammar` key (even a null one) is
 * converted to a grammar, its failure `"json_schema": <the converter's error>` (a non-empty array is no schema
 * visit() knows: "Unrecognized schema"; an empty one is taken as {}); else `grammar` when a non-empty string
 * (json_value: another type is ignored, with a warning in the log). A chat request's json_schema that is an object
 * is converted earlier, by its chat template's code, in words of its own (llamaChatChecks.ts); another is read here.
 */
export const grammarField =
  (chat: boolean): Handler =>
  (b, _, values) => {
    if ("json_schema" in b && !("grammar" in b)) {
      if (chat && isObject(b.json_schema)) return undefined
      const s = b.json_schema
      const error = Array.isArray(s)
        ? s.length === 0
          ? undefined
          : `JSON schema conversion failed:\nUnrecognized schema: ${JSON.stringify(s)}`
        : jsonSchemaError(s)
      return error === undefined ? undefined : `"json_schema": ${error}`
    }
    if (typeof b.grammar === "string" && b.grammar !== "") values.set("grammar", b.grammar)
    return undefined
  }
