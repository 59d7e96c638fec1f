/**
 * The live EngineClient: one undici Agent (keep-alive pool) to the engine, driven through `dispatch` with
 * handlers of our own. A stream's body bytes go straight from the socket into the SSE parser inside the
 * handler, and the parsed objects of each network read go to a sink at once (`streamTo`, the one primitive;
 * `complete` derives from it in services/engine/EngineClient.ts). Interrupting aborts the
 * exchange: the socket is destroyed and the engine sees the disconnect. Errors are normalized by EngineErrors, the
 * engine's words in them scrubbed of the run's secrets by one redactor built here from the plan.
 * How a request is dispatched and a whole answer read is engineHttp.ts's, which the supervisor's probe shares.
 */
import { Effect, Layer } from "effect"
import { Agent } from "undici"
import { EnginePlan, type LaunchPlan } from "../../services/engine/Engine.ts"
import {
  type ChunkSink,
  type CompletionPath,
  EngineClient,
  EngineError,
  type ExchangeOptions,
  isJsonObject,
  type JsonObject,
  type RequestOptions
} from "../../services/engine/EngineClient.ts"
import { engineWords, httpError, markOutputFault } from "../../services/engine/EngineErrors.ts"
import { loadSignals } from "../../services/engine/PromText.ts"
import { engineOfPlan } from "./backends/index.ts"
import { dispatchOptions, getText, keyHeader, planRedactor, readWhole } from "./engineHttp.ts"
import { QUOTED_CHARS, StreamExchange } from "./streamExchange.ts"

const STREAM_OPTIONS = Object.freeze({ include_usage: true })
const noop = (): void => undefined

// The whole-answer read, which ServedContext.ts also makes (on undici's global dispatcher), is engineHttp.ts's.
export { getText } from "./engineHttp.ts"

/** Tuning of the HTTP client; the defaults suit a local engine. */
export interface ClientOptions {
  /** TCP connect timeout (default 10 s). */
  readonly connectTimeoutMs?: number
  /**
   * Time to a stream's response headers; default none. llama-server sends them only once the request's first result
   * exists (tools/server/server-context.cpp, handle_completions_impl), so a request queued for a slot waits before
   * its headers, as long as the queue holds it: the stall watchdog (engine.stream_idle_timeout) bounds the wait for a
   * stream's first bytes, headers included, with every engine's.
   */
  readonly streamHeadersTimeoutMs?: number
  /** Whole-exchange bound for /metrics (default 10 s). */
  readonly controlTimeoutMs?: number
  /** Concurrent connections to the engine (default unbounded: one per in-flight stream). */
  readonly connections?: number
}

