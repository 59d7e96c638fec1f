/**
 * A scripted in-memory EngineClient for tests of its callers (the gRPC relay, NodeStatus, embedders):
 * it implements only the transport primitive (`streamTo`), so `complete` and the relay run the production
 * path; `streamOf` reads a client's stream as an Effect Stream, for tests of the client itself. Every request answers from the script and is recorded (the body as the caller gave it:
 * the live client adds `model`, `stream` and `stream_options` on the wire).
 * Nothing listens anywhere; for wire-level tests use the live client against the simulator.
 */
import { type Array as Arr, Cause, Channel, Context, Effect, Layer, Ref, Stream } from "effect"
import {
  type ChunkSink,
  type CompletionPath,
  EngineClient,
  type EngineClientService,
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
  /** The objects of a streamed request, one per read, and the error to end it with after them. */
  readonly chunks?: ReadonlyArray<JsonObject>
  readonly streamError?: EngineError
  /** The response object of a whole (`stream: false`) request, or its error. */
  readonly completion?: JsonObject | EngineError
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

/**
 * The scripted transport: a streamed request gets `chunks` one per read, honouring the sink's pause, then
 * `streamError` or the end; a whole one (`stream: false`) gets `completion` as its one object, or its error.
 */
const scriptedStreamTo =
  (script: EngineScript, record: (r: RecordedRequest) => Effect.Effect<void>): EngineClientService["streamTo"] =>
  (path, body, options, sink) => {
    const whole = options?.stream === false
    const { stream: _mode, ...requestOptions } = options ?? {}
    const recorded = record({
      kind: whole ? "complete" : "stream",
      path,
      body,
      options: options === undefined ? undefined : requestOptions
    })
    if (whole) {
      const completion = script.completion ?? { object: "text_completion", choices: [textChunk("", "stop")] }
      return Effect.andThen(recorded, () =>
        isEngineError(completion)
          ? Effect.fail(completion)
          : Effect.sync(() => {
              sink.onChunks([completion], () => undefined)
            })
      )
    }
    const chunks = script.chunks ?? [textChunk("ok", "stop")]
    const read = (i: number): Effect.Effect<void, EngineError> => {
      if (i === chunks.length) return script.streamError === undefined ? Effect.void : Effect.fail(script.streamError)
      return Effect.suspend(() => {
        let resumed: (() => void) | undefined
        let early = false
        const more = sink.onChunks([chunks[i]!], () => {
          if (resumed === undefined) early = true
          else resumed()
        })
        if (more) return read(i + 1)
        // The sink may resume before this fiber waits (the fiber can yield in between).
        return Effect.andThen(
          Effect.callback<void>((resume) => {
            if (early) resume(Effect.void)
            else resumed = () => resume(Effect.void)
          }),
          read(i + 1)
        )
      })
    }
    return Effect.andThen(recorded, read(0))
  }

const isEngineError = (v: JsonObject | EngineError): v is EngineError => "_tag" in v && v._tag === "EngineError"

export const layerTest = (script: EngineScript = {}): Layer.Layer<EngineClient | EngineClientRecorder> =>
  Layer.effectContext(
    Effect.gen(function* () {
      const requests = yield* Ref.make<ReadonlyArray<RecordedRequest>>([])
      const record = (r: RecordedRequest) => Ref.update(requests, (all) => [...all, r])
      const client = EngineClient.of({
        streamTo: scriptedStreamTo(script, record),
        load: Effect.succeed(script.load ?? { running: undefined, waiting: undefined, kvUsage: undefined })
      })
      return Context.make(EngineClient, client).pipe(
        Context.add(EngineClientRecorder, EngineClientRecorder.of({ requests: Ref.get(requests) }))
      )
    })
  )

// Parsed objects `streamOf` buffers before the engine read is paused: the consumer is slower than the engine.
export const HIGH_WATER_OBJECTS = 1024

/**
 * A client's `streamTo` behind a Stream pull: each SSE object in order, ending at `[DONE]`. The sink buffers what
 * the reads bring; the pull takes all of it at once and resumes a paused read. The daemon relays through a sink
 * (layers/grpc/Relay.ts); this is how tests and the client bench read a stream with Stream's operators (take,
 * interruption, a slow consumer).
 */
export const streamOf =
  (client: EngineClientService) =>
  (path: CompletionPath, body: JsonObject, options?: RequestOptions): Stream.Stream<JsonObject, EngineError> =>
    Stream.fromChannel(
      Channel.fromTransform((_upstream, scope) =>
        Effect.gen(function* () {
          let buffered: Array<JsonObject> = []
          let resumeRead: (() => void) | undefined
          // undefined while running, null at the end, else the failure.
          let end: EngineError | null | undefined
          let waiter: (() => void) | undefined
          const wake = (): void => {
            const w = waiter
            waiter = undefined
            w?.()
          }
          const sink: ChunkSink = {
            onChunks: (chunks, resume) => {
              for (let i = 0; i < chunks.length; i++) buffered.push(chunks[i]!)
              wake()
              if (buffered.length < HIGH_WATER_OBJECTS) return true
              resumeRead = resume
              return false
            }
          }
          yield* client.streamTo(path, body, options, sink).pipe(
            Effect.exit,
            Effect.flatMap((exit) =>
              Effect.sync(() => {
                end = exit._tag === "Success" ? null : (Cause.squash(exit.cause) as EngineError)
                wake()
              })
            ),
            Effect.forkIn(scope)
          )
          const changed = Effect.callback<void>((resume) => {
            waiter = () => resume(Effect.void)
            return Effect.sync(() => {
              waiter = undefined
            })
          })
          return Effect.suspend(function loop(): Effect.Effect<
            Arr.NonEmptyReadonlyArray<JsonObject>,
            EngineError | Cause.Done
          > {
            if (buffered.length > 0) {
              const out = buffered
              buffered = []
              const r = resumeRead
              resumeRead = undefined
              r?.()
              return Effect.succeed(out as unknown as Arr.NonEmptyReadonlyArray<JsonObject>)
            }
            if (end === null) return Cause.done()
            if (end !== undefined) return Effect.fail(end)
            return Effect.flatMap(changed, loop)
          })
        })
      )
    )
