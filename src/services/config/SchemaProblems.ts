/**
 * What is wrong with a config that ConfigSchema refuses, one line per problem, each naming the key as
 * the TOML file writes it: unknown keys (with the nearest valid key), and every field that fails to
 * decode (each checked on its own, so one bad field does not hide the next). Pure; no I/O.
 */
import { Schema, SchemaIssue } from "effect"
import { isSecretName } from "../engine/Secrets.ts"
import {
  AgentSection,
  ClusterSection,
  ConfigFile,
  EngineSection,
  KvSection,
  knownKeys,
  ModelSection,
  SecuritySection
} from "./ConfigSchema.ts"
import { DURATION_EXPECTED } from "./ConfigValues.ts"

const sectionSchemas = {
  cluster: ClusterSection,
  security: SecuritySection,
  agent: AgentSection,
  engine: EngineSection,
  kv: KvSection
} as const satisfies Record<string, Schema.Struct<Schema.Struct.Fields>>
const SECTIONS = Object.keys(sectionSchemas) as ReadonlyArray<keyof typeof sectionSchemas>

const isTable = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v)

const quoteKey = (k: string) => (/^[A-Za-z0-9_-]+$/.test(k) ? k : JSON.stringify(k))

/** Formats a schema path the way TOML writes it: `agent.heartbeat`, `models."llama-3".tp`. */
export const formatPath = (path: ReadonlyArray<PropertyKey>): string => {
  if (path.length === 0) return "<root>"
  return path
    .map((p, i) => {
      if (typeof p === "number") return `[${p}]`
      const s = String(p)
      if (i === 1 && path[0] === "models") return JSON.stringify(s)
      return quoteKey(s)
    })
    .join(".")
    .replace(/\.\[/g, "[")
}

const levenshtein = (a: string, b: string): number => {
  const row = Array.from({ length: b.length + 1 }, (_, i) => i)
  for (let i = 1; i <= a.length; i++) {
    let prev = row[0]!
    row[0] = i
    for (let j = 1; j <= b.length; j++) {
      const cur = row[j]!
      row[j] = Math.min(row[j]! + 1, row[j - 1]! + 1, prev + (a[i - 1] === b[j - 1] ? 0 : 1))
      prev = cur
    }
  }
  return row[b.length]!
}

const suggestion = (key: string, valid: ReadonlyArray<string>): string => {
  let best: string | undefined
  let bestDistance = Number.POSITIVE_INFINITY
  for (const v of valid) {
    const d = levenshtein(key, v)
    if (d < bestDistance) {
      best = v
      bestDistance = d
    }
  }
  if (best !== undefined && bestDistance <= Math.max(2, Math.floor(key.length / 3))) return `; did you mean "${best}"?`
  return `; valid keys: ${valid.join(", ")}`
}

const unknownIn = (table: Record<string, unknown>, prefix: ReadonlyArray<string>, valid: ReadonlyArray<string>) =>
  Object.keys(table)
    .filter((k) => !valid.includes(k))
    .map((k) => `${formatPath([...prefix, k])}: unknown key${suggestion(k, valid)}`)

/**
 * The name `[models.qwen2.5-0.5b]` meant: TOML splits a bare key at its dots (models → qwen2 → 5-0 → 5b), so the
 * model's keys sit tables below a model "qwen2" whose key "5-0" is unknown. No model key holds a table, so an unknown
 * key holding one is such a split: its name is the parts down to the table that holds the model's keys.
 */
const splitModelName = (model: string, key: string, value: unknown): string | undefined => {
  if (!isTable(value)) return undefined
  const parts = [model, key]
  let table = value
  for (;;) {
    const keys = Object.keys(table)
    const only = keys.length === 1 ? table[keys[0]!] : undefined
    if (!isTable(only) || knownKeys.model!.includes(keys[0]!)) break
    parts.push(keys[0]!)
    table = only
  }
  return parts.join(".")
}

/** Unknown keys of a models entry, with the quoting hint where a dotted name was split. */
const unknownInModel = (table: Record<string, unknown>, model: string) => {
  const valid = knownKeys.model!
  return Object.keys(table)
    .filter((k) => !valid.includes(k))
    .map((k) => {
      const name = splitModelName(model, k, table[k])
      const why =
        name === undefined
          ? suggestion(k, valid)
          : `; a model name with dots must be quoted: [models.${JSON.stringify(name)}]`
      return `${formatPath(["models", model, k])}: unknown key${why}`
    })
}

/** `key: unknown key` for every key no schema names, with the nearest valid key when one is close. */
export const unknownKeyProblems = (raw: unknown): Array<string> => {
  if (!isTable(raw)) return []
  const problems = unknownIn(raw, [], knownKeys[""]!)
  for (const s of SECTIONS) {
    const t = raw[s]
    if (isTable(t)) problems.push(...unknownIn(t, [s], knownKeys[s]!))
  }
  const models = raw.models
  if (isTable(models)) {
    for (const [m, t] of Object.entries(models)) {
      if (isTable(t)) problems.push(...unknownInModel(t, m))
    }
  }
  return problems
}

const valueAt = (raw: unknown, path: ReadonlyArray<PropertyKey>): unknown =>
  path.reduce<unknown>(
    (v, k) => (isTable(v) || Array.isArray(v) ? (v as Record<PropertyKey, unknown>)[k] : undefined),
    raw
  )

/**
 * Names a TOML value in an error. Never String() an object: smol-toml's tables have a null prototype,
 * so String() throws on a table and on any array holding one (`[[agent]]`, `A = [{ b = 1 }]`).
 */
const describe = (v: unknown): string => {
  if (typeof v === "string") return JSON.stringify(v)
  if (v instanceof Date) return "a date-time"
  if (Array.isArray(v)) return v.length > 0 && v.every(isTable) ? "an array of tables" : "an array"
  if (isTable(v)) return "a table"
  if (typeof v === "number" || typeof v === "boolean" || typeof v === "bigint") return String(v)
  return typeof v
}

/**
 * Effect Schema's own words for a refused value (`Expected a value greater than or equal to 1`, `Expected "a" | "b"`),
 * said as this file's other problems are (`expected at least 1`, `expected one of "a", "b"`): one voice in one list
 * of problems. Other messages (a check's own words) are kept as they are but a leading `Expected`, lowered.
 */
const plainWords = (message: string): string => {
  const bound = /^Expected a value (greater|less) than (or equal to )?(.+)$/.exec(message)
  if (bound !== null) {
    const [, side, orEqual, n] = bound
    return `expected ${side === "greater" ? (orEqual ? "at least" : "more than") : orEqual ? "at most" : "less than"} ${n}`
  }
  if (/^Expected "[^"]*"( \| "[^"]*")+$/.test(message))
    return `expected one of ${message.slice("Expected ".length).split(" | ").join(", ")}`
  const types =
    /^Expected ((?:string|array|object|number|boolean)(?: \| (?:string|array|object|number|boolean))*)$/.exec(
      message
    )?.[1]
  if (types !== undefined) return `expected ${types.split(" | ").map(typeWords).join(" or ")}`
  if (message === "Expected a value with a length of at least 1") return "expected a non-empty value"
  return message.replace(/^Expected\b/, "expected")
}

