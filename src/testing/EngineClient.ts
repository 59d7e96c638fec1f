/**
 * A scripted in-memory EngineClient for tests of its callers (the gRPC relay, NodeStatus, embedders):
 * every call answers from the script and is recorded, so a test can assert what would have been sent.
 * Nothing listens anywhere; for wire-level tests use the live client against the simulator.
 */
import { Context, Effect, Layer, Ref, Stream } from "effect"
import {
  type CompletionPath,
  EngineClient,
  type EngineError,
  type JsonObject,
  type LoadSignals,
  type RequestOptions
} from "../services/engine/EngineClient.ts"

/** One request the client received. */
export interface RecordedRequest {
  readonly kind: "stream" | "complete"
  readonly path: CompletionPath
  readonly body: JsonObject
  readonly options: RequestOptions | undefined
}

/** What the scripted engine answers; every field has a harmless default. */
export interface EngineScript {
  /** SSE chunks for `stream`, or the error to end it with after them. */
  readonly chunks?: ReadonlyArray<JsonObject>
  readonly streamError?: EngineError
  /** The response object of `complete`, or its error. */
  readonly completion?: JsonObject | EngineError
  readonly models?: ReadonlyArray<string>
  readonly load?: LoadSignals
}

export class EngineClientRecorder extends Context.Service<
  EngineClientRecorder,
  { readonly requests: Effect.Effect<ReadonlyArray<RecordedRequest>> }
>()("cgn-agent/EngineClientRecorder") {}

/** A completion chunk carrying `text`, as vLLM streams them. */
export const textChunk = (text: string, finishReason: string | null = null): JsonObject => ({
  object: "text_completion",
  choices: [{ index: 0, text, finish_reason: finishReason }]
})

export const layerTest = (script: EngineScript = {}): Layer.Layer<EngineClient | EngineClientRecorder> =>
  Layer.effectContext(
    Effect.gen(function* () {
      const requests = yield* Ref.make<ReadonlyArray<RecordedRequest>>([])
      const record = (r: RecordedRequest) => Ref.update(requests, (all) => [...all, r])
      const completion = script.completion ?? { object: "text_completion", choices: [textChunk("", "stop")] }
      const client = EngineClient.of({
        stream: (path, body, options) =>
          Stream.unwrap(
            Effect.as(
              record({ kind: "stream", path, body, options }),
              Stream.concat(
                Stream.fromIterable(script.chunks ?? [textChunk("ok", "stop")]),
                script.streamError === undefined ? Stream.empty : Stream.fail(script.streamError)
              )
            )
          ),
        complete: (path, body, options) =>
          Effect.andThen(record({ kind: "complete", path, body, options }), () =>
            "_tag" in completion && completion._tag === "EngineError"
              ? Effect.fail(completion as EngineError)
              : Effect.succeed(completion as JsonObject)
          ),
        models: Effect.succeed(script.models ?? ["m"]),
        load: Effect.succeed(script.load ?? { running: undefined, waiting: undefined, kvUsage: undefined })
      })
      return Context.make(EngineClient, client).pipe(
        Context.add(EngineClientRecorder, EngineClientRecorder.of({ requests: Ref.get(requests) }))
      )
    })
  )
