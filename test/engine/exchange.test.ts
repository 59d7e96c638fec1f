// The whole-answer exchange's wait (src/layers/engine/exchange.ts): a reader checks the state and then waits, and
// Effect's run loop may yield between the two; an undici callback in that gap must not be lost, or the reader (a
// P/D prefill leg, a metrics read) waits for ever.
import { Effect, Exit } from "effect"
import { describe, expect, it } from "vitest"
import { Exchange } from "../../src/layers/engine/exchange.ts"

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
