/**
 * StatusMessage: what a call's status may carry, bounded so that every client takes it. The status goes out as
 * HTTP/2 header fields (trailers, or a trailers-only HEADERS frame), and a client refuses a header list over its
 * limit; some refuse it by closing the whole connection, which ends every other call on it, mid-stream and too late
 * for a router to retry (a 120k-character `model` echoed into `grpc-message` did that to grpc-js clients).
 *
 * The limits a status must fit, smallest first:
 * - gRPC's suggested client limit: 8 KiB for Response-Headers, Trailers and Trailers-Only each
 *   (grpc/grpc doc/PROTOCOL-HTTP2.md, "Clients may limit the size of Response-Headers, Trailers, and
 *   Trailers-Only, with a default of 8 KiB each suggested"), counted as SETTINGS_MAX_HEADER_LIST_SIZE counts
 *   (each field's name and value plus 32 bytes, RFC 9113 section 6.5.2).
 * - grpc-java: 8 KiB (io.grpc.internal.GrpcUtil DEFAULT_MAX_HEADER_LIST_SIZE = 8192, maxInboundMetadataSize).
 * - grpc C-core (C++, Python, Ruby, PHP...): 8 KiB soft, 16 KiB hard (grpc.max_metadata_size,
 *   grpc.absolute_max_metadata_size; src/core/call/metadata_info.h DEFAULT_MAX_HEADER_LIST_SIZE).
 * - grpc-js on node:http2: Node's default SETTINGS_MAX_HEADER_LIST_SIZE is 65535 (http2.getDefaultSettings()),
 *   and nghttp2 refuses a header field longer than 64 KiB once HPACK-coded (NGHTTP2_HD_MAX_NV) with a
 *   COMPRESSION_ERROR that closes the connection: measured, a 70 000-character ASCII model name went through, a
 *   120 000-character one (or 25 000 "é", percent-encoded to 150 000 bytes) killed the connection's other calls.
 * - Envoy, a proxy a router may sit behind: 60 KiB of headers by default (max_request_headers_kb).
 * - grpc-go: 16 MiB (internal/transport/defaults.go defaultClientMaxHeaderListSize).
 *
 * So `grpc-message` is cut to 1 KiB as sent (after percent-encoding) and every other trailer value to 1 KiB
 * (GrpcStatus.ts asciiTrailer): the agent's largest status (an engine failure, with cgn-engine-message, -type
 * and -code) stays under 5 KiB, well inside the 8 KiB the strictest clients take. A message is cut between
 * characters (never inside a surrogate pair or a %XX escape) and says how much was cut. Pure.
 */
import { asciiTrailer, type GrpcFailure } from "./GrpcStatus.ts"
import { encodeStatusMessage, reservedTrailer } from "./Wire.ts"

/** The most bytes of `grpc-message` sent, as on the wire (percent-encoded), the cut's marker included. */
export const MAX_STATUS_MESSAGE_BYTES = 1024

/** How many characters of a caller's value a message quotes (quoteInput). */
export const QUOTED_CHARS = 64

const isHigh = (c: number): boolean => c >= 0xd800 && c <= 0xdbff
const isLow = (c: number): boolean => c >= 0xdc00 && c <= 0xdfff

/** The code point at `i` of `s` and how many UTF-16 units it takes (a lone surrogate is one: U+FFFD when encoded). */
const codePointAt = (s: string, i: number): readonly [number, number] => {
  const c = s.charCodeAt(i)
  if (isHigh(c) && i + 1 < s.length && isLow(s.charCodeAt(i + 1))) return [s.codePointAt(i)!, 2]
  return [isHigh(c) || isLow(c) ? 0xfffd : c, 1]
}

/** Bytes one code point takes in encodeStatusMessage's output (Wire.ts): printable ASCII but "%" as is, else %XX per UTF-8 byte. */
const encodedBytes = (cp: number): number => {
  if (cp >= 0x20 && cp <= 0x7e) return cp === 0x25 ? 3 : 1
  if (cp < 0x80) return 3
  if (cp < 0x800) return 6
  if (cp < 0x10000) return 9
  return 12
}

/** Characters (code points) in `s` from `from` on, a lone surrogate counting as one. */
export const characters = (s: string, from = 0): number => {
  let n = 0
  for (let i = from; i < s.length; i += codePointAt(s, i)[1]) n++
  return n
}

const marker = (cut: number): string => `… (${cut} more characters)`

/**
 * `message` as the `grpc-message` value (percent-encoded, Wire.ts encodeStatusMessage), at most `maxBytes` long:
 * whole when it fits, else its first characters and `… (N more characters)`. Reads only as far as the cut, but
 * for the count of the rest.
 */
