// requestReadTimeoutMs on a request-streaming call, the bound itself (layers/grpc/http2/messageBound.ts) on vitest's
// fake timers (the module arms setTimeout): a message has the bound from its first bytes to its last, however it is
// chunked; the time between messages is not bounded; a stream's close stops it; 0 is no bound, and so is a bound past
// setTimeout's limit, but any other (the default 10 s) is one. The server's wiring: http2-guard.test.ts.
import { EventEmitter } from "node:events"
import type * as http2 from "node:http2"
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest"
import { MAX_TIMER_MS, messageBound, messageTimeout } from "../../src/layers/grpc/http2/messageBound.ts"
import { toGrpcFailure } from "../../src/services/grpc/GrpcStatus.ts"
import { RequestReadTimeout } from "../../src/services/grpc/TransportErrors.ts"

beforeEach(() => {
  vi.useFakeTimers()
})
afterEach(() => {
  vi.useRealTimers()
})

/** A stream as messageBound reads it (its 'close'), and the bound's expiries so far. */
const bounded = (ms: number) => {
  const stream = new EventEmitter()
  let expired = 0
  const bound = messageBound(stream as unknown as http2.ServerHttp2Stream, ms, () => expired++)
  return { stream, bound, expired: () => expired }
}

describe("messageBound", () => {
  it("bounds a message from its first bytes, however many chunks it comes in (a dribble is not reset per chunk)", () => {
    const { bound, expired } = bounded(100)
    // a message dribbled in chunks 60 ms apart, each under the bound, still unfinished
    bound?.after(3)
    vi.advanceTimersByTime(60)
    bound?.after(7)
    vi.advanceTimersByTime(39)
    expect(expired()).toBe(0)
    // 100 ms after its first bytes, not 100 ms after its last chunk
    vi.advanceTimersByTime(1)
    expect(expired()).toBe(1)
  })

  it("a message that completes stops its bound: the stream may then stay idle for good (grpcurl's reflection stream)", () => {
    const { bound, expired } = bounded(100)
    // one message in two chunks, the second ending it
    bound?.after(4)
    vi.advanceTimersByTime(50)
    bound?.after(0)
    vi.advanceTimersByTime(10_000)
    expect(expired()).toBe(0)
    // the next message has its own bound, from its own first bytes
    bound?.after(2)
    vi.advanceTimersByTime(99)
    expect(expired()).toBe(0)
    vi.advanceTimersByTime(1)
    expect(expired()).toBe(1)
  })

  it("the stream's close stops the bound of a message it left unfinished (a reset: nothing is left to end)", () => {
    const { stream, bound, expired } = bounded(100)
    bound?.after(4)
    stream.emit("close")
    vi.advanceTimersByTime(10_000)
    expect(expired()).toBe(0)
    expect(vi.getTimerCount()).toBe(0)
  })

  it("0 is no bound (agent.request_read_timeout = 0: never), and neither is one past setTimeout's limit", () => {
    const stream = new EventEmitter() as unknown as http2.ServerHttp2Stream
    expect(messageBound(stream, 0, () => {})).toBeUndefined()
    expect(messageBound(stream, MAX_TIMER_MS + 1, () => {})).toBeUndefined()
    expect(stream.listenerCount("close")).toBe(0)
  })

  it("any bound up to setTimeout's limit is one: the default 10 s, and the limit itself", () => {
    const { bound, expired } = bounded(10_000)
    bound?.after(1)
    vi.advanceTimersByTime(9_999)
    expect(expired()).toBe(0)
    vi.advanceTimersByTime(1)
    expect(expired()).toBe(1)
    expect(messageBound(new EventEmitter() as unknown as http2.ServerHttp2Stream, MAX_TIMER_MS, () => {})).toBeDefined()
  })

  it("its status names the key that sets it, with the bound (the caller's operator reads which setting ended the call)", () => {
    const failure = messageTimeout(toGrpcFailure(new RequestReadTimeout({ timeoutMs: 200 })), 200)
    expect(failure.message).toBe(
      "a request message did not arrive in full within 200 ms of its first bytes (agent.request_read_timeout)"
    )
  })
})
