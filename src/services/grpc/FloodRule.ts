/**
 * When a gRPC connection floods the agent with frames that cost it CPU and carry no call, and how a connection
 * node:http2 closed is told apart: pure rules over counts the live side (layers/grpc/http2/Guard.ts) samples.
 *
 * Node gives no per-frame hook, and neither it nor nghttp2 limits WINDOW_UPDATE (nor PRIORITY, nor RST_STREAM on
 * closed streams): a security review's raw flood of WINDOW_UPDATE frames (stream 0, increment 1) kept a full core
 * busy and was never closed. What Node does expose is the bytes read on the connection's socket (`bytesRead`) and
 * written (`bytesWritten`), and the server sees each call's headers and request bytes. The rule: the bytes read
 * beyond what the calls account for (their headers, their DATA, a frame header each) and beyond what the agent's
 * own writes make a client send back (WINDOW_UPDATE as it reads, PING and SETTINGS acks: never more bytes than the
 * frames they answer) are waste; a connection may waste `floorBytesPerSec` for ever and `burstBytes` at once (a
 * token bucket). A router's connection wastes next to nothing: its WINDOW_UPDATEs answer the agent's output, its
 * RST_STREAMs end calls counted with their headers, its keepalive PINGs are answered.
 */

export interface FloodLimits {
  /** Unaccounted bytes a connection may send per second, for ever. */
  readonly floorBytesPerSec: number
  /** ... and at once (the bucket's size; a new connection starts with it full). */
  readonly burstBytes: number
}

/**
 * 1 MiB/s and 8 MiB at once. The review's flood read ~200 MB/s of 13-byte frames on one core (about 3.5 ns of
 * agent CPU a byte): the floor is under 0.5% of a core, and the burst is passed in ~40 ms of such a flood. Legitimate
 * waste is a few hundred bytes: the client preface, SETTINGS, the DATA a client had in flight when the agent ended
 * its call early (at most the stream's 64 KiB window).
 */
export const FLOOD_LIMITS: FloodLimits = { floorBytesPerSec: 1024 * 1024, burstBytes: 8 * 1024 * 1024 }

/** Bytes allowed per call beyond its header list: its frames' headers, an RST_STREAM, a WINDOW_UPDATE or two. */
export const STREAM_FRAME_BYTES = 64
/** A DATA frame's header (RFC 9113 4.1): each request chunk the server reads came in at least one frame. */
export const DATA_FRAME_BYTES = 9

/**
 * A request's header list size as RFC 9113 6.5.2 counts it (name + value + 32 per field): never less than the bytes
 * HPACK encoded it in (a literal costs its strings and a few bytes; an indexed field one or two).
 */
export const headerListBytes = (headers: Readonly<Record<string, string | ReadonlyArray<string> | undefined>>) => {
  let n = 0
  for (const name in headers) {
    const v = headers[name]
    if (v === undefined) continue
    if (typeof v === "string") n += name.length + v.length + 32
    else for (const s of v) n += name.length + s.length + 32
  }
  return n
}

/** What one connection did between two samples. */
export interface ConnectionSample {
  /** Bytes read on its socket. */
  readonly read: number
  /** Bytes written on it. */
  readonly written: number
  /** Bytes its calls account for (headers, request data, their frame headers). */
  readonly accounted: number
}

/** The bytes read that neither a call nor the agent's own writes account for. */
export const wasted = (s: ConnectionSample): number => Math.max(0, s.read - s.accounted - s.written)

/** A connection's waste bucket: bytes it may still waste, as of `atMs`. */
export interface FloodBucket {
  readonly left: number
  readonly atMs: number
}

export const fullBucket = (nowMs: number, limits: FloodLimits = FLOOD_LIMITS): FloodBucket => ({
  left: limits.burstBytes,
  atMs: nowMs
})

