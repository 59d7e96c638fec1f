/**
 * An integer written into an engine's JSON body digit for digit (a seed, SGLang's bootstrap room): JSON.stringify
 * writes a number past 2^53 rounded, and the engine would read another value. Pure.
 */

// JSON.rawJSON (Node 21+) makes JSON.stringify write the digits as given.
const rawJSON = (JSON as unknown as { rawJSON: (text: string) => unknown }).rawJSON

/** The JSON value of `n`: a plain number when exact, else a raw JSON integer. */
export const exactIntegerJson = (n: bigint): unknown =>
  n <= BigInt(Number.MAX_SAFE_INTEGER) && n >= BigInt(Number.MIN_SAFE_INTEGER) ? Number(n) : rawJSON(n.toString())
