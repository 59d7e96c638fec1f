/**
 * The undici dispatch handlers behind the live EngineClient: `Exchange` buffers a whole answer for a pull
 * (a non-streamed completion, models, metrics), `StreamExchange` parses SSE inside undici's data callback, decodes
 * each event's JSON (services/engine/ChunkDecoder.ts: a token chunk by the one before it) and hands each network
 * read's objects to a sink (the relay's path). Both abort on close, so the engine sees
 * the disconnect; transport failures become EngineErrors here.
 */
import { Effect } from "effect"
import type { Dispatcher } from "undici"
import { ChunkDecoder } from "../../services/engine/ChunkDecoder.ts"
import { type ChunkSink, EngineError, type JsonObject } from "../../services/engine/EngineClient.ts"
import { httpError, isErrorChunk, sseErrorEvent, streamError } from "../../services/engine/EngineErrors.ts"
import { makeSseParser, type SseEvent } from "../../services/engine/Sse.ts"
// After [DONE] the engine normally ends the body at once; keep the connection for reuse if it does.
export const DRAIN_AFTER_DONE_MS = 1_000

export const closedByClient = () => new Error("request closed by the client")

/** One HTTP exchange; the undici handler and the state the pull reads. */
export class Exchange implements Dispatcher.DispatchHandler {
  controller: Dispatcher.DispatchController | undefined = undefined
  status = 0
  chunks: Array<Buffer> = []
  queued = 0
  ended = false
  error: Error | undefined = undefined
  /** The stream saw `data: [DONE]`: nothing the engine sends after it matters. */
  sawDone = false
  private closed = false
  private discard = false
  /** Set while a drained body is given its last moment to end; cleared when it does. */
  private drainTimer: NodeJS.Timeout | undefined = undefined
  /** Buffered bytes at which the socket is paused; Infinity for bodies that are read whole. */
  private readonly pauseAt: number
  constructor(pauseAt: number) {
    this.pauseAt = pauseAt
  }
  private waiter: (() => void) | undefined = undefined

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.controller = controller
    if (this.closed) controller.abort(closedByClient())
  }
  onResponseStart(_c: Dispatcher.DispatchController, statusCode: number): void {
    this.status = statusCode
    this.wake()
  }
  onResponseData(controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (this.closed || this.discard) return
    this.chunks.push(chunk)
    this.queued += chunk.length
    if (this.queued > this.pauseAt) controller.pause()
    this.wake()
  }
  onResponseEnd(): void {
    this.ended = true
    clearTimeout(this.drainTimer)
    this.wake()
  }
  onResponseError(_c: Dispatcher.DispatchController, error: Error): void {
    this.error = error
    clearTimeout(this.drainTimer)
    this.wake()
  }

  /** Everything buffered so far; resumes a paused socket. */
  take(): Array<Buffer> {
    const out = this.chunks
    this.chunks = []
    this.queued = 0
    if (this.controller?.paused === true) this.controller.resume()
    return out
  }
  private wake(): void {
    const w = this.waiter
    if (w !== undefined) {
      this.waiter = undefined
      w()
    }
  }
  /** Waits until something changed (headers, data, end, error). */
  readonly changed: Effect.Effect<void> = Effect.callback<void>((resume) => {
    this.waiter = () => resume(Effect.void)
    return Effect.sync(() => {
      this.waiter = undefined
    })
  })
  get settled(): boolean {
    return this.ended || this.error !== undefined
  }
  /** Aborts unless finished; `drain` lets a body that is about to end finish, so the socket is reused. */
  close(drain: boolean): void {
    if (this.closed || this.settled) return
    if (drain) {
      this.discard = true
      this.chunks = []
      this.controller?.resume()
      this.drainTimer = setTimeout(() => this.close(false), DRAIN_AFTER_DONE_MS).unref()
      return
    }
    this.closed = true
    this.chunks = []
    this.controller?.abort(closedByClient())
  }
}

