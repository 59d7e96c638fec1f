/**
 * The file's values as written, checked before ConfigSchema decodes them (pure): what the schema cannot see once
 * they are JavaScript values. A NUL character in any key or string (no file path, argument or environment variable
 * can hold one: Node refuses it when the file is opened or the engine spawned, and the engine is restarted again
 * and again); a TOML date-time where a table goes (a Date is an object: a Struct or Record would take it for an
 * empty table, defaults and all); and, in a TOML file, a float where an integer goes (`tp = 1.0`, `max_inflight =
 * 1e3`: whole numbers in JavaScript, but TOML types them as floats, and the README types these keys as int). Where a
 * table or an integer goes is read from the schema itself (its AST), so no key is listed twice.
 */
import { SchemaAST } from "effect"
import { isSecretName } from "../engine/Secrets.ts"
import { ConfigFile } from "./ConfigSchema.ts"
import { formatPath } from "./SchemaProblems.ts"

type Path = ReadonlyArray<string | number>

/** A value with its problems; `value` is the file's, its TOML integers made numbers. */
export interface CheckedValues {
  readonly value: unknown
  readonly problems: ReadonlyArray<string>
  /** The keys `problems` name (formatPath), so that the schema's words on the same keys can be left out. */
  readonly keys: ReadonlySet<string>
}

const isTable = (v: unknown): v is Record<string, unknown> =>
  typeof v === "object" && v !== null && !Array.isArray(v) && !(v instanceof Date)

/** A union's members in its place (nested unions flattened). */
const members = (asts: ReadonlyArray<SchemaAST.AST>): Array<SchemaAST.AST> =>
  asts.flatMap((a) => (SchemaAST.isUnion(a) ? members(a.types) : [a]))

/** The schemas a value at `key` of one decoded with `asts` is decoded with: a Struct's field, a Record's value, an array's element. */
const childAsts = (asts: ReadonlyArray<SchemaAST.AST>, key: string | number): Array<SchemaAST.AST> =>
  members(asts).flatMap((ast) => {
    if (SchemaAST.isObjects(ast)) {
      const field = ast.propertySignatures.find((p) => p.name === key)
      return field !== undefined ? [field.type] : ast.indexSignatures.map((i) => i.type)
    }
    if (SchemaAST.isArrays(ast) && typeof key === "number") {
      const element = ast.elements[key] ?? ast.rest[0]
      return element === undefined ? [] : [element]
    }
    return []
  })

/** Schema.isInt()'s mark (effect Schema.ts isInt: representation id), on a check or inside a group of checks. */
const hasIntCheck = (checks: ReadonlyArray<SchemaAST.Check<unknown>> | undefined): boolean =>
  (checks ?? []).some((c) =>
    c._tag === "FilterGroup" ? hasIntCheck(c.checks) : c.annotations?.representation?.id === "effect/schema/isInt"
  )

/** Every number these schemas take is an integer (`gpus`: an NVML index or a UUID string, so an index is). */
const integersOnly = (asts: ReadonlyArray<SchemaAST.AST>): boolean => {
  const numbers = members(asts).filter(SchemaAST.isNumber)
  return numbers.length > 0 && numbers.every((n) => hasIntCheck(n.checks))
}

const tableGoes = (asts: ReadonlyArray<SchemaAST.AST>): boolean => members(asts).some(SchemaAST.isObjects)

/** Up to 60 characters of `s` around index `i`, JSON-quoted (so a NUL reads `\u0000`, never raw). */
const excerpt = (s: string, i: number): string => {
  const [from, to] = [Math.max(0, i - 30), Math.min(s.length, i + 30)]
  return `${from > 0 ? "..." : ""}${JSON.stringify(s.slice(from, to))}${to < s.length ? "..." : ""}`
}

const NUL_WHY =
  "no file path, argument, host name or environment variable can hold one (the system call given it fails); remove it"

/**
 * Checks every key and value of a parsed file. `toml`: the value is smol-toml's with `integersAsBigInt`, so a
 * bigint is a TOML integer (made a number here: past 2^53 it is refused, as it would not be exact) and a number
 * is a TOML float. Otherwise (an object built in code) numbers are numbers, an integral one an integer.
 */
export const checkValues = (raw: unknown, toml: boolean): CheckedValues => {
  const problems: Array<string> = []
  const keys = new Set<string>()
  const refuse = (path: Path, why: string) => {
    const key = formatPath(path)
    keys.add(key)
    problems.push(`${key}: ${why}`)
  }
  const walk = (v: unknown, path: Path, asts: ReadonlyArray<SchemaAST.AST>): unknown => {
    if (typeof v === "string") {
      const nul = v.indexOf("\0")
      if (nul >= 0) {
        // a secret's value is not shown (SchemaProblems.ts does the same for its type errors): only where the NUL is
        const where = isSecretName(String(path.at(-1) ?? ""))
          ? `the value (not shown: a secret's key) at character ${nul + 1}`
          : excerpt(v, nul)
        refuse(path, `a NUL character (\\u0000) in ${where}: ${NUL_WHY}`)
      }
      return v
    }
    if (typeof v === "bigint" && toml) {
      // the side it passed only: "from -(2^53-1)" read as the key's own range where the key takes only positives
      if (v > BigInt(Number.MAX_SAFE_INTEGER))
        refuse(
          path,
          `expected at most ${Number.MAX_SAFE_INTEGER} (the largest integer a JavaScript number holds exactly), got ${v}`
        )
      else if (v < BigInt(Number.MIN_SAFE_INTEGER))
        refuse(
          path,
          `expected at least ${Number.MIN_SAFE_INTEGER} (the least integer a JavaScript number holds exactly), got ${v}`
        )
      return Number(v)
    }
    if (typeof v === "number" && toml && Number.isInteger(v) && integersOnly(asts)) {
      refuse(
        path,
        `expected an integer, got the float ${v} (a decimal point or an exponent makes a TOML float); write ${v}`
      )
      return v
    }
    if (v instanceof Date) {
      if (tableGoes(asts)) refuse(path, "expected a table, got a date-time")
      return v
    }
    // No schema here: a key no schema names, or a list or table where the schema takes none. Refused as such
    // (unknown key, wrong type) whatever it holds, so not walked (a header 5000 tables deep would overflow the stack).
    if (asts.length === 0) return v
    if (Array.isArray(v)) {
      const items = v.map((x, i) => walk(x, [...path, i], childAsts(asts, i)))
      return toml ? items : v
    }
    if (isTable(v)) {
      // null prototype, as smol-toml's tables: a key such as "__proto__" stays a key
      const table: Record<string, unknown> = Object.create(null)
      for (const [k, x] of Object.entries(v)) {
        if (k.includes("\0")) refuse([...path, k], `a NUL character (\\u0000) in the key: ${NUL_WHY}`)
        table[k] = walk(x, [...path, k], childAsts(asts, k))
      }
      return toml ? table : v
    }
    return v
  }
  const value = walk(raw, [], [ConfigFile.ast])
  return { value, problems, keys }
}