/** A schema type's name as a TOML file's reader says it. */
const typeWords = (type: string): string =>
  type === "array" ? "an array" : type === "object" ? "a table" : `a ${type}`

/** `raw` with the value at `path` replaced by `x` (copies along the path; `raw` is not changed). */
const setAt = (raw: unknown, path: ReadonlyArray<PropertyKey>, x: unknown): unknown => {
  const [k, ...rest] = path
  if (k === undefined) return x
  if (Array.isArray(raw)) return raw.map((v, i) => (i === k ? setAt(v, rest, x) : v))
  return isTable(raw) ? { ...raw, [k]: setAt((raw as Record<PropertyKey, unknown>)[k], rest, x) } : raw
}

/**
 * A number or boolean written as a string (`max_inflight = "256"`), which the schema words `Expected number, got
 * "256"` (capitalised, "number" for an integer, no example): said as the duration message says it (ConfigValues.ts,
 * "expected a duration such as ..."), the quotes named as the fault when the string holds the value. `retry`: this
 * key's problems with another value in its place, to tell an integer field (0.5 refused as not an integer) and to
 * take the string's own number as the example when the field takes it. Undefined for any other message.
 */
const quotedValueWords = (
  message: string,
  got: string,
  retry: (x: unknown) => ReadonlyArray<string>
): string | undefined => {
  const shown = JSON.stringify(got)
  if (message === "Expected boolean")
    return `expected true or false${/^(true|false)$/i.test(got.trim()) ? " (a TOML boolean, without quotes)" : ""}, got ${shown}`
  if (message !== "Expected number") return undefined
  const integer = retry(0.5).some((p) => p.endsWith(": expected an integer, got 0.5"))
  const n = got.trim() === "" ? Number.NaN : Number(got)
  const unquoted = Number.isFinite(n) ? " (a TOML number, without quotes)" : ""
  const example = Number.isFinite(n) && retry(n).length === 0 ? ` such as ${n}` : ""
  return `expected ${integer ? "an integer" : "a number"}${example}${unquoted}, got ${shown}`
}

/**
 * A duration written as a TOML number (`heartbeat = 5`), boolean, array or table, which the schema words `Expected
 * string, got 5` (the duration's own words, and its unit, went unsaid): said as a duration written as a bad string is
 * (ConfigValues.ts), the quoted form with a unit named, and for a number the string to write when the key takes it
 * (`"5s"`). `retry` as for quotedValueWords: a key refusing a string that is no duration with the duration's message
 * is a duration key. Undefined for any other key (plainWords's `expected a string`).
 */