/** The bucket after `sample` (taken at `nowMs`); `flood` once it is empty. */
export const floodStep = (
  bucket: FloodBucket,
  sample: ConnectionSample,
  nowMs: number,
  limits: FloodLimits = FLOOD_LIMITS
): { readonly bucket: FloodBucket; readonly flood: boolean } => {
  const refill = (Math.max(0, nowMs - bucket.atMs) / 1000) * limits.floorBytesPerSec
  const left = Math.min(limits.burstBytes, bucket.left + refill) - wasted(sample)
  return { bucket: { left, atMs: nowMs }, flood: left < 0 }
}

/** Why node:http2 closed a connection, from the error it raised on the session. */
export type ClosedReason = "frame_flood" | "reset_flood" | "refusal_flood" | "control_flood" | "protocol_error"
export const CLOSED_REASONS: ReadonlyArray<ClosedReason> = [
  "frame_flood",
  "reset_flood",
  "refusal_flood",
  "control_flood",
  "protocol_error"
]

/** nghttp2's NGHTTP2_ERR_PROTO and NGHTTP2_ERR_FLOODED (nghttp2 lib/includes/nghttp2/nghttp2.h), as Node's errno. */
const NGHTTP2_ERR_PROTO = -505
const NGHTTP2_ERR_FLOODED = -904

/**
 * A mirror of Node's rapid-reset guard (streamResetBurst, refilled at streamResetRate per second) over the streams
 * a connection opened. Node raises the guard's closure (GOAWAY INTERNAL_ERROR) as the same session error as any
 * protocol error (ERR_HTTP2_ERROR, errno NGHTTP2_ERR_PROTO; seen on Node 24 by experiment): a connection that opened
 * more streams than the guard lets a client reset is taken as closed by the guard.
 */
export interface ResetMirror {
  readonly left: number
  readonly atMs: number
}

export const resetMirror = (burst: number, nowMs: number): ResetMirror => ({ left: burst, atMs: nowMs })

/**
 * The stream resets one peer address may make on all its connections together: Node's guard counts per connection
 * (Connections.ts: 10,000 at once, 1,000/s), so a peer with several connections had that many times the budget (a
 * review's 4 connections each reset ~12,500 streams; RSS 137 -> 337 MB). Four connections' worth: a router that
 * spreads its hedged calls over a few connections (README's advice past one connection's budget) keeps within it.
 */
export const PEER_RESET_BURST = 40_000
export const PEER_RESET_RATE = 4_000

/**
 * Streams one connection may have refused before any handler runs for reasons of its own making (a method this server
 * lacks, not a gRPC request, a malformed grpc-timeout, a client certificate the allowlist refuses): 1,000 at once,
 * then 100 a second. Such a refusal costs the agent a stream's set-up and a status, the caller a HEADERS frame; and
 * admission never sees it: a re-check measured 23,500 unknown-method calls a second taking 8.8 s of CPU in 10 s (with
 * 1,000 headers each, a full core), the victim's p50 17 -> 97 ms, nothing counted. A router calls the methods it
 * knows; one in a rolling upgrade calling a newer one falls back long before this.
 */
export const REFUSAL_BURST = 1_000
export const REFUSAL_RATE = 100

/** The mirror after one more stream (or reset) at `nowMs`. */
export const resetStep = (m: ResetMirror, nowMs: number, burst: number, ratePerSec: number): ResetMirror => ({
  left: Math.min(burst, m.left + (Math.max(0, nowMs - m.atMs) / 1000) * ratePerSec) - 1,
  atMs: nowMs
})

/**
 * The reason a session error closed a connection: nghttp2's flood detection (PING or SETTINGS acks the client does
 * not read, RST_STREAMs it provokes), Node's rapid-reset guard (the mirror spent, within `slack` streams: nghttp2
 * refills its budget once a whole second has passed, the mirror continuously), another protocol error; undefined
 * for an error that is no HTTP/2 verdict (a socket reset: the client went away).
 */
export const closedReason = (errno: number | undefined, mirror: ResetMirror, slack = 0): ClosedReason | undefined =>
  errno === NGHTTP2_ERR_FLOODED
    ? "control_flood"
    : errno === NGHTTP2_ERR_PROTO
      ? mirror.left < slack
        ? "reset_flood"
        : "protocol_error"
      : undefined
