// How llama-server reads a JSON number into a request field's C++ type (pure), so the llama_cpp flavor range-checks
// and prints the value the real server does (server-schema.cpp field_num<T>::eval: `data.at(n).get<T>()`, then
// `std::to_string`). nlohmann keeps an integer literal as int64 (negative) or uint64, anything else (a fraction, an
// exponent, an integer past uint64) as a double. An integer converts modulo 2^bits; a double truncates, and one the
// type cannot hold is undefined behaviour in C++: what x86-64's conversion gives was measured against the real
// binary (test/real/sim-differential-8.test.ts): INT32_MIN for int32, INT64_MIN for int64, 0 for uint32 past int64.

/** The C++ type of a number field (the member field_num<T> is deduced from: task_params, common_params_sampling). */
export type CppType = "int32" | "int64" | "uint32" | "float"

const I64_MIN = -(2n ** 63n)
const U64_END = 2n ** 64n
const FLT_MAX = 3.4028234663852886e38

/**
 * The integer literal a JS client wrote for `v`, or undefined where nlohmann holds a double. JSON.parse keeps no
 * literal, so this is JSON.stringify's: an integral number below 1e21 is written in plain digits (the shortest that
 * round-trip, so BigInt of them, not of the double), one at or past it with an exponent. A body that writes an
 * integral value with a fraction (`5.0`) is read as the integer here, which differs only for values out of range.
 */
const integerLiteral = (v: number): bigint | undefined => {
  if (!Number.isInteger(v)) return undefined
  const s = String(v)
  if (s.includes("e")) return undefined
  const n = BigInt(s)
  return n >= I64_MIN && n < U64_END ? n : undefined
}

/** A double's C++ conversion to an integer type: the truncated value where it fits, else `out` (measured). */
const fromDouble = (v: number, lo: number, hi: number, out: bigint): bigint => {
  const t = Math.trunc(v)
  return t >= lo && t < hi ? BigInt(t) : out
}

/**
 * A number field's value as `get<T>()` gives it: a boolean is 0 or 1; integers of int32 and uint32 as numbers,
 * int64 as a bigint (past 2^53), float as the float's value (its double). A float field's default limits are the
 * type's lowest and max (field_num), so an infinity is clamped to FLT_MAX unless a hard limit refuses it first:
 * `clampFloat` gives that.
 */
export const cppValue = (raw: number | boolean, type: CppType): number | bigint => {
  const v = typeof raw === "boolean" ? Number(raw) : raw
  const lit = integerLiteral(v)
  switch (type) {
    case "int32":
      return Number(lit === undefined ? fromDouble(v, -(2 ** 31), 2 ** 31, -(2n ** 31n)) : BigInt.asIntN(32, lit))
    case "int64":
      return lit === undefined ? fromDouble(v, -(2 ** 63), 2 ** 63, I64_MIN) : BigInt.asIntN(64, lit)
    case "uint32":
      // the compiler converts through int64 and keeps the low 32 bits: 1e10 is 1410065408, 1e30 is 0
      return Number(BigInt.asUintN(32, lit ?? fromDouble(v, -(2 ** 63), 2 ** 63, 0n)))
    case "float":
      return Math.fround(v)
  }
}

/** A float field's value after field_num's default limits (lowest..max of float): an infinity becomes FLT_MAX. */
export const clampFloat = (x: number): number => Math.max(-FLT_MAX, Math.min(FLT_MAX, x))

/** std::to_string: an integer in plain digits, a float (promoted to double) with %f's six decimals, inf as inf. */
export const cppString = (x: number | bigint, type: CppType): string => {
  if (type !== "float" || typeof x === "bigint") return String(x)
  if (!Number.isFinite(x)) return x > 0 ? "inf" : "-inf"
  // a float this large is an integer; toFixed would switch to exponent notation at 1e21
  if (Math.abs(x) >= 1e21) return `${BigInt(x)}.000000`
  return Object.is(x, -0) ? "-0.000000" : sixDecimals(x)
}

/**
 * %f's six decimals as glibc prints them: the exact binary value rounded half to even. toFixed rounds an exact tie
 * away from zero (-0.0078125: glibc -0.007812, toFixed -0.007813); a float's value is a dyadic fraction whose digits
 * end well within toFixed's 100, so its exact digits tell a tie.
 */
const sixDecimals = (x: number): string => {
  const exact = Math.abs(x).toFixed(100)
  const cut = exact.indexOf(".") + 7
  if (exact[cut] !== "5" || /[1-9]/.test(exact.slice(cut + 1))) return x.toFixed(6)
  const down = exact.slice(0, cut)
  const even = Number(down.at(-1)) % 2 === 0
  const magnitude = even ? down : (Math.abs(x) + 5e-7).toFixed(6)
  return x < 0 ? `-${magnitude}` : magnitude
}
