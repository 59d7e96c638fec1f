/**
 * Relay: one Generate call's hand-off between the engine side (the producer: EngineClient.streamTo's
 * sink, called once per network read) and the gRPC side (the consumer: a callback that writes to the call).
 * Text is coalesced while the caller reads slower than tokens arrive; when the pending text is full the
 * producer is paused (the engine socket stops being read), so memory per stream stays bounded.
 * Plain callbacks, no Effect step or promise per token: the consumer runs inside the producer's read
 * callback, so a token read from the engine is written to the gRPC call in the same event-loop turn.
 */
import { Cause, Exit, Option } from "effect"
import type { ChunkSink, JsonObject } from "../../services/engine/EngineClient.ts"
import { AgentDefect, type ClientNotReading } from "../../services/grpc/CallErrors.ts"
import { ChunkReader, Coalescer } from "../../services/grpc/ChunkReader.ts"
import type { GenerateError } from "../../services/grpc/GrpcStatus.ts"

/** One Generate call's hand-off between the engine fiber (producer) and the gRPC call (consumer). */
export class Relay implements ChunkSink {
  readonly coalescer: Coalescer
  readonly reader: ChunkReader
  /**
   * When the first text came, in performance.now() ms (0: none yet), as the call's other timings (GenerateCall.ts:
   * ttft, total); not on Effect's Clock as `slotAt` is, so never subtract one from the other.
   */
  firstTextAt = 0
  /** Any engine chunk seen (a decode leg's deadline ends there). */
  started = false
  /** Admission's record of the call, written once by `admit` (EngineLegs.ts), read at the call's end. */
  queueMs = 0
  /** Past admission (or none configured): the engine request can have been made. */
  admitted = false
  /**
   * A decode leg, its engine reading the KV its prefill leg left on another node (EngineLegs.ts): a failure before its
   * first text may be that handoff's, not this engine's (ActiveCalls.handoffFailed). The prefill node, `host:port`
   * (Handoff.ts handoffPeer; "" where the body names none).
   */
  readsHandoff = false
  handoffPeer = ""
  /**
   * When this prefill leg got the engine's kv_transfer_params (Clock ms; 0: none): the engine holds the leg's KV for
   * its decode leg past the leg's end (ActiveCalls.lastHandoffAt).
   */
  handedOffAt = 0
  /**
   * Told once, at the first engine chunk: EngineLegs measures there what a call needs from its slot (ServiceTimes).
   * One function for every call, reading the relay: no closure or wrapper sink per call on the relay path.
   */
  onFirstChunk: ((relay: Relay) => void) | undefined = undefined
  /** When the call got its admission slot (Clock ms), for `onFirstChunk`. */
  slotAt = 0
  /** Network reads so far; the stall watchdog compares it on a coarse interval (no timer per read). */
  reads = 0
  /**
   * The call's writes wait for the caller's flow control (its buffer full, no 'drain' since): `hold` and `release`,
   * by the call (GenerateCall.ts); `holds` counts such waits. The watchdog ends a call held for
   * agent.client_send_timeout (one wait, `holds` unchanged).
   */
  held = false
  holds = 0
  /**
   * The stall watchdog's bookkeeping (StallWatchdog.ts alone reads and writes it, once `streamRequested` started it):
   * whether the engine stream is requested and still watched, since when (Clock ms), `reads` and `holds` when it last
   * looked and since when each has not moved.
   */
  readonly watch = { streaming: false, since: 0, seenReads: 0, idleSince: 0, seenHolds: 0, heldSince: 0 }
  /** The call's request id, for the watchdog's log line. */
  requestId = ""
  done = false
  /** The engine stream ended as the engine ends one (not failed, not cancelled): the engine is not wedged. */
  completed = false
  /** Why the call ends, once it is known (undefined: it ends OK, or the caller cancelled). */
  failure: GenerateError | undefined = undefined
  /** Called once the engine request is written (the call sends its response headers then). */
  onSent: () => void = () => undefined
  /** Called after every read and at the end; it drains `take` as far as the call can be written. */
  consumer: () => void = () => undefined
  private resumeProducer: (() => void) | undefined = undefined
  constructor(maxPendingChars: number, stopSequenceField?: string) {
    this.coalescer = new Coalescer(maxPendingChars)
    this.reader = new ChunkReader(stopSequenceField)
  }
  /** Producer side, once per network read: false when the producer must wait for room. */
  readonly onChunks = (chunks: ReadonlyArray<JsonObject>, resume: () => void): boolean => {
    if (!this.started) {
      this.started = true
      this.onFirstChunk?.(this)
    }
    this.reads++
    for (let i = 0; i < chunks.length; i++) {
      const text = this.reader.read(chunks[i]!)
      if (text !== "") {
        if (this.firstTextAt === 0) this.firstTextAt = performance.now()
        this.coalescer.push(text)
      }
    }
    this.wake()
    if (this.coalescer.hasRoom) return true
    this.resumeProducer = resume
    return false
  }
  take(): { readonly text: string; readonly tokens: number } | undefined {
    const d = this.coalescer.take()
    const r = this.resumeProducer
    if (d !== undefined && r !== undefined) {
      this.resumeProducer = undefined
      r()
    }
    return d
  }
  /** The engine stream is requested (after admission): only from now can the engine stall it. */
  streamRequested(now: number): void {
    const w = this.watch
    w.streaming = true
    w.since = now
    w.idleSince = now
    w.seenReads = this.reads
  }
  /** Past admission: with a slot (queued that long, taken at `at`, told `measure` at the first chunk), or none configured. */
  admit(slot?: { readonly queuedMs: number; readonly at: number }, measure?: (relay: Relay) => void): void {
    this.admitted = true
    if (slot === undefined) return
    this.queueMs = slot.queuedMs
    this.slotAt = slot.at
    this.onFirstChunk = measure
  }
  /** The call's writes wait for the caller's flow control. */
  hold(): void {
    this.held = true
    this.holds++
  }
  /** The caller read: the call's writes go on. */
  release(): void {
    this.held = false
  }
  /** True while the producer waits for the caller to take text: the engine is idle because we paused it. */
  get paused(): boolean {
    return this.resumeProducer !== undefined
  }
  /** Interrupts the producer fiber (set once it is forked). */
  interrupt: () => void = () => undefined
  /**
   * Ends the call with `failure` whatever the engine does next. The first reason stays: a call the drain or the stall
   * watchdog ended keeps its words when the engine run's end (EngineCut.ts cutOnRunEnd) reaches it after them.
   */
  abort(failure: GenerateError): void {
    if (this.done || this.failure !== undefined) return
    this.failure = failure
    this.interrupt()
  }
  /**
   * Ends a call its caller holds back (the watchdog's ClientNotReading), whatever reason it had: that caller reads no
   * status, only the reset. Still running, its engine request is aborted; already done, the output waiting is dropped.
   */
  cut(failure: ClientNotReading): void {
    this.failure = failure
    if (this.done) this.wake()
    else this.interrupt()
  }
  finish(exit: Exit.Exit<unknown, GenerateError>): void {
    this.done = true
    this.completed = this.failure === undefined && Exit.isSuccess(exit)
    if (this.failure === undefined && Exit.isFailure(exit) && !Cause.hasInterruptsOnly(exit.cause)) {
      // A typed failure as is; a defect (a bug) becomes AgentDefect, whose row is INTERNAL.
      this.failure = Option.getOrElse(Cause.findErrorOption(exit.cause), () => {
        const defect = Cause.squash(exit.cause)
        return new AgentDefect({ detail: defect instanceof Error ? defect.message : String(defect) })
      })
    }
    this.wake()
  }
  wake(): void {
    this.consumer()
  }
}
