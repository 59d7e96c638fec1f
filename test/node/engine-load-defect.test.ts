// The engine-load sampler (src/layers/node/engineLoad.ts) meeting a defect in a scrape (a throw where the engine's
// answer is read): it used to end the sampler's fiber for the process with nothing said, the engine's load signals
// and progress counters gone for good while the node looked healthy. Now the defect is one error line naming the
// sampler, and sampling goes on a heartbeat later. On a TestClock.
import { assert, describe, it } from "@effect/vitest"
import { Cause, Clock, Effect, Logger, SubscriptionRef } from "effect"
import { TestClock } from "effect/testing"
import { sampleEngineLoad } from "../../src/layers/node/engineLoad.ts"
import type { LoadSignals } from "../../src/services/engine/EngineClient.ts"
import type { EngineState } from "../../src/services/engine/EngineProcess.ts"
import { State } from "../../src/services/engine/EngineState.ts"
import { settle } from "../support/poll.ts"

const HEARTBEAT_MS = 1_000
const signals: LoadSignals = { running: 2, waiting: 0, kvUsage: 0.5 }

describe("engine load sampler, a defect in a scrape", () => {
  it.effect("is said once at error level and sampling goes on a heartbeat later", () => {
    const lines: Array<{ level: string; text: string; cause: string }> = []
    const logger = Logger.make(({ logLevel, message, cause }) => {
      const [text] = [message].flat() as [string]
      lines.push({ level: logLevel, text, cause: cause.reasons.length > 0 ? Cause.pretty(cause) : "" })
    })
    return Effect.gen(function* () {
      const ready: EngineState = State.Ready({ since: 0, run: 0 })
      const ref = yield* SubscriptionRef.make(ready)
      let scrapes = 0
      const sampler = yield* sampleEngineLoad({
        // the first scrape throws, as a parser's bug would; the next ones answer
        load: Effect.suspend(() =>
          ++scrapes === 1 ? Effect.die(new TypeError("Cannot read properties of undefined")) : Effect.succeed(signals)
        ),
        state: SubscriptionRef.get(ref),
        changes: SubscriptionRef.changes(ref),
        heartbeatMs: HEARTBEAT_MS
      })
      yield* settle(
        "the defect said",
        Effect.sync(() => lines.some((l) => l.level === "Error"))
      )
      const errors = lines.filter((l) => l.level === "Error")
      assert.strictEqual(errors.length, 1, JSON.stringify(lines))
      assert.match(
        errors[0]?.text ?? "",
        /^the engine metrics scrape stopped on a defect of the agent's: the engine's load signals and progress counters are no longer sampled; restarting it in \d+ ms$/
      )
      assert.include(errors[0]?.cause, "TypeError: Cannot read properties of undefined")
      assert.strictEqual(yield* sampler.latest(ready), undefined, "nothing sampled yet")

      // within a heartbeat the sampler runs again and its scrape answers (the clock moved on a tenth of a heartbeat at
      // a time: a sleep begun after a step is woken by a later one)
      const start = yield* Clock.currentTimeMillis
      yield* settle(
        "a sample after the defect",
        Effect.andThen(
          TestClock.adjust(HEARTBEAT_MS / 10),
          Effect.map(sampler.latest(ready), (s) => s?.kvUsage === 0.5)
        )
      )
      assert.isAtMost((yield* Clock.currentTimeMillis) - start, HEARTBEAT_MS, "within a heartbeat")
      // and it keeps sampling, one scrape per heartbeat
      const before = scrapes
      yield* settle(
        "the next heartbeat's scrape",
        Effect.andThen(
          TestClock.adjust(HEARTBEAT_MS / 10),
          Effect.sync(() => scrapes === before + 1)
        )
      )
      assert.strictEqual(lines.filter((l) => l.level === "Error").length, 1, "said once")
    }).pipe(Effect.scoped, Effect.provide(Logger.layer([logger])))
  })
})
