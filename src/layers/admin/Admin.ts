/**
 * Live AdminServer: the admin HTTP server on `[agent].listen_admin` (effect HttpRouter over node:http):
 * GET /metrics, /healthz, /readyz here, and a module per other route: /status (statusRoute.ts), POST /drain
 * (drainRoute.ts), /cordon and /uncordon (cordonRoutes.ts), /debug/cpu-profile (cpuProfile.ts), /gpus/clear-xids
 * (clearXidsRoute.ts), /engine/restart (engineRestartRoute.ts).
 * Which method each path takes, and the 405 for any other, is the one table in methods.ts.
 * Owns the server's lifecycle and the route table only; the decisions (loopback, token, readiness, forensics shape,
 * the cordon's reason) are pure in services/admin/Admin.ts and services/node/Cordon.ts, and every error's status in
 * services/admin/AdminAnswers.ts. /status and the POST levers sit behind the auth gate (authGate.ts):
 * `Authorization: Bearer <admin_token>` whenever a token is configured; off loopback a token is mandatory and the
 * server refuses to start without one. Bodies are read through body.ts (capped); on loopback, hostCheck.ts refuses
 * a Host that is not loopback (DNS rebinding).
 */
import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer" // not the index, which loads NodeRedis
import { Duration, Effect, Layer } from "effect"
import { HttpMiddleware, HttpRouter, HttpServer, HttpServerResponse } from "effect/http"
import {
  AdminListenError,
  AdminServer,
  AdminTokenRequired,
  readiness,
  type StatusExtras
} from "../../services/admin/Admin.ts"
import { Config } from "../../services/config/Config.ts"
import type { EngineProcess } from "../../services/engine/EngineProcess.ts"
import { isLoopbackHost, splitHostPort, unbracket } from "../../services/net/HostPort.ts"
import type { Cordon } from "../../services/node/Cordon.ts"
import { Drain } from "../../services/node/Drain.ts"
import { NodeStatus } from "../../services/node/NodeStatus.ts"
import type { Nvml } from "../../services/node/Nvml.ts"
import { Metrics } from "../../services/observability/Metrics.ts"
import { authGate } from "./authGate.ts"
import { clearXidsRoute } from "./clearXidsRoute.ts"
import { cordonRoutes } from "./cordonRoutes.ts"
import { cpuProfileRoute } from "./cpuProfile.ts"
import { drainRoute } from "./drainRoute.ts"
import { engineRestartRoute } from "./engineRestartRoute.ts"
import { loopbackHostCheck } from "./hostCheck.ts"
import { adminRoute, wrongMethodRoutes } from "./methods.ts"
import { statusRoute } from "./statusRoute.ts"

// node:http as its CommonJS exports, not an ESM import: the ESM facade reads every export, and node:http's
// WebSocket / MessageEvent / CloseEvent getters load Node's bundled copy of undici (behind fetch), ~14 MB of RSS
// and ~2.4 MB of heap that the agent never uses (test/programs/lazy-modules.test.ts).
const { createServer } = process.getBuiltinModule("node:http")

/**
 * On release, how long requests already received may take to be answered before every connection left is
 * dropped. Admin answers take milliseconds; what is left after this is a client stalled mid-request (headers
 * or body half sent, a half-open connection), which node:http's close would otherwise wait for until its
 * headersTimeout/requestTimeout (60 s to 5 min), holding the agent's exit after the drain.
 */
export const CLOSE_GRACE = Duration.seconds(1)

type NodeHttpServerInstance = ReturnType<typeof createServer>

/**
 * Stops accepting, closes idle keep-alive connections, waits up to CLOSE_GRACE for the rest to end, then
 * closes them all. Runs before NodeHttpServer's own close (which then finds the server closed).
 */
const closeOnRelease = (server: NodeHttpServerInstance) =>
  Layer.effectDiscard(
    Effect.addFinalizer(() =>
      Effect.callback<void>((resume) => {
        if (!server.listening) {
          // Closed already (its graceful wait, bounded by CLOSE_GRACE too, is over): drop what is left.
          server.closeAllConnections()
          return resume(Effect.void)
        }
        server.close(() => resume(Effect.void))
        server.closeIdleConnections()
      }).pipe(
        Effect.timeoutOrElse({ duration: CLOSE_GRACE, orElse: () => Effect.sync(() => server.closeAllConnections()) })
      )
    )
  )

export interface AdminOptions {
  /** Extra top-level sections of /status, e.g. `{ registration: reporter.status }`. */
  readonly extras?: StatusExtras
}

