// What src/sim/pyWords.ts writes for the values and bodies upstream-refusals.test.ts does not reach: repr() of a
// float's specials (nan, inf, -inf, -0.0: CPython Objects/floatobject.c float_repr), of True/False/None and of a str
// with a newline (Objects/unicodeobject.c unicode_repr), and where json.loads stops on a control character or a bad
// escape, accepts -Infinity and upper-case \u digits, and counts its position in code points, not UTF-16 units
// (CPython Modules/_json.c scanstring_unicode, Lib/json/decoder.py). The simulators quote these in the engines' 400s.
import { describe, expect, it } from "vitest"
import { pyFloat, pyJsonError, pyRepr } from "../../src/sim/pyWords.ts"

describe("Python's repr() of a value", () => {
  it("a float's specials", () => {
    expect([Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY, -0].map(pyFloat)).toEqual([
      "nan",
      "inf",
      "-inf",
      "-0.0"
    ])
  })

  it("booleans, None and a str with a newline, inside a dict as str(errors) shows them", () => {
    expect(pyRepr({ a: true, b: false, c: null, d: "x\ny\tz", e: [1.5, 2] })).toBe(
      "{'a': True, 'b': False, 'c': None, 'd': 'x\\ny\\tz', 'e': [1.5, 2]}"
    )
  })
})

describe("where json.loads stops", () => {
  it("a raw control character inside a string, at its position", () => {
    expect(pyJsonError('"a\u0001"')).toEqual({ msg: "Invalid control character at", pos: 2 })
  })

  it("an escape that is none, at its backslash; upper-case \\u digits are one", () => {
    expect(pyJsonError('"\\x"')).toEqual({ msg: "Invalid \\escape", pos: 1 })
    expect(pyJsonError('"\\u00E9"')).toBeUndefined()
  })

  it("takes -Infinity as a value, as it does NaN and Infinity", () => {
    expect(pyJsonError("[NaN, Infinity, -Infinity]")).toBeUndefined()
  })

  it("counts code points: an emoji before the stop is one character", () => {
    expect(pyJsonError('"\u{1F600}" x')).toEqual({ msg: "Extra data", pos: 4 })
  })
})
