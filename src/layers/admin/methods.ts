/**
 * The admin server's one method table: each path and the one method that serves it. Every route is declared
 * through `adminRoute`, which takes its method from here, and `wrongMethodRoutes` answers each other common
 * method on a known path `405` with `Allow` (RFC 9110 §15.5.6; `OPTIONS` `204` with it) and a short body saying what the path takes, so a
 * `POST /healthz` or a `GET /drain` is told so rather than given the `404` of an unknown path. Only POST pulls a
 * lever (a crawler or a misdirected probe must not). These answers precede the auth gate: they do nothing and
 * tell nothing beyond the method. `HEAD` is effect's router falling back to the `GET` route
 * (effect/src/http/HttpRouter.ts `asHttpEffect`), so a GET path serves it and a POST path answers it `405`.
 */
import { Effect } from "effect"
import { HttpRouter, type HttpServerRequest, HttpServerResponse } from "effect/http"
import { adminStatus } from "../../services/admin/AdminAnswers.ts"
import { CLEAR_XIDS_PATH } from "../../services/admin/ClearXids.ts"
import { CPU_PROFILE_PATH } from "../../services/admin/CpuProfile.ts"
import { ENGINE_RESTART_PATH } from "../../services/admin/EngineRestart.ts"

export const ADMIN_METHODS = {
  "/metrics": "GET",
  "/healthz": "GET",
  "/readyz": "GET",
  "/status": "GET",
  "/drain": "POST",
  "/cordon": "POST",
  "/uncordon": "POST",
  [CLEAR_XIDS_PATH]: "POST",
  [ENGINE_RESTART_PATH]: "POST",
  [CPU_PROFILE_PATH]: "POST"
} as const

export type AdminPath = keyof typeof ADMIN_METHODS

/** The methods a wrong-method request is answered for; exotic ones stay the router's 404. */
const ANSWERED = ["GET", "POST", "PUT", "PATCH", "DELETE"] as const

/** What `Allow` names for a path: its method, HEAD with GET (the router's fallback), and OPTIONS. */
const allowOf = (method: "GET" | "POST"): string => (method === "GET" ? "GET, HEAD, OPTIONS" : "POST, OPTIONS")

/** The route serving `path`, with the method the table gives it. */
export const adminRoute = <E = never, R = never>(
  path: AdminPath,
  handler:
    | Effect.Effect<HttpServerResponse.HttpServerResponse, E, R>
    | ((request: HttpServerRequest.HttpServerRequest) => Effect.Effect<HttpServerResponse.HttpServerResponse, E, R>)
) => HttpRouter.route(ADMIN_METHODS[path], path, handler)

/**
 * `405` with `Allow` for every answered method a known path does not serve, and `OPTIONS` answered `204` with
 * `Allow` (RFC 9110 §9.3.7). No CORS headers: a web page's preflight gets no permission from it.
 */
export const wrongMethodRoutes = () =>
  (Object.entries(ADMIN_METHODS) as Array<[AdminPath, (typeof ADMIN_METHODS)[AdminPath]]>).flatMap(
    ([path, allowed]) => [
      HttpRouter.route(
        "OPTIONS",
        path,
        Effect.succeed(HttpServerResponse.empty({ status: 204, headers: { allow: allowOf(allowed) } }))
      ),
      ...ANSWERED.filter((method) => method !== allowed).map((method) =>
        HttpRouter.route(
          method,
          path,
          Effect.succeed(
            HttpServerResponse.jsonUnsafe(
              { error: `use ${allowed} ${path}` },
              { status: adminStatus.WrongMethod, headers: { allow: allowOf(allowed) } }
            )
          )
        )
      )
    ]
  )
