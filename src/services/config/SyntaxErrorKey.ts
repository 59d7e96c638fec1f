/**
 * Which key a TOML syntax error is in. smol-toml's TomlError gives a line and a column but no key; an operator
 * reading `line 41, column 9: invalid value` in a pod's log cannot see the file, so the error names the key path
 * too (`engine.url`, `models."m".tp`), formatted as every other config problem's key (SchemaProblems.ts).
 * Pure and approximate on purpose: it reads the text around the error, not a parse tree (there is none: the parse
 * failed). A line the rules below do not recognize names no key, never a wrong one.
 */
import { formatPath } from "./SchemaProblems.ts"

/** One part of a dotted key: bare, "basic" (JSON escapes are TOML's) or 'literal'. */
const PART = String.raw`\s*(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*')\s*`
const DOTTED = `${PART}(?:\\.${PART})*`
const HEADER = new RegExp(String.raw`^\s*\[\[?(${DOTTED})\]\]?\s*(?:#.*)?$`)
const KEY_LINE = new RegExp(`^(${DOTTED})=`)

/** A dotted key's parts, unquoted; undefined when a quoted part does not unescape. */
const partsOf = (dotted: string): Array<string> | undefined => {
  const parts: Array<string> = []
  for (const m of dotted.matchAll(new RegExp(PART, "g"))) {
    const raw = m[0].trim()
    if (raw.startsWith("'")) parts.push(raw.slice(1, -1))
    else if (raw.startsWith('"')) {
      try {
        parts.push(JSON.parse(raw) as string)
      } catch {
        return undefined
      }
    } else parts.push(raw)
  }
  return parts
}

/** The brackets and braces a line opens and closes, in order (characters inside strings and comments not counted). */
const bracketsOf = (text: string): Array<string> =>
  [...text.matchAll(/"(?:[^"\\]|\\.)*"|'[^']*'|#.*$|[[\]{}]/gm)].map((m) => m[0]).filter((c) => "[]{}".includes(c))

/**
 * The key path of the value a syntax error at `line` (1-based) is in, or undefined. Read forward from the last
 * `[header]` above: a `key =` whose value leaves a bracket open holds what follows until it closes; the error's
 * place is the keys still open there, and the error line's own `key =` when it stands where a key can (not inside
 * an array, where such text is no key: a `]` forgotten above). An error on a well-formed header is that table's
 * (defined twice, or over a key of that name): the header's path; one on a header that does not parse names no key.
 */
export const syntaxErrorKey = (text: string, line: number): string | undefined => {
  const lines = text.split(/\r?\n/)
  if (line < 1 || line > lines.length) return undefined
  if (/^\s*\[/.test(lines[line - 1]!)) {
    const header = HEADER.exec(lines[line - 1]!)
    const parts = header === null ? undefined : partsOf(header[1]!)
    return parts === undefined ? undefined : formatPath(parts)
  }
  // Inside or after a multi-line string a line's text may be the string's, not a key or a header: no key, rather
  // than a wrong one (configs seldom have them).
  if (lines.slice(0, line).some((l) => l.includes('"""') || l.includes("'''"))) return undefined
  let from = line - 1
  while (from > 0 && !HEADER.test(lines[from - 1]!)) from--
  const header = from > 0 ? HEADER.exec(lines[from - 1]!) : null
  const table = header === null ? [] : (partsOf(header[1]!) ?? [])
  // open brackets, innermost last; each open key with the bracket depth its value began at
  const open: Array<string> = []
  const keys: Array<{ readonly parts: ReadonlyArray<string>; readonly depth: number }> = []
  const keyAt = (i: number): { parts: ReadonlyArray<string> | undefined; rest: string } | undefined => {
    // a key stands at the top of the table or inside an inline table, never inside an array
    if (open.length > 0 && open[open.length - 1] !== "{") return undefined
    const m = KEY_LINE.exec(lines[i]!)
    return m === null ? undefined : { parts: partsOf(m[1]!), rest: lines[i]!.slice(m[0].length) }
  }
  for (let i = from; i < line - 1; i++) {
    const key = keyAt(i)
    if (key !== undefined && key.parts === undefined) return undefined
    const depth = open.length
    for (const c of bracketsOf(key?.rest ?? lines[i]!)) {
      if (c === "[" || c === "{") open.push(c)
      else open.pop()
    }
    if (key?.parts !== undefined && open.length > depth) keys.push({ parts: key.parts, depth })
    while (keys.length > 0 && open.length <= keys[keys.length - 1]!.depth) keys.pop()
  }
  const own = keyAt(line - 1)
  if (own !== undefined && own.parts === undefined) return undefined
  const path = [...keys.flatMap((k) => k.parts), ...(own?.parts ?? [])]
  return path.length === 0 ? undefined : formatPath([...table, ...path])
}
