// Calls refused for the agent's own shortage (an EngineError `Local`: services/grpc/EngineStatus.ts), counted in a row
// by ActiveCalls in the order calls end and read by the stall watchdog each tick (layers/grpc/StallWatchdog.ts) into
// AgentShortage (services/node/AgentShortage.ts), on a TestClock. A review ran 4 callers against an agent with two
// descriptors free: 27% of calls refused in thousands of runs of 2 (engine.failed_calls_unhealthy = 2), yet the node
// read unhealthy once for 0.9 s in 20 s: a tick that saw a completion after such a run read only the refusals after
// it. Now the longest run since the last look counts, and an open run carries on into the next tick.
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Layer } from "effect"
import { TestClock } from "effect/testing"
import { layerFromObject } from "../../src/layers/config/Config.ts"
import { transportError } from "../../src/layers/engine/exchange.ts"
import { ActiveCalls } from "../../src/layers/grpc/ActiveCalls.ts"
import { Relay } from "../../src/layers/grpc/Relay.ts"
import * as StallWatchdog from "../../src/layers/grpc/StallWatchdog.ts"
import { AgentShortage, make } from "../../src/services/node/AgentShortage.ts"

const IDLE_MS = 800 // the watchdog ticks every idle / 8 = 100 ms
const TICK_MS = 100

const emfile = transportError(
  Object.assign(new Error("connect EMFILE 127.0.0.1:8000 - Local (undefined:undefined)"), { code: "EMFILE" }),
  false
)

/** A call that ended: completed, or refused for the agent's shortage. */
const ended = (active: ActiveCalls, refused: boolean) => {
  const relay = new Relay(1024)
  relay.streamRequested(0)
  active.add(relay)
  relay.finish(refused ? Exit.fail(emfile) : Exit.succeed(undefined))
  active.delete(relay)
}
const calls = (active: ActiveCalls, pattern: string) => {
  for (const c of pattern) ended(active, c === "x")
}

const layer = Layer.mergeAll(
  layerFromObject({
    models: { m: { hf_repo: "org/m" } },
    engine: { stream_idle_timeout: `${IDLE_MS}ms`, failed_calls_unhealthy: 3 }
  }),
  Layer.effect(AgentShortage, make({ calls: 3, probes: 3 }))
)

const short = Effect.flatMap(AgentShortage, (s) => s.current)

describe("calls refused for the agent's shortage, as the watchdog reads them", () => {
  it.effect("a run that reached the limit counts though a completion followed it within the tick", () =>
    Effect.gen(function* () {
      const active = new ActiveCalls()
      yield* StallWatchdog.fork(active)
      calls(active, "xxxo") // 3 refused in a row, then a completion, all before the tick
      yield* TestClock.adjust(TICK_MS)
      assert.include((yield* short)?.last, "EMFILE")
    }).pipe(Effect.provide(layer))
  )

  it.effect("a run goes on across ticks; a completion ends it; shorter runs never trip it", () =>
    Effect.gen(function* () {
      const active = new ActiveCalls()
      yield* StallWatchdog.fork(active)
      calls(active, "xxoxx") // runs of 2
      yield* TestClock.adjust(TICK_MS)
      calls(active, "o")
      yield* TestClock.adjust(TICK_MS)
      calls(active, "xx")
      yield* TestClock.adjust(TICK_MS)
      assert.isUndefined(yield* short, "no run of 3 yet")
      calls(active, "x") // the open run of 2 from the last tick, now 3
      yield* TestClock.adjust(TICK_MS)
      assert.isDefined(yield* short)
    }).pipe(Effect.provide(layer))
  )
})
