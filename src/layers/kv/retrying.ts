/**
 * The KV bridge's reconnect loop, shared by the kvcached link and each rank's event reader: runs an attempt
 * again and again with the agent's capped, jittered backoff (services/retry/Backoff.ts) between them. The
 * backoff starts over only after an attempt made progress (it runs `progressed`: kvcached acknowledged a
 * Push, the reader received a message), not because it merely connected: a peer that accepts and then fails
 * at once is retried ever more slowly, up to the cap, instead of in a tight loop at the base delay. For the
 * readers an attempt that lasted the whole cap counts as progress too (`longAttemptIsProgress`): a reader
 * dropped after hours of a quiet engine is a new outage, retried from the base delay, not the next failure of a
 * series that ended long ago. The kvcached link says itself when it made progress instead.
 */
import { Cause, Clock, Effect, Random, SchemaIssue } from "effect"
import { jitteredBackoffMs } from "../../services/retry/Backoff.ts"

export interface RetryOptions<E, R> {
  readonly capMs: number
  /** An attempt that lasted `capMs` or more starts the backoff over (default true). */
  readonly longAttemptIsProgress?: boolean
  /** One attempt; it never succeeds, it ends when something breaks. */
  readonly attempt: (progressed: Effect.Effect<void>) => Effect.Effect<never, E, R>
  /** The `failures`-th attempt in a row without progress ended with `error`; the next starts in `retryInMs`. */
  readonly onFailure: (error: string, failures: number, retryInMs: number) => Effect.Effect<void>
}

const formatIssue = SchemaIssue.makeFormatterDefault()

/** What went wrong, down to the OS error (RpcClientError -> SocketError -> SocketOpenError -> ENOENT). */
const message = (e: unknown): string => {
  const parts: Array<string> = []
  for (let x: unknown = e, depth = 0; x !== null && typeof x === "object" && depth < 6; depth++) {
    // A schema failure's cause is its issue tree, whose own tag ("Composite") says nothing: render it, with
    // the path to what was wrong (e.g. the RPC client refusing to encode a Push).
    if (SchemaIssue.isIssue(x)) {
      parts.push(formatIssue(x).replace(/\s*\n\s*/g, " "))
      break
    }
    const o = x as {
      readonly _tag?: unknown
      readonly message?: unknown
      readonly reason?: unknown
      readonly cause?: unknown
    }
    const tag = typeof o._tag === "string" ? o._tag : undefined
    // effect's socket reports a peer's close as a WebSocket close code (1000), which says nothing on a Unix socket.
    if (tag === "SocketCloseError" && o.cause === undefined) {
      parts.push("the peer closed the connection")
      break
    }
    // The same close seen by a write (EPIPE) or a read (ECONNRESET): Node reports both as the socket's "error",
    // which effect's socket names a read error; say what happened, with the OS error.
    const code = (o.cause as { readonly code?: unknown } | undefined)?.code
    if ((tag === "SocketReadError" || tag === "SocketWriteError") && (code === "EPIPE" || code === "ECONNRESET")) {
      parts.push(`the peer closed the connection (${String((o.cause as Error).message ?? code)})`)
      break
    }
    const text = typeof o.message === "string" && o.message !== "" ? o.message : undefined
    if (o.reason === undefined && o.cause === undefined) {
      parts.push(
        tag !== undefined && text !== undefined && text !== tag ? `${tag} ${text}` : (text ?? tag ?? String(x))
      )
    } else if (tag !== undefined && o.reason === undefined) parts.push(tag)
    else if (tag === undefined && text !== undefined) parts.push(text)
    x = o.reason ?? o.cause
  }
  return parts.join(": ") || String(e)
}

/**
 * Never fails: an attempt's failure, and its defect too (a bug in one session must not stop the bridge for
 * the life of the agent), is reported and retried. Only interruption ends it.
 */
export const retryForever = <E, R>(o: RetryOptions<E, R>): Effect.Effect<never, never, R> =>
  Effect.gen(function* () {
    let failures = 0
    const progressed = Effect.sync(() => {
      failures = 0
    })
    for (;;) {
      const startedAt = yield* Clock.currentTimeMillis
      const exit = yield* Effect.exit(o.attempt(progressed))
      if (o.longAttemptIsProgress !== false && (yield* Clock.currentTimeMillis) - startedAt >= o.capMs) failures = 0
      failures++
      const retryInMs = jitteredBackoffMs(failures, o.capMs, yield* Random.next)
      yield* o.onFailure(message(exit._tag === "Failure" ? Cause.squash(exit.cause) : exit), failures, retryInMs)
      yield* Effect.sleep(retryInMs)
    }
  })
