// How Python writes the values the engines' error messages quote (pure): a float's repr() (pydantic holds a JSON 3 in
// a `float` field as 3.0, and an f-string writes it "3.0"), any JSON value's repr() as a dict or list shows it, and
// where the stdlib's json.loads stops on a body that is not JSON (its message and character position), which
// FastAPI quotes in its json_invalid validation error; and a float as prometheus_client writes it in /metrics.

/** Python's repr() of a float: the shortest digits, ".0" on an integral value, an exponent below 1e-4 or from 1e16. */
export const pyFloat = (x: number): string => {
  if (Number.isNaN(x)) return "nan"
  if (!Number.isFinite(x)) return x > 0 ? "inf" : "-inf"
  if (x === 0) return Object.is(x, -0) ? "-0.0" : "0.0"
  const [mantissa = "", exp = "0"] = Math.abs(x).toExponential().split("e")
  const digits = mantissa.replace(".", "")
  const e = Number(exp)
  const sign = x < 0 ? "-" : ""
  if (e < -4 || e >= 16) {
    const m = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits
    return `${sign}${m}e${e < 0 ? "-" : "+"}${String(Math.abs(e)).padStart(2, "0")}`
  }
  if (e < 0) return `${sign}0.${"0".repeat(-e - 1)}${digits}`
  if (digits.length <= e + 1) return `${sign}${digits}${"0".repeat(e + 1 - digits.length)}.0`
  return `${sign}${digits.slice(0, e + 1)}.${digits.slice(e + 1)}`
}

/**
 * A sample value as prometheus_client writes it (prometheus/client_python prometheus_client/utils.py floatToGoString,
 * which generate_latest applies to every value and `le` bound): `+Inf`, `-Inf`, `NaN`, else the float's repr(), except
 * a positive one with more than six digits before its point, which gets Go's exponent: repr's digits, trailing `0`
 * and `.` stripped, then `e+0` and the exponent (1000000.0 is `1e+06`, 1234567.0 `1.234567e+06`, and 1e10
 * `1e+010`, the `0` written whatever the exponent's width).
 */
export const goFloat = (x: number): string => {
  if (x === Number.POSITIVE_INFINITY) return "+Inf"
  if (x === Number.NEGATIVE_INFINITY) return "-Inf"
  if (Number.isNaN(x)) return "NaN"
  const s = pyFloat(x)
  const dot = s.indexOf(".")
  if (x > 0 && dot > 6) {
    const mantissa = `${s[0]}.${s.slice(1, dot)}${s.slice(dot + 1)}`.replace(/[0.]+$/, "")
    return `${mantissa}e+0${dot - 1}`
  }
  return s
}

/** Python's repr() of a str: single quotes unless the text has one and no double quote. */
export const pyStr = (s: string): string => {
  const escaped = s.replaceAll("\\", "\\\\").replaceAll("\n", "\\n").replaceAll("\r", "\\r").replaceAll("\t", "\\t")
  if (s.includes("'") && !s.includes('"')) return `"${escaped}"`
  return `'${escaped.replaceAll("'", "\\'")}'`
}

/** Python's repr() of a parsed JSON value (an integral number as the int json.loads makes of it). */
export const pyRepr = (v: unknown): string => {
  if (v === null || v === undefined) return "None"
  if (v === true) return "True"
  if (v === false) return "False"
  if (typeof v === "string") return pyStr(v)
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : pyFloat(v)
  if (Array.isArray(v)) return `[${v.map(pyRepr).join(", ")}]`
  const entries = Object.entries(v as Record<string, unknown>)
  return `{${entries.map(([k, x]) => `${pyStr(k)}: ${pyRepr(x)}`).join(", ")}}`
}

const WS = new Set([" ", "\t", "\n", "\r"])
const NUMBER = /^-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?/
const ESCAPES = new Set(['"', "\\", "/", "b", "f", "n", "r", "t"])

class PyJsonError {
  readonly msg: string
  readonly pos: number
  constructor(msg: string, pos: number) {
    this.msg = msg
    this.pos = pos
  }
}

/**
 * Where CPython's json.loads (json/decoder.py and _json.c's scanner, strict mode) refuses `s`: its message and the
 * position it names, or undefined when it parses. The checks follow JSONObject, JSONArray and scanstring in their
 * order; a trailing comma is "Expecting property name enclosed in double quotes" / "Expecting value" as before
 * Python 3.13.
 */
export const pyJsonError = (s: string): { readonly msg: string; readonly pos: number } | undefined => {
  const ws = (i: number) => {
    while (i < s.length && WS.has(s[i] ?? "")) i++
    return i
  }
  const string = (begin: number): number => {
    let i = begin + 1
    for (;;) {
      if (i >= s.length) throw new PyJsonError("Unterminated string starting at", begin)
      const c = s[i] ?? ""
      if (c === '"') return i + 1
      if (c.charCodeAt(0) < 0x20) throw new PyJsonError("Invalid control character at", i)
      if (c !== "\\") {
        i++
        continue
      }
      const esc = s[i + 1]
      if (esc === undefined) throw new PyJsonError("Unterminated string starting at", begin)
      if (esc === "u") {
        if (!/^[0-9a-fA-F]{4}$/.test(s.slice(i + 2, i + 6))) throw new PyJsonError("Invalid \\uXXXX escape", i + 1)
        i += 6
      } else if (ESCAPES.has(esc)) i += 2
      else throw new PyJsonError("Invalid \\escape", i)
    }
  }
  const value = (i: number): number => {
    const c = s[i]
    if (c === '"') return string(i)
    if (c === "{") return object(i + 1)
    if (c === "[") return array(i + 1)
    for (const word of ["null", "true", "false", "NaN", "Infinity", "-Infinity"])
      if (s.startsWith(word, i)) return i + word.length
    const m = NUMBER.exec(s.slice(i))
    if (m !== null) return i + m[0].length
    throw new PyJsonError("Expecting value", i)
  }
  const object = (start: number): number => {
    let i = ws(start)
    if (s[i] === "}") return i + 1
    for (;;) {
      if (s[i] !== '"') throw new PyJsonError("Expecting property name enclosed in double quotes", i)
      i = ws(string(i))
      if (s[i] !== ":") throw new PyJsonError("Expecting ':' delimiter", i)
      i = ws(value(ws(i + 1)))
      if (s[i] === "}") return i + 1
      if (s[i] !== ",") throw new PyJsonError("Expecting ',' delimiter", i)
      i = ws(i + 1)
    }
  }
  const array = (start: number): number => {
    let i = ws(start)
    if (s[i] === "]") return i + 1
    for (;;) {
      i = ws(value(i))
      if (s[i] === "]") return i + 1
      if (s[i] !== ",") throw new PyJsonError("Expecting ',' delimiter", i)
      i = ws(i + 1)
    }
  }
  try {
    const end = ws(value(ws(0)))
    if (end !== s.length) throw new PyJsonError("Extra data", end)
    return undefined
  } catch (e) {
    if (!(e instanceof PyJsonError)) throw e
    // Python counts characters (code points), JavaScript UTF-16 units
    return { msg: e.msg, pos: [...s.slice(0, e.pos)].length }
  }
}
