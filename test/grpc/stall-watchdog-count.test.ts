// The line logged as the node becomes stalled counts every stream of the watchdog tick that found them stalled: a soak
// saw `warn ... 1 stream(s) sent nothing for 5s` while /readyz said "11 stream(s)" 6 ms later, the watchdog having
// reported its tick's streams one at a time and the line going out at the first.
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Logger } from "effect"
import { TestClock } from "effect/testing"
import { layerFromObject } from "../../src/layers/config/Config.ts"
import * as EngineStallLive from "../../src/layers/engine/EngineStall.ts"
import { ActiveCalls } from "../../src/layers/grpc/ActiveCalls.ts"
import { Relay } from "../../src/layers/grpc/Relay.ts"
import * as StallWatchdog from "../../src/layers/grpc/StallWatchdog.ts"
import { EngineStall, stallProblem } from "../../src/services/engine/EngineStall.ts"
import * as EngineTest from "../../src/testing/EngineProcess.ts"

const IDLE_MS = 800 // the watchdog ticks every idle / 8 = 100 ms
const STREAMS = 11

const config = layerFromObject({ models: { m: { hf_repo: "org/m" } }, engine: { stream_idle_timeout: `${IDLE_MS}ms` } })

describe("the stall watchdog's log line", () => {
  it.effect("counts all the streams one tick found stalled, as /readyz does", () => {
    const lines: Array<string> = []
    const logger = Logger.make(({ logLevel, message }) => {
      lines.push(`${logLevel} ${[message].flat()[0]}`)
    })
    const layer = Layer.mergeAll(
      config,
      EngineStallLive.layer.pipe(Layer.provide(EngineTest.layerTest()), Layer.provide(config))
    ).pipe(Layer.provide(Logger.layer([logger])))
    return Effect.gen(function* () {
      const active = new ActiveCalls()
      yield* StallWatchdog.fork(active)
      for (let i = 0; i < STREAMS; i++) {
        const relay = new Relay(1024)
        relay.streamRequested(0)
        relay.interrupt = () => {}
        active.add(relay)
      }
      yield* TestClock.adjust(IDLE_MS + 200)
      // the log fiber follows the state's changes: bounded, no sleep
      for (let i = 0; i < 50 && !lines.some((l) => l.includes("unhealthy")); i++) yield* Effect.yieldNow
      const problem = stallProblem(yield* Effect.flatMap(EngineStall, (s) => s.state), `${IDLE_MS}ms`)
      assert.match(problem ?? "", new RegExp(`^engine stalled: ${STREAMS} stream\\(s\\)`))
      assert.deepStrictEqual(
        lines.filter((l) => l.includes("unhealthy")),
        [`Warn the node is unhealthy: ${problem}`]
      )
    }).pipe(Effect.scoped, Effect.provide(layer))
  })
})
