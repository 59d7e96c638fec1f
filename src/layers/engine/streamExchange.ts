/**
 * The undici dispatch handler of a streaming engine call: `StreamExchange` parses SSE inside undici's data
 * callback, decodes each event's JSON (services/engine/ChunkDecoder.ts: a token chunk by the one before it) and
 * hands each network read's objects to a sink (the relay's path). It aborts on close, so the engine sees the
 * disconnect; what the answer's status, content-type or body says becomes an EngineError here, the engine's words in it
 * scrubbed of the run's secrets by the client's redactor (EngineErrors.ts engineWords): on a failure alone, never
 * per chunk.
 */
import type { Dispatcher } from "undici"
import { ChunkDecoder } from "../../services/engine/ChunkDecoder.ts"
import { type ChunkSink, EngineError, isJsonObject, type JsonObject } from "../../services/engine/EngineClient.ts"
import {
  engineWords,
  errorDetailOfBody,
  httpError,
  isErrorChunk,
  sseErrorEvent,
  streamError
} from "../../services/engine/EngineErrors.ts"
import type { Redactor } from "../../services/engine/LineRedactor.ts"
import { makeSseParser, type SseEvent, SseEventTooLarge } from "../../services/engine/Sse.ts"
import { bodyText, closedByClient, MAX_ERROR_BODY_BYTES, transportError } from "./exchange.ts"

// After [DONE] the engine normally ends the body at once; keep the connection for reuse if it does.
const DRAIN_AFTER_DONE_MS = 1_000

/**
 * The largest SSE event (about bytes): a token chunk is a few hundred bytes, a usage or handoff chunk a few
 * KiB; an engine that never ends its line is stopped here instead of growing the agent's memory.
 */
export const MAX_SSE_EVENT_CHARS = 4 * 1024 * 1024

/** The media type of a Content-Type value, lower case ("text/event-stream"), or undefined when none was sent. */
const mediaType = (v: string | ReadonlyArray<string> | undefined): string | undefined => {
  const first = typeof v === "string" ? v : v?.[0]
  if (first === undefined) return undefined
  const semi = first.indexOf(";")
  return (semi === -1 ? first : first.slice(0, semi)).trim().toLowerCase()
}

/** The most of an answer that is no error body (SSE data that is not JSON, ...) a Protocol error quotes. */
export const QUOTED_CHARS = 200

export const protocolError = (message: string, data: string, redact: Redactor): EngineError =>
  new EngineError({ reason: "Protocol", message: `${message}: ${engineWords(data, QUOTED_CHARS, redact)}` })

/**
 * One streaming exchange: parses SSE in the undici callbacks and hands each read's objects to the sink.
 * `onEnd` is called once: with undefined at `[DONE]`, or with the error that ended the stream.
 */
