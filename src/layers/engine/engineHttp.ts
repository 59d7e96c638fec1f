/**
 * The engines' HTTP wire on the agent's side, one copy for every caller in layers/engine: how a request is handed to
 * undici (`dispatchOptions`), and how a whole answer is read (`sendWhole`: the body bounded by exchange.ts's
 * `Exchange`, a transport failure read by its `errorCode`). The callers: the EngineClient (EngineClient.ts: a
 * non-streamed completion, /metrics; a stream's answer is streamExchange.ts's, dispatched with the same options),
 * ServedContext.ts's model list (`getText`), and the supervisor's readiness/liveness probe (probe.ts), with what an
 * engine's 401/403 says of engine.api_key (`keyRefusal`). Plain functions over a dispatcher the caller brings: the
 * probe runs before any EngineClient exists and must not wait behind its stream connections, so it brings undici's
 * global dispatcher, never the client's Agent, and the supervisor needs nothing of the EngineClient service.
 */
import { Effect } from "effect"
import type { Dispatcher } from "undici"
import type { LaunchPlan, ProbeKey } from "../../services/engine/Engine.ts"
import { EngineError } from "../../services/engine/EngineClient.ts"
import { engineEnvironment } from "../../services/engine/EngineEnvironment.ts"
import { httpError } from "../../services/engine/EngineErrors.ts"
import { lineRedactor, type Redactor } from "../../services/engine/LineRedactor.ts"
import { secretValues } from "../../services/engine/Secrets.ts"
import {
  type BodyBound,
  bodyText,
  Exchange,
  MAX_ERROR_BODY_BYTES,
  MAX_WHOLE_BODY_BYTES,
  transportError
} from "./exchange.ts"

/** One request to the engine. */
export interface EngineRequest {
  readonly origin: string
  /** The path with its query. */
  readonly path: string
  readonly method: "GET" | "POST"
  readonly headers: Record<string, string>
  readonly body: string | null
  /** undici's bounds, in ms, on the wait for the headers and on each gap in the body; 0: none; absent: the dispatcher's. */
  readonly headersTimeout?: number
  readonly bodyTimeout?: number
  /** undici sends `connection: close` and never reuses the connection (an engine that closes it anyway). */
  readonly reset?: boolean
}

/** A url's origin and path with its query, as undici's dispatch takes them; throws on a url that is none. */
export const target = (url: string): { readonly origin: string; readonly path: string } => {
  const u = new URL(url)
  return { origin: u.origin, path: `${u.pathname}${u.search}` }
}

/** The Authorization header of a request that carries the engine's key (`Bearer <engine.api_key>`), if any. */
export const keyHeader = (authorization: string | undefined): Record<string, string> =>
  authorization === undefined ? {} : { authorization }

/**
 * The request as undici's dispatch takes it. Not `blocking`: on one request per connection (pipelining 1, the client's
 * Agent's and undici's default) nothing could wait behind the answer on its connection anyway.
 */
export const dispatchOptions = (r: EngineRequest): Dispatcher.DispatchOptions => ({
  origin: r.origin,
  path: r.path,
  method: r.method,
  headers: r.headers,
  body: r.body,
  blocking: false,
  ...(r.headersTimeout === undefined ? {} : { headersTimeout: r.headersTimeout }),
  ...(r.bodyTimeout === undefined ? {} : { bodyTimeout: r.bodyTimeout }),
  ...(r.reset === undefined ? {} : { reset: r.reset })
})

/** A whole answer: its status and its body's text; `cut` when the body passed its bound (the text is what came before). */
export interface Answer {
  readonly status: number
  readonly text: string
  readonly cut: boolean
}

/**
 * An exchange that failed in transport: undici's error and how far it got (`status` 0: no answer began; `sent`: the
 * request was written whole).
 */
export interface TransportFailure {
  readonly error: Error
  readonly status: number
  readonly sent: boolean
}

/**
 * Sends `request` on `dispatcher` and reads the whole answer, its body bounded by `bound` (by default the client's:
 * MAX_WHOLE_BODY_BYTES, MAX_ERROR_BODY_BYTES for an error status). Interrupting aborts the exchange.
 */
