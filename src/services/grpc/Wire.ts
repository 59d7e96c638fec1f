/**
 * Wire: gRPC over HTTP/2 as bytes and header values, the parts the agent's server needs (the spec:
 * grpc/grpc doc/PROTOCOL-HTTP2.md). A message is a 5-byte prefix (compressed flag, big-endian length) then
 * the body; `grpc-timeout` is 1-8 digits and a unit; `grpc-message` is percent-encoded UTF-8. Pure: the
 * transport (layers/grpc/http2) feeds bytes in and writes what comes out.
 */

/** One length-prefixed message as received: its body still compressed when `compressed`. */
export interface WireMessage {
  readonly compressed: boolean
  readonly body: Uint8Array
}

/** A message announced longer than the receive limit: the call ends before its body is buffered. */
export interface OverLimit {
  readonly _tag: "OverLimit"
  readonly length: number
}

/** The length prefix before every message: a compressed flag, then the body length as a big-endian uint32. */
export const PREFIX = 5

/**
 * Splits a byte stream into messages. A message longer than `maxLength` is refused on its prefix, so an
 * oversized request never sits in memory whole. The common case, one chunk that is exactly one message, is
 * handed back without a copy.
 */
export class MessageReader {
  readonly #maxLength: number
  #parts: Array<Uint8Array> = []
  #buffered = 0
  constructor(maxLength: number) {
    this.#maxLength = maxLength
  }

  /** Bytes received that do not yet make a whole message (a stream ending here is truncated). */
  get pending(): number {
    return this.#buffered
  }

  /** Adds `chunk`; returns the messages it completes, or OverLimit. */
  push(chunk: Uint8Array): Array<WireMessage> | OverLimit {
    if (this.#buffered === 0 && chunk.length >= PREFIX) {
      const length = lengthOf(chunk, 0)
      if (length > this.#maxLength) return { _tag: "OverLimit", length }
      if (chunk.length === PREFIX + length) return [{ compressed: chunk[0] !== 0, body: chunk.subarray(PREFIX) }]
    }
    this.#parts.push(chunk)
    this.#buffered += chunk.length
    const out: Array<WireMessage> = []
    for (;;) {
      if (this.#buffered < PREFIX) return out
      const head = this.#flatten()
      const length = lengthOf(head, 0)
      if (length > this.#maxLength) return { _tag: "OverLimit", length }
      if (this.#buffered < PREFIX + length) return out
      out.push({ compressed: head[0] !== 0, body: head.slice(PREFIX, PREFIX + length) })
      const rest = head.subarray(PREFIX + length)
      this.#parts = rest.length === 0 ? [] : [rest]
      this.#buffered = rest.length
    }
  }

  #flatten(): Uint8Array {
    if (this.#parts.length === 1) return this.#parts[0]!
    const all = new Uint8Array(this.#buffered)
    let at = 0
    for (const p of this.#parts) {
      all.set(p, at)
      at += p.length
    }
    this.#parts = [all]
    return all
  }
}

const lengthOf = (b: Uint8Array, at: number): number =>
  ((b[at + 1]! << 24) >>> 0) + (b[at + 2]! << 16) + (b[at + 3]! << 8) + b[at + 4]!

/**
 * `body` as one uncompressed message: the prefix and the body in one buffer (one write, one DATA frame), from
 * `alloc` (the transport passes Node's pooled Buffer.allocUnsafe: a fresh ArrayBuffer per relayed token costs a
 * native allocation each; the bytes need not be zeroed, every one is written here).
 */
export const frameMessage = (
  body: Uint8Array,
  alloc: (size: number) => Uint8Array = (size) => new Uint8Array(size)
): Uint8Array => {
  const out = alloc(PREFIX + body.length)
  const n = body.length
  out[0] = 0
  out[1] = n >>> 24
  out[2] = (n >>> 16) & 0xff
  out[3] = (n >>> 8) & 0xff
  out[4] = n & 0xff
  out.set(body, PREFIX)
  return out
}

const UNIT_MS: Readonly<Record<string, number>> = { H: 3_600_000, M: 60_000, S: 1_000, m: 1, u: 0.001, n: 0.000_001 }

/**
 * A `grpc-timeout` value in milliseconds (rounded up, so a positive timeout is never 0); undefined when
 * absent, "invalid" when it is not 1-8 digits and one of H M S m u n.
 */
export const parseTimeout = (value: string | undefined): number | undefined | "invalid" => {
  if (value === undefined) return undefined
  const m = /^(\d{1,8})([HMSmun])$/.exec(value)
  if (m === null) return "invalid"
  return Math.ceil(Number(m[1]) * UNIT_MS[m[2]!]!)
}

/**
 * `grpc-message` encoding: UTF-8, with every byte outside printable ASCII and "%" itself written as %XX.
 * encodeURIComponent would also escape spaces and punctuation that the spec leaves readable.
 */
export const encodeStatusMessage = (message: string): string => {
  if (/^[\x20-\x24\x26-\x7e]*$/.test(message)) return message
  let out = ""
  for (const byte of new TextEncoder().encode(message)) {
    out += byte >= 0x20 && byte <= 0x7e && byte !== 0x25 ? String.fromCharCode(byte) : `%${hex(byte)}`
  }
  return out
}

const hex = (byte: number): string => byte.toString(16).toUpperCase().padStart(2, "0")

/** Metadata keys a handler may not send as trailers: HTTP/2 pseudo-headers and the gRPC transport's own. */
export const reservedTrailer = (key: string): boolean =>
  key.startsWith(":") || key.startsWith("grpc-") || key === "content-type" || key === "te"
