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

/**
 * What one peer address's connections may waste together: four connections' worth (as PEER_RESET_BURST). Each
 * connection's own bucket let a peer with 64 connections, each just under its floor, waste 64 MiB/s: a re-check
 * measured ~0.2 of a core, and their 8 MiB bursts 4 s of CPU in 12 s. A router's connections waste next to nothing
 * however many it holds.
 */
export const PEER_FLOOD_LIMITS: FloodLimits = { floorBytesPerSec: 4 * 1024 * 1024, burstBytes: 32 * 1024 * 1024 }

/**
 * The least a connection must have wasted in the sample in which its peer's bucket ran out to be closed for it
 * (about 4 KiB/s at the guard's 250 ms samples): the peer's connections that flood go, one that wastes a few bytes
 * (a client preface, its SETTINGS) is left to its calls. Sixty-four connections under it waste under 0.3 MiB/s.
 */
export const PEER_FLOOD_MIN_BYTES = 1024

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

/** The request bytes of one chunk as the flood rule accounts them (its DATA frame's header included). */
export const chunkBytes = (length: number): number => length + DATA_FRAME_BYTES

/** A stream's receive window when the session's SETTINGS say none (RFC 9113 6.9.2). */
const DEFAULT_WINDOW = 65_535

/**
 * What a caller may still send on a stream whose request the server stopped early, `read` bytes of it received and
 * `windowLeft` of its receive window left: the larger of that window and the initial window less what came (Node
 * gives back the window as the server reads), with a DATA frame's header per KiB. A client that makes the server stop
 * its requests earns at most this per stream, each stream a call (admission and the reset budgets bound those).
 */
export const unreadCredit = (windowLeft: number, read: number, initialWindow = DEFAULT_WINDOW): number => {
  const unread = Math.min(initialWindow, Math.max(windowLeft, initialWindow - read, 0))
  return unread + DATA_FRAME_BYTES * Math.ceil(unread / 1024)
}

/** What one connection did between two samples. */
export interface ConnectionSample {
  /** Bytes read on its socket. */
  readonly read: number
  /** Bytes written on it. */
  readonly written: number
  /** Bytes its calls account for (headers, request data, their frame headers). */
  readonly accounted: number
  /**
   * Bytes of `written` that answer the client's own frames (`answeredBytes`): acks a client makes the agent send
   * by sending, which earn it nothing. Counted as the agent's writes, a PING's ack cancelled the PING: a PING flood
   * wasted nothing and was never closed.
   */
  readonly answered?: number
}

/** A PING frame (RFC 9113 6.7): a frame header and 8 bytes of payload; its ack is the same size. */
export const PING_FRAME_BYTES = 17
/** A SETTINGS ack (RFC 9113 6.5): a frame header alone. */
export const SETTINGS_ACK_BYTES = 9

/** The bytes of the agent's acks of `pings` PING and `settings` SETTINGS frames the client sent. */
export const answeredBytes = (pings: number, settings: number): number =>
  pings * PING_FRAME_BYTES + settings * SETTINGS_ACK_BYTES

/** The bytes read that neither a call nor the agent's own writes (its answers to the client's frames aside) account for. */
export const wasted = (s: ConnectionSample): number =>
  Math.max(0, s.read - s.accounted - Math.max(0, s.written - (s.answered ?? 0)))

/** A connection's waste bucket: bytes it may still waste, as of `atMs`. */
export interface FloodBucket {
  readonly left: number
  readonly atMs: number
}

export const fullBucket = (nowMs: number, limits: FloodLimits = FLOOD_LIMITS): FloodBucket => ({
  left: limits.burstBytes,
  atMs: nowMs
})

/** The bucket after `waste` more bytes (sampled at `nowMs`); `flood` once it is empty. */
export const wasteStep = (
  bucket: FloodBucket,
  waste: number,
  nowMs: number,
  limits: FloodLimits = FLOOD_LIMITS
): { readonly bucket: FloodBucket; readonly flood: boolean } => {
  const left = refilled(bucket, nowMs, limits) - waste
  return { bucket: { left, atMs: nowMs }, flood: left < 0 }
}

/**
 * A peer's bucket after its open connections wasted `wastes` in one sample (at `nowMs`), and which of them to close:
 * none while the bucket holds; past it, those that wasted PEER_FLOOD_MIN_BYTES or more, or the mean of `wastes` if
 * less (thousands of connections each under the minimum, where max_connections_per_peer allows them, still flood).
 * The bucket is never owed more than its burst: full again within about 2 x burst / floor of the flood's end (16 s
 * at the defaults), not after every byte of it is paid back, which kept a NAT's routers closed for half an hour.
 */
