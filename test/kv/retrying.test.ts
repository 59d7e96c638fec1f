// The KV bridge's reconnect loop (src/layers/kv/retrying.ts) on a TestClock: the delays between attempts, when
// they grow and when they start over.
import { describe, expect, it } from "@effect/vitest"
import { Cause, Effect, Exit, Fiber, Schema } from "effect"
import { Socket } from "effect/socket"
import { TestClock } from "effect/testing"
import { retryForever } from "../../src/layers/kv/retrying.ts"
import { jitteredBackoffMs } from "../../src/services/retry/Backoff.ts"

const CAP = 5_000

/** Runs the loop over scripted attempts (each lasts `ms` of clock time, then fails) and collects each failure's count. */
const run = (attemptsMs: ReadonlyArray<number>, longAttemptIsProgress?: boolean) =>
  Effect.gen(function* () {
    const seen: Array<{ failures: number; retryInMs: number }> = []
    let i = 0
    const fiber = yield* Effect.forkChild(
      retryForever({
        capMs: CAP,
        ...(longAttemptIsProgress === undefined ? {} : { longAttemptIsProgress }),
        attempt: () => Effect.andThen(Effect.sleep(attemptsMs[i++] ?? 0), Effect.fail("dropped")),
        onFailure: (_error, failures, retryInMs) => Effect.sync(() => void seen.push({ failures, retryInMs }))
      })
    )
    // Enough clock for every scripted attempt and the delays between them.
    for (let k = 0; k < attemptsMs.length * 4; k++) yield* TestClock.adjust(CAP)
    yield* Fiber.interrupt(fiber)
    return seen.slice(0, attemptsMs.length)
  })

describe("retryForever", () => {
  it.effect("attempts that fail at once count up to the cap; one that lasted the whole cap starts the count over", () =>
    Effect.gen(function* () {
      const seen = yield* run([0, 0, 0, 0, CAP, 0, CAP - 1])
      expect(seen.map((s) => s.failures)).toEqual([1, 2, 3, 4, 1, 2, 3])
      for (const s of seen) {
        expect(s.retryInMs).toBeGreaterThanOrEqual(jitteredBackoffMs(s.failures, CAP, 0))
        expect(s.retryInMs).toBeLessThanOrEqual(jitteredBackoffMs(s.failures, CAP, 1))
      }
    })
  )

  it.effect(
    "with longAttemptIsProgress false, only the attempt's own progress starts the count over, not its length",
    () =>
      Effect.gen(function* () {
        const seen = yield* run([0, CAP, 0, 2 * CAP], false)
        expect(seen.map((s) => s.failures)).toEqual([1, 2, 3, 4])
      })
  )

  it.effect("a schema failure is reported with what was wrong and where, not as its issue's tag (Composite)", () =>
    Effect.gen(function* () {
      // What the RPC client fails with when it cannot encode a Push: an Error whose cause is the issue tree.
      const exit = Schema.encodeUnknownExit(Schema.Struct({ records: Schema.Array(Schema.Int) }))({ records: [1.5] })
      const issue = Exit.isFailure(exit) ? (Cause.squash(exit.cause) as Schema.SchemaError).issue : undefined
      const errors: Array<string> = []
      const fiber = yield* Effect.forkChild(
        retryForever({
          capMs: CAP,
          attempt: () => Effect.fail(new Error("Schema validation failed", { cause: issue })),
          onFailure: (error) => Effect.sync(() => void errors.push(error))
        })
      )
      yield* TestClock.adjust(1)
      yield* Fiber.interrupt(fiber)
      expect(errors[0]).toBe('Schema validation failed: Expected an integer at ["records"][0]')
    })
  )

  it.effect("a peer's close is reported as such, not as effect's WebSocket close code (SocketCloseError 1000)", () =>
    Effect.gen(function* () {
      const errors: Array<string> = []
      const fiber = yield* Effect.forkChild(
        retryForever({
          capMs: CAP,
          attempt: () =>
            Effect.fail({ _tag: "RpcClientError", message: "", reason: new Socket.SocketCloseError({ code: 1000 }) }),
          onFailure: (error) => Effect.sync(() => void errors.push(error))
        })
      )
      yield* TestClock.adjust(1)
      yield* Fiber.interrupt(fiber)
      expect(errors[0]).toBe("the peer closed the connection")
    })
  )

  it.effect("a peer's close seen by a write (EPIPE) is reported as the close it is, with the OS error", () =>
    Effect.gen(function* () {
      const errors: Array<string> = []
      const epipe = Object.assign(new Error("write EPIPE"), { code: "EPIPE", errno: -32, syscall: "write" })
      const fiber = yield* Effect.forkChild(
        retryForever({
          capMs: CAP,
          attempt: () =>
            Effect.fail({
              _tag: "RpcClientError",
              message: "",
              reason: new Socket.SocketError({ reason: new Socket.SocketReadError({ cause: epipe }) })
            }),
          onFailure: (error) => Effect.sync(() => void errors.push(error))
        })
      )
      yield* TestClock.adjust(1)
      yield* Fiber.interrupt(fiber)
      expect(errors[0]).toBe("the peer closed the connection (write EPIPE)")
    })
  )
})
