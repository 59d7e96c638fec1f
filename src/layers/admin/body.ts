/**
 * The one way an admin route reads a request body: at most ADMIN_BODY_LIMIT bytes, and a read that fails does
 * nothing. effect's `request.text` reads the whole body into memory with no limit unless `MaxBodySize` is set, and
 * on overflow it destroys the request, which drops the socket before any answer can be written; so the body is read
 * here from the node:http request itself (@effect/platform-node NodeHttpServerRequest.toIncomingMessage).
 * - A `Content-Length` above the limit: `413` at once, nothing read.
 * - A body that grows past the limit while read (chunked, or a lying length): reading stops there, `413`, and the
 *   connection is closed (`Connection: close`: node:http then destroys the socket once the answer is written,
 *   nodejs/node lib/_http_server.js `resOnFinish`, rather than reading on to discard the rest).
 * - A read that fails (the client aborted mid-body, a malformed chunk) or takes over ADMIN_BODY_TIMEOUT_MS (a body
 *   cut short): `400` with the connection closed, and the route's handler never runs.
 */
import { toIncomingMessage } from "@effect/platform-node/NodeHttpServerRequest"
import { Data, Effect } from "effect"
import { type HttpServerRequest, HttpServerResponse } from "effect/http"
import { adminStatus } from "../../services/admin/AdminAnswers.ts"

/** 16 KiB: the largest admin body is `POST /cordon`'s `{"reason": ...}` (at most 256 characters). */
export const ADMIN_BODY_LIMIT = 16 * 1024

/**
 * How long a body may take to arrive whole: a few hundred bytes from loopback or a token holder take milliseconds,
 * and one cut short (a Content-Length the client never fills) held its request for Node's 300 s requestTimeout.
 */
export const ADMIN_BODY_TIMEOUT_MS = 10_000

export class BodyTooLarge extends Data.TaggedError("BodyTooLarge")<{ readonly limit: number }> {}
export class BodyReadFailed extends Data.TaggedError("BodyReadFailed")<{ readonly reason: string }> {}

/** The body as UTF-8 text, read up to `limit` bytes (see the module's comment). */
export const readBody = (
  request: HttpServerRequest.HttpServerRequest,
  limit: number = ADMIN_BODY_LIMIT,
  timeoutMs: number = ADMIN_BODY_TIMEOUT_MS
): Effect.Effect<string, BodyTooLarge | BodyReadFailed> => {
  const length = request.headers["content-length"]
  if (length !== undefined && Number(length) > limit) return Effect.fail(new BodyTooLarge({ limit }))
  return Effect.callback<string, BodyTooLarge | BodyReadFailed>((resume) => {
    const source = toIncomingMessage(request)
    const chunks: Array<Buffer> = []
    let bytes = 0
    const done = () => {
      source.off("data", onData)
      source.off("end", onEnd)
      source.off("error", onError)
      source.off("close", onClose)
    }
    function onData(chunk: Buffer) {
      bytes += chunk.length
      if (bytes > limit) {
        // stop here: what is already buffered is dropped with the connection the 413 closes
        done()
        source.pause()
        return resume(Effect.fail(new BodyTooLarge({ limit })))
      }
      chunks.push(chunk)
    }
    function onEnd() {
      done()
      resume(Effect.succeed(Buffer.concat(chunks).toString("utf8")))
    }
    function onError(e: Error) {
      done()
      resume(Effect.fail(new BodyReadFailed({ reason: e.message })))
    }
    // 'close' without 'end': the client went away mid-body (node emits 'aborted' and an ECONNRESET 'error' only
    // to a request with an 'error' listener at that moment; 'close' always comes)
    function onClose() {
      if (source.readableEnded || source.complete) return
      done()
      resume(Effect.fail(new BodyReadFailed({ reason: "the client closed the connection before the body ended" })))
    }
    if (source.readableEnded) return resume(Effect.succeed(""))
    source.on("data", onData)
    source.on("end", onEnd)
    source.on("error", onError)
    source.on("close", onClose)
    return Effect.sync(done)
  }).pipe(
    Effect.timeoutOrElse({
      duration: timeoutMs,
      orElse: () => Effect.fail(new BodyReadFailed({ reason: `the body did not arrive whole within ${timeoutMs} ms` }))
    })
  )
}

/**
 * Runs `handler` on the body read by `readBody`; a body too large is `413` with the connection closed, a failed
 * read `400`, and neither runs the handler. Every admin route that takes a body goes through here.
 */
export const withBody =
  <E, R>(handler: (body: string) => Effect.Effect<HttpServerResponse.HttpServerResponse, E, R>) =>
  (request: HttpServerRequest.HttpServerRequest): Effect.Effect<HttpServerResponse.HttpServerResponse, E, R> =>
    readBody(request).pipe(
      Effect.matchEffect({
        onFailure: (e) =>
          Effect.succeed(
            e._tag === "BodyTooLarge"
              ? HttpServerResponse.jsonUnsafe(
                  { error: `request body over ${e.limit} bytes` },
                  { status: adminStatus[e._tag], headers: { connection: "close" } }
                )
              : // closed too: what is left of a body cut short is not read on
                HttpServerResponse.jsonUnsafe(
                  { error: `reading the request body failed: ${e.reason}` },
                  { status: adminStatus[e._tag], headers: { connection: "close" } }
                )
          ),
        onSuccess: handler
      })
    )
