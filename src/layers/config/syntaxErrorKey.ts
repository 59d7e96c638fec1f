/**
 * Which key a TOML syntax error is in. smol-toml's TomlError gives a line and a column but no key; an operator
 * reading `line 41, column 9: invalid value` in a pod's log cannot see the file, so the error names the key path
 * too (`engine.url`, `models."m".tp`), formatted as every other config problem's key (schemaProblems.ts).
 * Pure and approximate on purpose: it reads the text around the error, not a parse tree (there is none: the parse
 * failed). A line the rules below do not recognize names no key, never a wrong one.
 */
import { formatPath } from "./schemaProblems.ts"

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

/** How many brackets and braces a value's text leaves open (characters inside strings not counted). */
const openBrackets = (text: string): number => {
  let depth = 0
  for (const m of text.matchAll(/"(?:[^"\\]|\\.)*"|'[^']*'|#.*$|[[\]{}]/gm)) {
    const c = m[0]
    if (c === "[" || c === "{") depth++
    else if (c === "]" || c === "}") depth--
  }
  return depth
}

/**
 * The key path of the value a syntax error at `line` (1-based) is in, or undefined. The key is the error line's
 * own `key =`, inside the values of the lines above whose multi-line array or inline table is still open at the
 * error; the table is the last `[header]` above. An error on a well-formed header is that table's (defined twice, or
 * over a key of that name): the header's path; one on a header that does not parse names no key.
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
  const keys: Array<ReadonlyArray<string>> = []
  let table: ReadonlyArray<string> = []
  for (let i = line - 1; i >= 0; i--) {
    const header = HEADER.exec(lines[i]!)
    if (header) {
      table = partsOf(header[1]!) ?? []
      break
    }
    const m = KEY_LINE.exec(lines[i]!)
    if (m === null) continue
    // a key line above the error holds it only while its value is still open on the lines down to the error
    const rest = [lines[i]!.slice(m[0].length), ...lines.slice(i + 1, line - 1)].join("\n")
    if (i < line - 1 && openBrackets(rest) <= 0) continue
    const parts = partsOf(m[1]!)
    if (parts === undefined) return undefined
    keys.unshift(parts)
  }
  return keys.length === 0 ? undefined : formatPath([...table, ...keys.flat()])
}