export class StreamExchange implements Dispatcher.DispatchHandler {
  controller: Dispatcher.DispatchController | undefined = undefined
  status = 0
  sawDone = false
  private finished = false
  private ended = false
  private closed = false
  private discard = false
  /** The request was written whole: a failure from here on is the engine's answer breaking off (transportError). */
  private sent = false
  /** Set while the body after [DONE] is given its last moment to end; cleared when it does. */
  private drainTimer: NodeJS.Timeout | undefined = undefined
  /** The body of an error status, or of a 200 that is no event stream, read for its message (bounded). */
  private errorBody: Array<Buffer> | undefined = undefined
  private errorBytes = 0
  /** A 200 whose content-type is not text/event-stream: its media type. */
  private notSse: string | undefined = undefined
  private readonly parser = makeSseParser(MAX_SSE_EVENT_CHARS)
  private readonly decoder = new ChunkDecoder()
  private readonly sink: ChunkSink
  private readonly onEnd: (error: EngineError | undefined) => void
  /** The client's, built once from its plan: scrubs the engine's words in a failure. */
  private readonly redact: Redactor
  private readonly resume = (): void => {
    if (this.controller?.paused === true) this.controller.resume()
  }
  constructor(sink: ChunkSink, onEnd: (error: EngineError | undefined) => void, redact: Redactor) {
    this.sink = sink
    this.onEnd = onEnd
    this.redact = redact
  }

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.controller = controller
    if (this.closed) controller.abort(closedByClient())
  }
  onRequestSent(): void {
    this.sent = true
    this.sink.onSent?.()
  }
  onResponseStart(
    _c: Dispatcher.DispatchController,
    statusCode: number,
    headers?: Record<string, string | ReadonlyArray<string> | undefined>
  ): void {
    this.status = statusCode
    if (statusCode >= 400) {
      this.errorBody = []
      return
    }
    // An answer without a content-type is read as a stream (minimal servers send none); any other type is not one.
    const type = mediaType(headers?.["content-type"])
    if (type !== undefined && type !== "text/event-stream") {
      this.notSse = type
      this.errorBody = []
    }
  }
  onResponseData(controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (this.closed || this.discard) return
    if (this.errorBody !== undefined) {
      this.errorBody.push(chunk)
      this.errorBytes += chunk.length
      // Enough for its message: the rest of the body is not read (it may never end).
      if (this.errorBytes > MAX_ERROR_BODY_BYTES) {
        this.finish(this.bodyError())
        this.close(false)
      }
      return
    }
    let events: Array<SseEvent>
    try {
      events = this.parser.feed(chunk)
    } catch (e) {
      if (!(e instanceof SseEventTooLarge)) throw e
      this.finish(new EngineError({ reason: "Protocol", message: `${e.message}: no line end or event end in sight` }))
      this.close(false)
      return
    }
    if (!this.deliver(events, false)) controller.pause()
  }
  onResponseEnd(): void {
    this.ended = true
    clearTimeout(this.drainTimer)
    if (this.finished) return
    if (this.errorBody !== undefined) this.finish(this.bodyError())
    else this.deliver(this.parser.end(), true)
    if (!this.finished)
      this.finish(new EngineError({ reason: "Stream", message: "stream truncated: body ended without [DONE]" }))
  }
  /** The failure an error status's body, or a 200 that is no event stream, ends the exchange with. */
  private bodyError(): EngineError {
    const text = bodyText(this.errorBody ?? [])
    if (this.notSse === undefined) return httpError(this.status, text, this.redact)
    const words = text.trim() === "" ? "" : `: ${errorDetailOfBody(text, this.status, this.redact).message}`
    return new EngineError({
      reason: "Protocol",
      message: `HTTP ${this.status} with content-type "${this.notSse}", not an event stream${words}`
    })
  }
  onResponseError(_c: Dispatcher.DispatchController, error: Error): void {
    this.ended = true
    clearTimeout(this.drainTimer)
    if (this.finished) return
    const why = transportError(error, this.status > 0 || this.sent)
    this.finish(
      this.status === 0 || this.errorBody !== undefined
        ? why
        : new EngineError({ reason: "Stream", message: `stream truncated: ${why.message}` })
    )
  }

  /**
   * Parses and hands over one read's events; false when the sink asked for a pause. `atEnd`: the events the
   * parser completed at the body's end, whose last may be cut short (data that is not JSON there is a
   * truncated stream, not an engine speaking something else).
   */
  private deliver(events: ReadonlyArray<SseEvent>, atEnd: boolean): boolean {
    if (events.length === 0) return true
    const out: Array<JsonObject> = []
    let failure: EngineError | undefined
    for (let i = 0; i < events.length; i++) {
      const ev = events[i]!
      // An error event in any form ends the call as a failure, even if `data: [DONE]` follows (older llama.cpp).
      if (ev.error !== undefined || ev.event === "error") {
        failure = sseErrorEvent(ev.error ?? ev.data, this.redact)
        break
      }
      const data = ev.data
      if (data === "[DONE]") {
        this.sawDone = true
        break
      }
      let v: unknown
      try {
        v = this.decoder.decode(data)
      } catch {
        failure =
          atEnd && i === events.length - 1
            ? new EngineError({
                reason: "Stream",
                message: `stream truncated: body ended inside an event: ${engineWords(data, QUOTED_CHARS, this.redact)}`
              })
            : protocolError("SSE data is not JSON", data, this.redact)
        break
      }
      if (!isJsonObject(v)) {
        failure = protocolError("SSE data is not an object", data, this.redact)
        break
      }
      if (isErrorChunk(v)) {
        failure = streamError(v, this.redact)
        break
      }
      out.push(v)
    }
    // Objects before an error or [DONE] are delivered first, as the engine sent them. A sink that throws could
    // not read them: that ends the exchange INTERNAL with the reason, not as a stream the engine broke off.
    let more = true
    if (out.length > 0) {
      try {
        more = this.sink.onChunks(out, this.resume)
      } catch (e) {
        failure ??= new EngineError({
          reason: "Protocol",
          // the reader's words may quote the chunk
          message: `the engine's chunk could not be read: ${this.redact(e instanceof Error ? e.message : String(e))}`
        })
      }
    }
    if (failure !== undefined) {
      this.finish(failure)
      this.close(false)
    } else if (this.sawDone) {
      this.finish(undefined)
      this.close(true)
    }
    return more
  }
  private finish(error: EngineError | undefined): void {
    if (this.finished) return
    this.finished = true
    this.onEnd(error)
  }
  /** Aborts unless the body ended; `drain` lets a body that is about to end finish, so the socket is reused. */
  close(drain: boolean): void {
    if (this.closed || this.ended) return
    if (drain) {
      if (this.discard) return
      this.discard = true
      this.controller?.resume()
      this.drainTimer = setTimeout(() => this.close(false), DRAIN_AFTER_DONE_MS).unref()
      return
    }
    this.closed = true
    this.finished = true
    this.controller?.abort(closedByClient())
  }
}