export const peerFloodStep = (
  bucket: FloodBucket,
  wastes: ReadonlyArray<number>,
  nowMs: number,
  limits: FloodLimits = PEER_FLOOD_LIMITS
): { readonly bucket: FloodBucket; readonly close: ReadonlyArray<number> } => {
  let total = 0
  for (const w of wastes) total += w
  const step = wasteStep(bucket, total, nowMs, limits)
  const after = { left: Math.max(step.bucket.left, -limits.burstBytes), atMs: nowMs }
  if (!step.flood || wastes.length === 0) return { bucket: after, close: [] }
  const least = Math.min(PEER_FLOOD_MIN_BYTES, total / wastes.length)
  const close: Array<number> = []
  wastes.forEach((w, i) => {
    if (w >= least) close.push(i)
  })
  return { bucket: after, close }
}

/** A connection's bucket after `sample` (taken at `nowMs`). */
export const floodStep = (bucket: FloodBucket, sample: ConnectionSample, nowMs: number, limits = FLOOD_LIMITS) =>
  wasteStep(bucket, wasted(sample), nowMs, limits)

/** What `bucket` holds at `nowMs`, refilled since it was last stepped (at most its burst: full). */
export const refilled = (bucket: FloodBucket, nowMs: number, limits: FloodLimits): number =>
  Math.min(limits.burstBytes, bucket.left + (Math.max(0, nowMs - bucket.atMs) / 1000) * limits.floorBytesPerSec)

/**
 * Why a connection past its accept was closed: by the guard for a flood, by node:http2 (closedReason below), for no
 * answer to the keepalive's PING (services/grpc/Keepalive.ts: its peer is gone), or idle, in place of a new one
 * past a cap (ConnectionCaps.ts IdleOrder). The last two are no abuse.
 */
export type ClosedReason =
  | "frame_flood"
  | "reset_flood"
  | "refusal_flood"
  | "control_flood"
  | "protocol_error"
  | "keepalive_timeout"
  | "idle_evicted"
export const CLOSED_REASONS: ReadonlyArray<ClosedReason> = [
  "frame_flood",
  "reset_flood",
  "refusal_flood",
  "control_flood",
  "protocol_error",
  "keepalive_timeout",
  "idle_evicted"
]

/**
 * nghttp2's NGHTTP2_ERR_PROTO, NGHTTP2_ERR_FLOODED and NGHTTP2_ERR_TOO_MANY_CONTINUATIONS (nghttp2
 * lib/includes/nghttp2/nghttp2.h), as Node's errno (the last seen on Node 24: "Too many CONTINUATION frames following a
 * HEADER frame", a header block split past nghttp2's limit of 8 CONTINUATION frames).
 */
const NGHTTP2_ERR_PROTO = -505
const NGHTTP2_ERR_FLOODED = -904
const NGHTTP2_ERR_TOO_MANY_CONTINUATIONS = -905

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
 * review's 4 connections each reset ~12,500 streams; RSS 137 -> 337 MB). At once, four connections' worth: a router
 * that spreads a burst of hedged calls over a few connections (README's advice past one connection's budget) keeps
 * within it. Sustained, one connection's: 4,000 a second took about the whole of a core in a re-check (78.8k resets
 * in 9.5 s over 16 connections, RSS 408 -> 765 MB), and a router's cancels (hedges lost, callers gone) are a share of
 * the calls a node serves, far below 1,000 a second.
 */
export const PEER_RESET_BURST = 40_000
export const PEER_RESET_RATE = 1_000

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
 * not read, RST_STREAMs it provokes, CONTINUATION frames past its limit), Node's rapid-reset guard (the mirror spent, within `slack` streams: nghttp2
 * refills its budget once a whole second has passed, the mirror continuously), another protocol error; undefined
 * for an error that is no HTTP/2 verdict (a socket reset: the client went away).
 */
export const closedReason = (errno: number | undefined, mirror: ResetMirror, slack = 0): ClosedReason | undefined =>
  errno === NGHTTP2_ERR_FLOODED || errno === NGHTTP2_ERR_TOO_MANY_CONTINUATIONS
    ? "control_flood"
    : errno === NGHTTP2_ERR_PROTO
      ? mirror.left < slack
        ? "reset_flood"
        : "protocol_error"
      : undefined