const unquotedDurationWords = (held: unknown, retry: (x: unknown) => ReadonlyArray<string>): string | undefined => {
  if (!retry("?").some((p) => p.includes(`: ${DURATION_EXPECTED}, got "?"`))) return undefined
  // Seconds only for a small positive number: 0 and below meet the keys' other bounds (a heartbeat of "0s" is refused
  // by its floor), and 1000 or more was most likely meant in milliseconds (drain_timeout = 30000 is not "30000s").
  const written = typeof held === "number" && held > 0 && held < 1000 ? `${held}s` : undefined
  const fix = written !== undefined && retry(written).length === 0 ? `: write "${written}"` : ""
  return `${DURATION_EXPECTED} (a quoted string with a unit), got ${describe(held)}${fix}`
}

/** Problems of one schema against one value, each prefixed with where the value sits in the file. */
const schemaProblems = (
  schema: Schema.Top,
  value: unknown,
  at: ReadonlyArray<PropertyKey>,
  key: ReadonlyArray<PropertyKey> = at
): Array<string> => {
  const exit = Schema.decodeUnknownExit(schema as Schema.Codec<unknown, unknown>)(value, { errors: "all" })
  if (exit._tag === "Success") return []
  const reason = exit.cause.reasons.find((r) => r._tag === "Fail")
  // A defect in a transformation has no issue path: name the key being checked and what it held.
  if (reason === undefined)
    return [`${formatPath(key)}: cannot decode ${describe(valueAt(value, key.slice(at.length)))}`]
  const std = SchemaIssue.makeFormatterStandardSchemaV1()((reason.error as Schema.SchemaError).issue)
  return std.issues.map((i) => {
    const path = [...at, ...(i.path ?? []).map((p) => (typeof p === "object" && p !== null ? p.key : p))]
    // A non-empty array reports its empty form as a missing element 0.
    if (i.message === "Missing key" && path.at(-1) === 0)
      return `${formatPath(path.slice(0, -1))}: expected a non-empty list`
    const held = valueAt(value, path.slice(at.length))
    // this key's problems with `x` in its place only: its neighbours (other elements of a list) may have their own
    const retry = (x: unknown) =>
      schemaProblems(schema, setAt(value, path.slice(at.length), x), at, key).filter((p) =>
        p.startsWith(`${formatPath(path)}: `)
      )
    const words =
      typeof held === "string"
        ? quotedValueWords(i.message, held, retry)
        : i.message === "Expected string"
          ? unquotedDurationWords(held, retry)
          : undefined
    if (words !== undefined) return `${formatPath(path)}: ${words}`
    // a secret's key (etcd_password, admin_token, an engine.env token: README "Secrets") never shows its value,
    // whatever its type: a token written without quotes is a number
    const gotValue = valueAt(value, path.slice(at.length))
    const secret = isSecretName(String(path.at(-1) ?? ""))
    const got = i.message.startsWith("Expected")
      ? `, got ${secret && typeof gotValue !== "object" ? `a ${typeof gotValue} (not shown: a secret's key)` : describe(gotValue)}`
      : ""
    return `${formatPath(path)}: ${plainWords(i.message)}${got}`
  })
}

/**
 * Decodes key by key: a struct stops at its first failing transformation (a bad duration hides a bad
 * enum next to it), so each key is checked on its own to report every problem of the file at once.
 */
export const fieldProblems = (raw: unknown): Array<string> => {
  if (!isTable(raw)) return ["<root>: expected a TOML document"]
  const problems: Array<string> = []
  const byField = (struct: Schema.Struct<Schema.Struct.Fields>, table: unknown, at: ReadonlyArray<string>) => {
    if (table === undefined) return
    if (!isTable(table)) {
      const hint = Array.isArray(table) ? ` (write [${formatPath(at)}], not [[${formatPath(at)}]])` : ""
      problems.push(`${formatPath(at)}: expected a table, got ${describe(table)}${hint}`)
      return
    }
    for (const [k, field] of Object.entries(struct.fields)) {
      if (!(k in table)) continue
      problems.push(...schemaProblems(Schema.Struct({ [k]: field }), { [k]: table[k] }, at, [...at, k]))
    }
  }
  for (const s of SECTIONS) byField(sectionSchemas[s], raw[s], [s])
  const models = raw.models
  if (models !== undefined && !isTable(models)) problems.push(`models: expected tables such as [models."name"]`)
  if (isTable(models)) for (const [m, t] of Object.entries(models)) byField(ModelSection, t, ["models", m])
  return problems.length > 0 ? problems : schemaProblems(ConfigFile, raw, [])
}