const routes = (options: AdminOptions, loopback: boolean) =>
  HttpRouter.addAll(
    Effect.gen(function* () {
      const config = yield* Config
      const metrics = yield* Metrics
      const status = yield* NodeStatus
      const drain = yield* Drain
      const guarded = authGate({ loopback, token: config.agent.admin_token })
      const draining = Effect.zipWith(status.draining, drain.draining, (a, b) => a || b)

      return [
        adminRoute(
          "/metrics",
          Effect.map(metrics.render, ({ body, contentType }) => HttpServerResponse.text(body, { contentType }))
        ),
        // Liveness answers from the event loop alone: a hung engine must not get the agent restarted.
        adminRoute(
          "/healthz",
          Effect.sync(() => HttpServerResponse.text("ok"))
        ),
        adminRoute(
          "/readyz",
          Effect.zipWith(status.snapshot, draining, (health, isDraining) => {
            const r = readiness(health, isDraining)
            return HttpServerResponse.text(r.reason, { status: r.ready ? 200 : 503 })
          })
        ),
        yield* statusRoute({ guarded, extras: options.extras }),
        ...wrongMethodRoutes(),
        yield* drainRoute({ guarded }),
        ...(yield* cordonRoutes({ guarded, draining })),
        yield* cpuProfileRoute({ guarded, nodeId: config.agent.node_id }),
        yield* clearXidsRoute({ guarded }),
        yield* engineRestartRoute({ guarded, draining })
      ] as const
    })
  )

/**
 * Whether listen_admin is loopback; fails with AdminTokenRequired when it is not and no token is set.
 * The server checks it before binding, and `check`/`run` (programs/check.ts preflight) before anything starts.
 */
export const requireAdminToken = (agent: {
  readonly listen_admin: string
  readonly admin_token?: string | undefined
}): Effect.Effect<boolean, AdminTokenRequired> => {
  const listen = agent.listen_admin
  const loopback = isLoopbackHost(splitHostPort(listen).host)
  return !loopback && agent.admin_token === undefined
    ? Effect.fail(new AdminTokenRequired({ listen }))
    : Effect.succeed(loopback)
}

/**
 * The admin server; fails with AdminTokenRequired before binding when it would be open to the network, and with
 * AdminListenError (naming the key and the system's reason) when it cannot listen.
 */
export const layer = (
  options: AdminOptions = {}
): Layer.Layer<
  AdminServer,
  AdminTokenRequired | AdminListenError,
  Config | Metrics | NodeStatus | EngineProcess | Drain | Cordon | Nvml
> =>
  Layer.unwrap(
    Effect.gen(function* () {
      const config = yield* Config
      const { host, port } = splitHostPort(config.agent.listen_admin)
      const loopback = yield* requireAdminToken(config.agent)
      const nodeServer = createServer()
      const server = NodeHttpServer.layer(() => nodeServer, {
        host: unbracket(host),
        port: Number(port),
        gracefulShutdownTimeout: CLOSE_GRACE
      })
      const info = Layer.effect(
        AdminServer,
        Effect.gen(function* () {
          const url = new URL(HttpServer.formatAddress((yield* HttpServer.HttpServer).address))
          // Listening now, and effect's NodeHttpServer has taken its own 'error' listener off (it listens only
          // for the listen's failure). An error the listening socket emits later (a failed accept: ENFILE,
          // ENOBUFS, EMFILE once libuv's reserve fd is gone) with no listener is thrown by Node and ends the
          // daemon; the socket itself goes on accepting (nodejs/node lib/net.js onconnection). Never removed.
          const run = Effect.runCallbackWith(yield* Effect.context<never>())
          nodeServer.on("error", (e) =>
            run(Effect.logError("admin HTTP listener error; still serving", { error: e.message }))
          )
          const bound = { host: unbracket(url.hostname), port: Number(url.port), url: url.origin }
          yield* Effect.logInfo("admin HTTP listening", {
            url: bound.url,
            auth: config.agent.admin_token === undefined ? "loopback only" : "bearer token"
          })
          return bound
        })
      )
      const served = Layer.merge(
        // on loopback, the Host check against DNS rebinding (hostCheck.ts) wraps every route
        HttpRouter.serve(
          loopback ? Layer.merge(routes(options, loopback), loopbackHostCheck) : routes(options, loopback),
          { disableLogger: true, disableListenLog: true }
        ).pipe(
          // Probes and scrapes every few seconds would be root spans named GET, drowning the real traces.
          Layer.provide(Layer.succeed(HttpMiddleware.TracerDisabledWhen)(() => true))
        ),
        info
      )
      // Built after the routes, so released before them and before the server's own close.
      return closeOnRelease(nodeServer).pipe(
        Layer.provideMerge(served),
        Layer.provide(server),
        // effect's ServeError carries the listen error only as its cause: its own message is empty.
        Layer.catchTag("ServeError", (e) =>
          Layer.effect(
            AdminServer,
            Effect.fail(
              new AdminListenError({
                listen: config.agent.listen_admin,
                reason: e.cause instanceof Error ? e.cause.message : String(e.cause)
              })
            )
          )
        )
      )
    })
  )