export const boundStatusMessage = (message: string, maxBytes: number = MAX_STATUS_MESSAGE_BYTES): string => {
  // The marker's room, for the most characters it can report (its digits grow with them).
  const room = encodeStatusMessage(marker(message.length)).length
  let bytes = 0
  /** Where the message is cut if it does not fit: the first character past `maxBytes - room`. */
  let keep = -1
  for (let i = 0; i < message.length; ) {
    const [cp, units] = codePointAt(message, i)
    bytes += encodedBytes(cp)
    if (keep < 0 && bytes > maxBytes - room) keep = i
    if (bytes > maxBytes)
      return encodeStatusMessage(message.slice(0, keep)) + encodeStatusMessage(marker(characters(message, keep)))
    i += units
  }
  return encodeStatusMessage(message)
}

/**
 * A caller's value as a message quotes it: JSON-quoted, with control characters and every non-ASCII character as
 * \uXXXX escapes (visible, and one byte each on the wire), and at most `chars` characters of it, then its length.
 * `"Mxxx"... (120001 characters)`: the message stays short and readable whatever the caller sent.
 */
export const quoteInput = (value: string, chars: number = QUOTED_CHARS): string => {
  let end = 0
  for (let n = 0; end < value.length && n < chars; n++) end += codePointAt(value, end)[1]
  const shown = JSON.stringify(value.slice(0, end)).replace(
    /[^\x20-\x7e]/g,
    (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`
  )
  return end === value.length ? shown : `${shown}... (${characters(value)} characters)`
}

/** The advice a failure that may go to another node is sent with (GrpcFailure.advised), when it sent nothing. */
export const RETRY_ADVICE = "; retry on another node"

/** The advice once the call had sent a message: not retryable, whatever the cause. */
export const STREAMED_ADVICE = "; do not retry elsewhere: the call had already streamed output"

/** The advice on a leg bound to its pair (GrpcFailure.pairBound) that sent nothing. */
export const PAIR_ADVICE = "; retry both legs as a new pair (this leg's handoff is not to be used again)"

/**
 * A failure as the call sends it, given whether a message went out first (`wrote`): the one decision of
 * `cgn-retryable` (retryElsewhere, and nothing sent: a client that has text would see a retry's repeated; undefined:
 * no opinion) and of the advice its message ends with, which says the same. A leg bound to its pair (`pairBound`)
 * that another node could take and that sent nothing is not retryable alone: `retryPair` (the `cgn-retry-pair`
 * trailer) says so. The failures' own messages carry no advice: a failure whose row gives it (`advised`) gets
 * RETRY_ADVICE, STREAMED_ADVICE or PAIR_ADVICE here, from the same decision, so its words cannot disagree with the
 * trailer (the soak's engine, killed mid-stream, once said "retry on another node" beside `cgn-retryable: false`).
 */
export const asSent = (
  status: GrpcFailure,
  wrote: boolean
): { readonly message: string; readonly retryable: boolean | undefined; readonly retryPair?: true } => {
  if (status.retryElsewhere === undefined) return { message: status.message, retryable: undefined }
  if (!status.retryElsewhere) return { message: status.message, retryable: false }
  const say = (advice: string): string => (status.advised === true ? status.message + advice : status.message)
  if (wrote) return { message: say(STREAMED_ADVICE), retryable: false }
  if (status.pairBound === true) return { message: say(PAIR_ADVICE), retryable: false, retryPair: true }
  return { message: say(RETRY_ADVICE), retryable: true }
}

/**
 * The header fields that end a call with `status`, given whether a message went out first (`wrote`): grpc-status,
 * grpc-message bounded (boundStatusMessage), the row's trailers but the transport's own names, each value printable
 * ASCII of at most 1 KiB (asciiTrailer), and cgn-retryable and cgn-retry-pair (asSent decides them with the advice).
 * A leg bound to its pair (`cgn-retry-pair`) also says so to a gRPC library's own retries: `grpc-retry-pushback-ms`
 * negative means "do not retry" to a client with a retryPolicy (gRFC A6, "Pushback"; grpc-js RetryingCall,
 * grpc-java RetriableStream, grpc-go and C-core read it), which would otherwise resend the leg alone after its
 * backoff, its handoff spent or its room taken. Not on other failures the agent does not retry: A6 counts a "do not
 * retry" pushback as a failure for retry throttling (grpc-go, grpc-java), so on a request's own fault
 * (INVALID_ARGUMENT, a request too large) it would throttle the router's retries of failures worth retrying, which
 * A6 keeps such faults out of; another attempt at those just fails the same way.
 */
export const statusTrailers = (status: GrpcFailure, wrote: boolean): Record<string, string> => {
  const trailers: Record<string, string> = { "grpc-status": String(status.code) }
  const { message, retryable, retryPair } = asSent(status, wrote)
  if (message !== "") trailers["grpc-message"] = boundStatusMessage(message)
  for (const k in status.trailers) if (!reservedTrailer(k)) trailers[k] = asciiTrailer(status.trailers[k]!)
  if (retryable !== undefined) trailers["cgn-retryable"] = String(retryable)
  if (retryPair) {
    trailers["cgn-retry-pair"] = "true"
    trailers["grpc-retry-pushback-ms"] = "-1"
  }
  return trailers
}
