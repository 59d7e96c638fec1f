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

const EMPTY = new Uint8Array(0)

/**
 * Splits a byte stream into messages. A message longer than `maxLength` is refused on its prefix, so an
 * oversized request never sits in memory whole. Messages whole inside one chunk (the common case: one chunk,
 * one message) are views of it, without a copy. A message spread over chunks (a large request comes in 16 KiB
 * DATA frames) is copied into a buffer from `alloc` that doubles as needed, up to the message's size: the
 * copies stay linear in the message and the memory within twice what arrived, however small the chunks
 * (gathering all the chunks again on each one was quadratic: 100 ms for 4 MiB in 16 KiB frames).
 */
export class MessageReader {
  readonly #maxLength: number
  readonly #alloc: (size: number) => Uint8Array
  /** The message begun in an earlier chunk: its first `#have` bytes (prefix, then body so far). */
  #partial: Uint8Array = EMPTY
  #have = 0
  /** Its body length once its prefix is whole, else -1. */
  #length = -1
  constructor(maxLength: number, alloc: (size: number) => Uint8Array = (size) => new Uint8Array(size)) {
    this.#maxLength = maxLength
    this.#alloc = alloc
  }

  /** Bytes received that do not yet make a whole message (a stream ending here is truncated). */
  get pending(): number {
    return this.#have
  }

  /** Adds `chunk`; returns the messages it completes, or OverLimit. */
  push(chunk: Uint8Array): Array<WireMessage> | OverLimit {
    const out: Array<WireMessage> = []
    let at = 0
    if (this.#have > 0) {
      at = this.#fill(chunk, 0)
      if (this.#length > this.#maxLength) return { _tag: "OverLimit", length: this.#length }
      if (this.#length < 0 || this.#have < PREFIX + this.#length) return out
      out.push({ compressed: this.#partial[0] !== 0, body: this.#partial.subarray(PREFIX, this.#have) })
      this.#partial = EMPTY
      this.#have = 0
      this.#length = -1
    }
    while (chunk.length - at >= PREFIX) {
      const length = lengthOf(chunk, at)
      if (length > this.#maxLength) return { _tag: "OverLimit", length }
      if (chunk.length - at < PREFIX + length) break
      out.push({ compressed: chunk[at] !== 0, body: chunk.subarray(at + PREFIX, at + PREFIX + length) })
      at += PREFIX + length
    }
    // A message the next chunks finish (its length, when known here, was checked above).
    if (at < chunk.length) this.#fill(chunk, at)
    return out
  }

  /** Copies `chunk` from `at` into the partial message, up to the message's end; returns where it stopped. */
  #fill(chunk: Uint8Array, at: number): number {
    if (this.#length < 0) {
      const k = Math.min(PREFIX - this.#have, chunk.length - at)
      this.#append(chunk.subarray(at, at + k))
      at += k
      if (this.#have < PREFIX) return at
      this.#length = lengthOf(this.#partial, 0)
      if (this.#length > this.#maxLength) return at
    }
    const k = Math.min(PREFIX + this.#length - this.#have, chunk.length - at)
    this.#append(chunk.subarray(at, at + k))
    return at + k
  }

  #append(bytes: Uint8Array): void {
    const need = this.#have + bytes.length
    if (need > this.#partial.length) {
      const whole = this.#length < 0 ? PREFIX : PREFIX + this.#length
      const grown = this.#alloc(Math.max(need, Math.min(whole, 2 * this.#partial.length)))
      grown.set(this.#partial.subarray(0, this.#have))
      this.#partial = grown
    }
    this.#partial.set(bytes, this.#have)
    this.#have = need
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
 * Whether a request's content-type is gRPC's: "application/grpc", alone or followed by "+" (a subtype such as
 * +proto) or ";" (parameters), as grpc/grpc doc/PROTOCOL-HTTP2.md defines it and grpc-go checks it. Not
 * "application/grpc-web", another protocol (its trailers travel in the body), which a prefix match took for gRPC.
 */
export const isGrpcContentType = (value: string | undefined): boolean => {
  if (value === undefined || !value.startsWith("application/grpc")) return false
  const next = value.charCodeAt(16) // after "application/grpc"
  return Number.isNaN(next) || next === 0x2b /* + */ || next === 0x3b /* ; */
}

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
 * A timeout in milliseconds as a client writes `grpc-timeout`: at most 8 digits (grpc/grpc doc/PROTOCOL-HTTP2.md), in
 * the finest of m, S, M, H that holds it, rounded up so that the callee's deadline is never earlier than the caller's.
 */
export const formatTimeout = (ms: number): string => {
  for (const unit of ["m", "S", "M", "H"]) {
    const n = Math.max(0, Math.ceil(ms / UNIT_MS[unit]!))
    if (n <= 99_999_999) return `${n}${unit}`
  }
  return "99999999H"
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