export const sendWhole = (
  dispatcher: Dispatcher,
  request: EngineRequest,
  bound?: BodyBound
): Effect.Effect<Answer, TransportFailure> =>
  Effect.suspend(() => {
    const ex = new Exchange(bound)
    dispatcher.dispatch(dispatchOptions(request), ex)
    return Effect.suspend(function loop(): Effect.Effect<Answer, TransportFailure> {
      if (ex.overflowed) return Effect.succeed({ status: ex.status, text: bodyText(ex.take()), cut: true })
      if (ex.error !== undefined) return Effect.fail({ error: ex.error, status: ex.status, sent: ex.sent })
      if (ex.ended) return Effect.succeed({ status: ex.status, text: bodyText(ex.take()), cut: false })
      return Effect.flatMap(ex.changed, loop)
    }).pipe(Effect.onInterrupt(() => Effect.sync(() => ex.close())))
  })

/** A whole answer past its bound: an error status with the part of its body read, else a Protocol error. */
const overflowError = (a: Answer, redact: Redactor): EngineError =>
  a.status >= 400
    ? httpError(a.status, a.text, redact)
    : new EngineError({
        reason: "Protocol",
        message: `the answer is larger than ${MAX_WHOLE_BODY_BYTES} bytes (an error body: ${MAX_ERROR_BODY_BYTES})`
      })

/**
 * `sendWhole` as the EngineClient reads it: a transport failure or an answer past its bound is an EngineError, the
 * engine's words in it scrubbed by `redact` (EngineErrors.ts engineWords).
 */
export const readWhole = (
  dispatcher: Dispatcher,
  request: EngineRequest,
  redact: Redactor
): Effect.Effect<{ status: number; text: string }, EngineError> =>
  sendWhole(dispatcher, request).pipe(
    Effect.mapError((f) => transportError(f.error, f.status > 0 || f.sent)),
    Effect.flatMap((a) =>
      a.cut ? Effect.fail(overflowError(a, redact)) : Effect.succeed({ status: a.status, text: a.text })
    )
  )

/**
 * What scrubs the engine's words in a failure of a plan's requests: the run's secrets (its environment and arguments,
 * layers/engine/run.ts) and the key the agent sends. An engine may echo them in an error ("Incorrect API key provided:
 * <key>"), which the agent passes on to callers, /readyz, NodeHealth and its logs. Built once per holder of the plan
 * (the EngineClient, ServedContext); used on a failure alone, never per chunk.
 */
export const planRedactor = (plan: Pick<LaunchPlan, "env" | "argv" | "authorization">): Redactor =>
  lineRedactor(secretValues(engineEnvironment(process.env, plan.env), plan.argv, plan.authorization))

/**
 * GET `url` on `dispatcher` and read the whole answer, each of headers and body bounded by `timeoutMs`; an error status
 * fails as the engine's error. The client's /metrics read, and what else the agent reads of the engine whole
 * (ServedContext.ts: its model list). `authorization`: the plan's, for a url on the engine's origin. `redact`: the
 * plan's (planRedactor).
 */
export const getText = (
  dispatcher: Dispatcher,
  url: string,
  timeoutMs: number,
  authorization: string | undefined,
  redact: Redactor
): Effect.Effect<string, EngineError> =>
  Effect.suspend(() => {
    const scrub = redact
    return readWhole(
      dispatcher,
      {
        ...target(url),
        method: "GET",
        headers: keyHeader(authorization),
        body: null,
        headersTimeout: timeoutMs,
        bodyTimeout: timeoutMs
      },
      scrub
    ).pipe(
      Effect.flatMap((r) =>
        r.status >= 400 ? Effect.fail(httpError(r.status, r.text, scrub)) : Effect.succeed(r.text)
      )
    )
  })

/**
 * What an engine's 401 or 403 says of engine.api_key, in the config's words; undefined for any other status. `key`:
 * what the request carried (services/engine/Engine.ts ProbeKey): without it, an engine that wants a key would read as
 * one still loading for ever. The calls' 401/403 keep the engine's own words (EngineErrors.httpError) and are judged
 * in services/grpc/GrpcStatus.ts engineFailedCall.
 */
export const keyRefusal = (status: number, key: ProbeKey): string | undefined => {
  if (status !== 401 && status !== 403) return undefined
  const why =
    key.authorization !== undefined
      ? "refuses engine.api_key"
      : key.keyWithheld === true
        ? "asks for an API key, and engine.api_key goes to engine.url's origin alone: give agent.ready_probe_url its scheme, host and port"
        : "asks for an API key: set engine.api_key"
  return `HTTP ${status}: the engine ${why}`
}
