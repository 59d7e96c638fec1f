/**
 * EngineClient: the agent's one HTTP client to the engine's OpenAI API and metrics.
 * An implementation provides one primitive, `streamTo` (an engine request into a sink), and the load read;
 * `complete` derives from it. The live client (layers/engine/EngineClient.ts) owns the wire:
 * keep-alive pool, SSE parsing, error-body normalization, the request fields `model` (the mlx rewrite),
 * `stream` and `stream_options`. Interrupting a call's fiber aborts its HTTP request, so the engine frees the slot.
 */
import { Context, Effect, Schema } from "effect"

/** The two OpenAI endpoints Generate uses. */
export type CompletionPath = "/v1/chat/completions" | "/v1/completions"

/** A JSON object as the engine sent it (one SSE chunk or a whole response). */
export type JsonObject = Readonly<Record<string, unknown>>

/** Whether a parsed JSON value is an object (not null, not an array). */
export const isJsonObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === "object" && v !== null && !Array.isArray(v)

export interface RequestOptions {
  /** Sent as X-Request-Id (vLLM and SGLang log it; P/D uses the same id on both legs). */
  readonly requestId?: string
  /** W3C trace context of the incoming call, passed on as the `traceparent` header. */
  readonly traceparent?: string
  /** The caller's `tracestate`, passed on with `traceparent` (only with it). */
  readonly tracestate?: string
  /** The data-parallel rank to run on, in the engine's header for it (Engine.capabilities.rankHeader); else ignored. */
  readonly dataParallelRank?: number
}

/** Normalized load, from the engine's own metric names; undefined where the engine has no such series. */
export interface LoadSignals {
  readonly running: number | undefined
  readonly waiting: number | undefined
  /** 0..1 */
  readonly kvUsage: number | undefined
  /** The progress counters present in the scrape (MetricNames.progress), each summed; absent: none asked for. */
  readonly progress?: Readonly<Record<string, number>>
  /**
   * Per data-parallel rank (MetricNames.rankLabel's value), one figure of its progress counters and KV-cache usage
   * together: it changes whenever one of them does. Absent: the engine names no rank.
   */
  readonly rankProgress?: Readonly<Record<string, number>>
}

/** Every engine failure in one shape, whatever the engine's error body looked like. */
export class EngineError extends Schema.TaggedError<EngineError>()("EngineError", {
  /**
   * Http: the engine answered with an error status (status is set).
   * Connect: no connection (refused, reset before a response, DNS).
   * Stream: the engine sent an error object mid-stream, or the stream broke off.
   * Timeout: no answer in time. Protocol: an answer that is not what the OpenAI API promises.
   * Local: the agent's own host could not open the connection (services/node/HostShortage.ts): not the engine's.
   */
  reason: Schema.Literals(["Http", "Connect", "Stream", "Timeout", "Protocol", "Local"]),
  message: Schema.String,
  /** HTTP status of the engine's answer (for Stream: the `code` of the error object when numeric). */
  status: Schema.optionalKey(Schema.Number),
  /** The engine's error type, e.g. `BadRequestError`, `invalid_request_error`. */
  engineType: Schema.optionalKey(Schema.String),
  /** The engine's error code when it is not the HTTP status. */
  engineCode: Schema.optionalKey(Schema.String),
  /**
   * "output": the engine could not make an answer of what the model generated for this request (its backend's
   * `capabilities.outputFaults`), whatever its status: a failure of this request's output, not of the engine.
   */
  fault: Schema.optionalKey(Schema.Literal("output"))
}) {}

/** Receives an exchange's objects on the network read that brought them (see `streamTo`). */
export interface ChunkSink {
  /** The objects of one read, in order, never empty. false pauses the engine read until `resume()`. */
  readonly onChunks: (chunks: ReadonlyArray<JsonObject>, resume: () => void) => boolean
  /** The request is written: the engine is working on it (work that can wait for the answer is done now). */
  readonly onSent?: () => void
}

/** How the engine answers: `stream: false` asks for one whole response object (default: an SSE stream). */
export interface ExchangeOptions extends RequestOptions {
  readonly stream?: boolean
}

/**
 * What an EngineClient implements (the live client over HTTP, the test doubles in src/testing): one primitive for
 * the OpenAI endpoints, and the load read. Whole answers (`complete`) derive from `streamTo` below, so every
 * caller, test doubles included, runs the same path.
 */
export interface EngineClientService {
  /**
   * POST `body` to `path` and hand the answer's objects to `sink` as each network read brings them:
   * every SSE `data:` object up to `[DONE]`, or with `stream: false` the one response object. Succeeds at
   * the end, fails with the normalized EngineError; interrupting aborts the request (the engine frees the
   * slot). The client owns the fields `model`, `stream` and `stream_options` (usage is always asked for on
   * a stream): `body` carries everything else.
   */
  readonly streamTo: (
    path: CompletionPath,
    body: JsonObject,
    options: ExchangeOptions | undefined,
    sink: ChunkSink
  ) => Effect.Effect<void, EngineError>
  /** Scrapes the engine's /metrics into load signals (all undefined when the engine has no metrics). */
  readonly load: Effect.Effect<LoadSignals, EngineError>
}

export class EngineClient extends Context.Service<EngineClient, EngineClientService>()("cgn-agent/EngineClient") {}

/** `streamTo` with `stream: false`: the whole response object (a prefill leg's answer). */
export const complete = (
  client: EngineClientService,
  path: CompletionPath,
  body: JsonObject,
  options?: RequestOptions
): Effect.Effect<JsonObject, EngineError> =>
  Effect.suspend(() => {
    let answer: JsonObject | undefined
    const sink: ChunkSink = {
      onChunks: (chunks) => {
        answer = chunks[chunks.length - 1]
        return true
      }
    }
    return Effect.flatMap(client.streamTo(path, body, { ...options, stream: false }, sink), () =>
      answer === undefined
        ? Effect.fail(new EngineError({ reason: "Protocol", message: "the engine answered without a response object" }))
        : Effect.succeed(answer)
    )
  }).pipe(Effect.withSpan("EngineClient.complete"))
