// The whole-answer exchange's wait (src/layers/engine/exchange.ts): a reader checks the state and then waits, and
// Effect's run loop may yield between the two; an undici callback in that gap must not be lost, or the reader (a
// P/D prefill leg, a metrics read) waits for ever. And its bound on a body: an error status's is read up to 64 KiB.
import { Effect, Exit } from "effect"
import { describe, expect, it } from "vitest"
import { Exchange, MAX_ERROR_BODY_BYTES } from "../../src/layers/engine/exchange.ts"

/** `changed`, or a timeout after `ms`: whether it returned. */
const returns = (ex: Exchange, ms = 200) =>
  Effect.runPromise(Effect.exit(ex.changed.pipe(Effect.timeout(ms)))).then(Exit.isSuccess)

describe("Exchange.changed", () => {
  it("returns at once for a change that came while nobody waited (the end, data, headers, an error)", async () => {
    const ended = new Exchange()
    ended.onResponseEnd()
    expect(await returns(ended)).toBe(true)
    const data = new Exchange()
    data.onResponseData({ abort: () => {} } as never, Buffer.from("x"))
    expect(await returns(data)).toBe(true)
    const failed = new Exchange()
    failed.onResponseError({} as never, new Error("reset"))
    expect(await returns(failed)).toBe(true)
  })

  it("once per change: a second wait waits for the next one", async () => {
    const ex = new Exchange()
    ex.onResponseStart({} as never, 200)
    expect(await returns(ex)).toBe(true)
    expect(await returns(ex, 50)).toBe(false)
    const waiting = returns(ex, 2_000)
    ex.onResponseEnd()
    expect(await waiting).toBe(true)
  })
})

describe("Exchange's bound on a body", () => {
  /** Feeds `bytes` of body after `status` in 1 KiB chunks: whether it was cut (aborted) and what it kept. */
  const feed = (status: number, bytes: number) => {
    const ex = new Exchange()
    let aborted = 0
    const controller = { abort: () => void aborted++ } as never
    ex.onResponseStart(controller, status)
    for (let sent = 0; sent < bytes; sent += 1024) ex.onResponseData(controller, Buffer.alloc(1024, 0x7a))
    return { overflowed: ex.overflowed, aborted, kept: ex.take().reduce((n, b) => n + b.length, 0) }
  }

  it("an error status, 400 (the commonest refusal) as 500, is read up to 64 KiB only; a success is not cut there", () => {
    for (const status of [400, 404, 500])
      expect(feed(status, MAX_ERROR_BODY_BYTES + 1024), String(status)).toEqual({
        overflowed: true,
        aborted: 1,
        kept: MAX_ERROR_BODY_BYTES
      })
    expect(feed(400, MAX_ERROR_BODY_BYTES)).toEqual({ overflowed: false, aborted: 0, kept: MAX_ERROR_BODY_BYTES })
    expect(feed(200, MAX_ERROR_BODY_BYTES + 1024)).toEqual({
      overflowed: false,
      aborted: 0,
      kept: MAX_ERROR_BODY_BYTES + 1024
    })
  })
})