export const protocolError = (message: string, data: string): EngineError =>
  new EngineError({ reason: "Protocol", message: `${message}: ${data.slice(0, 200)}` })

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
  /** Set while the body after [DONE] is given its last moment to end; cleared when it does. */
  private drainTimer: NodeJS.Timeout | undefined = undefined
  private errorBody: Array<Buffer> | undefined = undefined
  private readonly parser = makeSseParser()
  private readonly decoder = new ChunkDecoder()
  private readonly sink: ChunkSink
  private readonly onEnd: (error: EngineError | undefined) => void
  private readonly resume = (): void => {
    if (this.controller?.paused === true) this.controller.resume()
  }
  constructor(sink: ChunkSink, onEnd: (error: EngineError | undefined) => void) {
    this.sink = sink
    this.onEnd = onEnd
  }

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.controller = controller
    if (this.closed) controller.abort(closedByClient())
  }
  onRequestSent(): void {
    this.sink.onSent?.()
  }
  onResponseStart(_c: Dispatcher.DispatchController, statusCode: number): void {
    this.status = statusCode
    if (statusCode >= 400) this.errorBody = []
  }
  onResponseData(controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (this.closed || this.discard) return
    if (this.errorBody !== undefined) this.errorBody.push(chunk)
    else if (!this.deliver(this.parser.feed(chunk))) controller.pause()
  }
  onResponseEnd(): void {
    this.ended = true
    clearTimeout(this.drainTimer)
    if (this.finished) return
    if (this.errorBody !== undefined) this.finish(httpError(this.status, bodyText(this.errorBody)))
    else this.deliver(this.parser.end())
    if (!this.finished)
      this.finish(new EngineError({ reason: "Stream", message: "stream truncated: body ended without [DONE]" }))
  }
  onResponseError(_c: Dispatcher.DispatchController, error: Error): void {
    this.ended = true
    clearTimeout(this.drainTimer)
    if (this.finished) return
    const why = transportError(error, this.status > 0)
    this.finish(
      this.status === 0 || this.errorBody !== undefined
        ? why
        : new EngineError({ reason: "Stream", message: `stream truncated: ${why.message}` })
    )
  }

  /** Parses and hands over one read's events; false when the sink asked for a pause. */
  private deliver(events: ReadonlyArray<SseEvent>): boolean {
    if (events.length === 0) return true
    const out: Array<JsonObject> = []
    let failure: EngineError | undefined
    for (let i = 0; i < events.length; i++) {
      const ev = events[i]!
      // An error event in any form ends the call as a failure, even if `data: [DONE]` follows (older llama.cpp).
      if (ev.error !== undefined || ev.event === "error") {
        failure = sseErrorEvent(ev.error ?? ev.data)
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
        failure = protocolError("SSE data is not JSON", data)
        break
      }
      if (typeof v !== "object" || v === null || Array.isArray(v)) {
        failure = protocolError("SSE data is not an object", data)
        break
      }
      if (isErrorChunk(v as JsonObject)) {
        failure = streamError(v)
        break
      }
      out.push(v as JsonObject)
    }
    // Objects before an error or [DONE] are delivered first, as the engine sent them.
    const more = out.length === 0 || this.sink.onChunks(out, this.resume)
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

export const errorCode = (e: Error): string => {
  const c = (e as { code?: unknown }).code
  const cause = (e as { cause?: { code?: unknown } }).cause
  return typeof c === "string" ? c : typeof cause?.code === "string" ? cause.code : ""
}

/** A transport failure; `inBody` when the response had begun (then it is a broken stream, not a refusal). */
export const transportError = (e: Error, inBody: boolean): EngineError => {
  const code = errorCode(e)
  if (code.endsWith("TIMEOUT")) return new EngineError({ reason: "Timeout", message: `${code}: ${e.message}` })
  const message = `${code === "" ? "" : `${code}: `}${e.message}`
  return new EngineError({ reason: inBody ? "Stream" : "Connect", message })
}

export const bodyText = (chunks: ReadonlyArray<Buffer>): string =>
  chunks.length === 1 ? (chunks[0] as Buffer).toString("utf8") : Buffer.concat(chunks).toString("utf8")