/** The client for one plan. The Agent lives as long as the enclosing scope. */
export const make = Effect.fnUntraced(function* (plan: LaunchPlan, options: ClientOptions = {}) {
  const agent = new Agent({
    connections: options.connections ?? null,
    connectTimeout: options.connectTimeoutMs ?? 10_000,
    pipelining: 1
  })
  yield* Effect.addFinalizer(() => Effect.promise(() => agent.destroy().catch(() => undefined)))
  const origin = new URL(plan.baseUrl).origin
  const controlTimeout = options.controlTimeoutMs ?? 10_000
  // how the server speaks: the plan's backend (its proxied kind's, for openai_compat naming one)
  const caps = engineOfPlan(plan).capabilities
  // `reset`: undici sends `connection: close` and never reuses the connection (an engine that closes it anyway)
  const streamReset = caps.closesStreamedConnections === true
  const streamHeadersTimeout = options.streamHeadersTimeoutMs ?? 0
  // The run's secrets and the key, scrubbed from the engine's words in a failure (engineHttp.ts planRedactor)
  const redact = planRedactor(plan)

  const rankHeader = caps.rankHeader
  const postHeaders = (accept: string, opts: RequestOptions | undefined): Record<string, string> => {
    const h: Record<string, string> = { "content-type": "application/json", accept, ...keyHeader(plan.authorization) }
    if (opts?.requestId !== undefined) h["x-request-id"] = opts.requestId
    if (opts?.traceparent !== undefined) {
      h.traceparent = opts.traceparent
      if (opts.tracestate !== undefined) h.tracestate = opts.tracestate
    }
    if (opts?.dataParallelRank !== undefined && rankHeader !== undefined) h[rankHeader] = String(opts.dataParallelRank)
    return h
  }

  // The fields this client owns. The agent's served name maps to what the engine expects (mlx would otherwise
  // load a new model); a stream always asks for usage (the final message reports it), and `stream_options`
  // exists only on a stream (vLLM refuses it with `stream: false`).
  const encode = (body: JsonObject, stream: boolean): string =>
    JSON.stringify(
      stream
        ? { ...body, model: plan.requestModel, stream, stream_options: STREAM_OPTIONS }
        : { ...body, model: plan.requestModel, stream }
    )

  const json = (status: number, text: string): Effect.Effect<JsonObject, EngineError> => {
    if (status >= 400) return Effect.fail(httpError(status, text, redact))
    try {
      const v: unknown = JSON.parse(text)
      if (isJsonObject(v)) return Effect.succeed(v)
    } catch {
      // reported below
    }
    return Effect.fail(
      new EngineError({
        reason: "Protocol",
        message: `expected a JSON object: ${engineWords(text, QUOTED_CHARS, redact)}`
      })
    )
  }

  // A whole answer: no header or body timeout, it comes when generation is done; the caller's deadline rules.
  const wholeTo = (
    path: CompletionPath,
    body: JsonObject,
    opts: RequestOptions | undefined,
    sink: ChunkSink
  ): Effect.Effect<void, EngineError> =>
    Effect.suspend(() => {
      const request = {
        origin,
        path,
        method: "POST",
        headers: postHeaders("application/json", opts),
        body: encode(body, false),
        headersTimeout: 0,
        bodyTimeout: 0
      } as const
      return Effect.flatMap(readWhole(agent, request, redact), (r) =>
        Effect.map(json(r.status, r.text), (answer) => {
          sink.onChunks([answer], noop)
        })
      )
    })

  // The parsed objects of each read go to the sink inside undici's callback: no Effect step per read.
  const sseTo = (
    path: CompletionPath,
    body: JsonObject,
    opts: RequestOptions | undefined,
    sink: ChunkSink
  ): Effect.Effect<void, EngineError> =>
    Effect.callback<void, EngineError>((resume) => {
      const ex = new StreamExchange(
        sink,
        (error) => resume(error === undefined ? Effect.void : Effect.fail(error)),
        redact
      )
      agent.dispatch(
        dispatchOptions({
          origin,
          path,
          method: "POST",
          headers: postHeaders("text/event-stream", opts),
          body: encode(body, true),
          headersTimeout: streamHeadersTimeout,
          bodyTimeout: 0,
          reset: streamReset
        }),
        ex
      )
      return Effect.sync(() => ex.close(ex.sawDone))
    })

  const exchangeTo = (
    path: CompletionPath,
    body: JsonObject,
    opts: ExchangeOptions | undefined,
    sink: ChunkSink
  ): Effect.Effect<void, EngineError> =>
    opts?.stream === false ? wholeTo(path, body, opts, sink) : sseTo(path, body, opts, sink)
  // an engine whose errors can say that one request's output failed, not the engine: marked so here, where the kind is
  const outputFaults = caps.outputFaults
  const streamTo: typeof exchangeTo =
    outputFaults === undefined
      ? exchangeTo
      : (path, body, opts, sink) =>
          Effect.mapError(exchangeTo(path, body, opts, sink), (e) => markOutputFault(e, outputFaults))

  const control = (url: string): Effect.Effect<string, EngineError> =>
    getText(agent, url, controlTimeout, plan.authorization, redact)

  const metrics = plan.metrics
  const load =
    metrics === undefined
      ? Effect.succeed({ running: undefined, waiting: undefined, kvUsage: undefined })
      : Effect.map(control(metrics.url), (text) => loadSignals(text, metrics.names)).pipe(
          Effect.withSpan("EngineClient.load")
        )

  return EngineClient.of({ streamTo, load })
})

/** The client for a given plan: the seam for tests and for callers that rendered the plan themselves. */
export const layerFromPlan = (plan: LaunchPlan, options?: ClientOptions): Layer.Layer<EngineClient> =>
  Layer.effect(EngineClient, make(plan, options))

/** The client for the configured engine. */
export const layer: Layer.Layer<EngineClient, never, EnginePlan> = Layer.effect(
  EngineClient,
  Effect.flatMap(EnginePlan, (plan) => make(plan))
)
