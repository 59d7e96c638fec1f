/**
 * The admin server's auth gate: /status and the POST levers run only for an authorized request. The decision is pure
 * in services/admin/Admin.ts (`authorize`: the bearer token whenever one is configured, and on an open loopback
 * listener no request from a web page); this answers a refusal 401 with `WWW-Authenticate` (RFC 9110 §11.6.1) or 403,
 * the statuses from services/admin/AdminAnswers.ts.
 */
import { Effect } from "effect"
import { type HttpServerRequest, HttpServerResponse } from "effect/http"
import { authorize, fromWebPage } from "../../services/admin/Admin.ts"
import { adminStatus } from "../../services/admin/AdminAnswers.ts"
import { refuse } from "./answer.ts"

/** The admin server's auth gate: the handler runs only for an authorized request. */
export type Guard = (
  handler: Effect.Effect<HttpServerResponse.HttpServerResponse>
) => (request: HttpServerRequest.HttpServerRequest) => Effect.Effect<HttpServerResponse.HttpServerResponse>

const unauthorized = (tag: "TokenMissing" | "TokenWrong", why: string) =>
  HttpServerResponse.jsonUnsafe(
    { error: why },
    { status: adminStatus[tag], headers: { "www-authenticate": 'Bearer realm="cgn-agent admin"' } }
  )

/** The gate of an admin server listening on loopback or not, with `[agent].admin_token` or none. */
export const authGate =
  (options: { readonly loopback: boolean; readonly token: string | undefined }): Guard =>
  (handler) =>
  (request) => {
    const { authorization, origin } = request.headers
    const webPage = fromWebPage(origin, request.headers["sec-fetch-site"])
    switch (authorize({ loopback: options.loopback, token: options.token, header: authorization, webPage })) {
      case "missing":
        return Effect.succeed(unauthorized("TokenMissing", "missing bearer token"))
      case "wrong":
        return Effect.succeed(unauthorized("TokenWrong", "invalid bearer token"))
      case "browser":
        return Effect.succeed(
          refuse("FromWebPage", "refused: a request from a web page (Origin or Sec-Fetch-Site); use curl or the CLI")
        )
      case "open":
      case "allowed":
        return handler
    }
  }
