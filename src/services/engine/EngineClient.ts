/**
 * EngineClient: the agent's one HTTP client to the engine's OpenAI API, metrics and model list.
 * Owns the wire: keep-alive pool, SSE parsing, error-body normalization, the mlx `model` rewrite.
 * Interrupting a call's fiber aborts its HTTP request, so the engine frees the slot.
 */
import { Context, type Effect, Schema, type Stream } from "effect"

/** The two OpenAI endpoints Generate uses. */
export type CompletionPath = "/v1/chat/completions" | "/v1/completions"

/** A JSON object as the engine sent it (one SSE chunk or a whole response). */
export type JsonObject = Readonly<Record<string, unknown>>

export interface RequestOptions {
  /** Sent as X-Request-Id (vLLM and SGLang log it; P/D uses the same id on both legs). */
  readonly requestId?: string
  /** W3C trace context of the incoming call, passed on as the `traceparent` header. */
  readonly traceparent?: string
}

/** Normalized load, from the engine's own metric names; undefined where the engine has no such series. */
export interface LoadSignals {
  readonly running: number | undefined
  readonly waiting: number | undefined
  /** 0..1 */
  readonly kvUsage: number | undefined
}

/** Every engine failure in one shape, whatever the engine's error body looked like. */
export class EngineError extends Schema.TaggedError<EngineError>()("EngineError", {
  /**
   * Http: the engine answered with an error status (status is set).
   * Connect: no connection (refused, reset before a response, DNS).
   * Stream: the engine sent an error object mid-stream, or the stream broke off.
   * Timeout: no answer in time. Protocol: an answer that is not what the OpenAI API promises.
   */
  reason: Schema.Literals(["Http", "Connect", "Stream", "Timeout", "Protocol"]),
  message: Schema.String,
  /** HTTP status of the engine's answer (for Stream: the `code` of the error object when numeric). */
  status: Schema.optionalKey(Schema.Number),
  /** The engine's error type, e.g. `BadRequestError`, `invalid_request_error`. */
  engineType: Schema.optionalKey(Schema.String),
  /** The engine's error code when it is not the HTTP status. */
  engineCode: Schema.optionalKey(Schema.String)
}) {}

/** Receives a stream's objects on the network read that brought them (see `streamTo`). */
export interface ChunkSink {
  /** The objects of one read, in order, never empty. false pauses the engine read until `resume()`. */
  readonly onChunks: (chunks: ReadonlyArray<JsonObject>, resume: () => void) => boolean
}

export interface EngineClientService {
  /** POST with `stream: true`; each SSE `data:` JSON object in order, ending at `[DONE]`. */
  readonly stream: (
    path: CompletionPath,
    body: JsonObject,
    options?: RequestOptions
  ) => Stream.Stream<JsonObject, EngineError>
  /**
   * The same exchange as `stream` without a Stream pull per network read: `sink.onChunks` gets the objects
   * of each read as it is parsed. Succeeds at `[DONE]`, fails like `stream`; interrupting aborts the request.
   * Optional so scripted clients may omit it (callers fall back to `stream`).
   */
  readonly streamTo?: (
    path: CompletionPath,
    body: JsonObject,
    options: RequestOptions | undefined,
    sink: ChunkSink
  ) => Effect.Effect<void, EngineError>
  /** POST with `stream: false`; the whole response object. */
  readonly complete: (
    path: CompletionPath,
    body: JsonObject,
    options?: RequestOptions
  ) => Effect.Effect<JsonObject, EngineError>
  /** GET /v1/models: the served model ids. */
  readonly models: Effect.Effect<ReadonlyArray<string>, EngineError>
  /** Scrapes the engine's /metrics into load signals (all undefined when the engine has no metrics). */
  readonly load: Effect.Effect<LoadSignals, EngineError>
}

export class EngineClient extends Context.Service<EngineClient, EngineClientService>()("cgn-agent/EngineClient") {}
