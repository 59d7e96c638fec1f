/**
 * DeltaFrame: the per-token message, `GenerateResponse { delta: GenerateDelta { text, index, tokens } }`, written
 * as one whole gRPC frame (length prefix included) in one allocation. The generated encoder builds a
 * BinaryWriter with a fork for the nested message, then the frame copies its bytes once more: ~0.7 µs and
 * several objects per message, against ~0.09 µs and one Buffer here (docs/bench.md, "The delta frame").
 * The bytes are the generated encoder's (test/grpc/delta-frame.test.ts compares them): proto3 leaves out an
 * empty `text` and zero numbers; field numbers from proto/cgn/agent/v1/agent.proto (GenerateResponse.delta = 1;
 * GenerateDelta.text = 1, index = 2, tokens = 3). Every other message goes through the generated encoder.
 */
import { PREFIX } from "./Wire.ts"

// Tags: (field number << 3) | wire type (0 varint, 2 length-delimited).
const RESPONSE_DELTA = (1 << 3) | 2
const DELTA_TEXT = (1 << 3) | 2
const DELTA_INDEX = (2 << 3) | 0
const DELTA_TOKENS = (3 << 3) | 0

/** Bytes of `n` (a uint32) as a varint. */
const varintLength = (n: number): number => (n < 0x80 ? 1 : n < 0x4000 ? 2 : n < 0x200000 ? 3 : n < 0x10000000 ? 4 : 5)

const putVarint = (out: Uint8Array, at: number, n: number): number => {
  let v = n >>> 0
  while (v >= 0x80) {
    out[at++] = (v & 0x7f) | 0x80
    v >>>= 7
  }
  out[at++] = v
  return at
}

/** The delta as a gRPC frame; `index` and `tokens` are uint32. `alloc` gives uninitialised memory (all of it is written). */
export const frameDelta = (
  text: string,
  index: number,
  tokens: number,
  alloc: (size: number) => Buffer = Buffer.allocUnsafe
): Buffer => {
  const textBytes = Buffer.byteLength(text, "utf8")
  const delta =
    (textBytes > 0 ? 1 + varintLength(textBytes) + textBytes : 0) +
    (index !== 0 ? 1 + varintLength(index) : 0) +
    (tokens !== 0 ? 1 + varintLength(tokens) : 0)
  const message = 1 + varintLength(delta) + delta
  const out = alloc(PREFIX + message)
  out[0] = 0
  out.writeUInt32BE(message, 1)
  let at = PREFIX
  out[at++] = RESPONSE_DELTA
  at = putVarint(out, at, delta)
  if (textBytes > 0) {
    out[at++] = DELTA_TEXT
    at = putVarint(out, at, textBytes)
    at += out.write(text, at, "utf8")
  }
  if (index !== 0) {
    out[at++] = DELTA_INDEX
    at = putVarint(out, at, index)
  }
  if (tokens !== 0) {
    out[at++] = DELTA_TOKENS
    putVarint(out, at, tokens)
  }
  return out
}
