import * as net from "node:net"
import { assert, it as effectIt } from "@effect/vitest"
import { Effect, Fiber, Logger, Ref, Stream } from "effect"
import { TestClock } from "effect/testing"
import { describe, expect, it } from "vitest"
import { connectTest } from "../../src/layers/node/AgentShortage.ts"
import {
  make,
  noShortage,
  ShortageEvent,
  type ShortageView,
  shortageProblem,
  stepShortage
} from "../../src/services/node/AgentShortage.ts"
import { hostShortage } from "../../src/services/node/HostShortage.ts"
import { settle } from "../support/poll.ts"
import { freePort } from "../support/ports.ts"
import { type LoggedLine, superviseFakeHost } from "../support/supervisor.ts"

const limits = { calls: 3, probes: 2 }
const steps = (events: ReadonlyArray<ShortageEvent>, from: ShortageView = noShortage, at = 1_000): ShortageView =>
  events.reduce((v, e, i) => stepShortage(v, e, limits, at + i), from)
const refused = (inRow: number, last = "EMFILE") => ShortageEvent.CallsRefused({ inRow, last })
const unsentProbe = (reason = "EMFILE") => ShortageEvent.ProbeUnsent({ reason })

describe("stepShortage", () => {
  it("takes the agent as short once a run of refused calls reaches the calls' limit", () => {
    expect(steps([refused(2)]).short).toBeUndefined()
    expect(steps([refused(2), refused(1, "ENOBUFS")]).short).toBeUndefined()
    expect(steps([refused(2), refused(3, "ENOBUFS")]).short).toEqual({ since: 1_001, last: "ENOBUFS" })
    expect(steps([refused(3)]).short).toEqual({ since: 1_000, last: "EMFILE" })
    // no run: nothing changes
    expect(steps([refused(0)])).toBe(noShortage)
  })

  it("takes it as short at the probes' limit of unsent probes in a row, a sent one starting the run over", () => {
    expect(steps([unsentProbe()]).short).toBeUndefined()
    expect(steps([unsentProbe(), ShortageEvent.ProbeSent(), unsentProbe()]).short).toBeUndefined()
    expect(steps([unsentProbe("a"), unsentProbe("b")]).short).toEqual({ since: 1_001, last: "b" })
    // calls and probes are runs of their own: neither ends the other's
    expect(steps([unsentProbe(), refused(2), unsentProbe()]).short?.since).toBe(1_002)
  })

  it("stays short, keeping its since, through sent probes and shorter runs; only the test clears it", () => {
    const short = steps([refused(3)])
    const kept = steps([ShortageEvent.ProbeSent(), refused(1, "later")], short, 5_000)
    expect(kept.short).toEqual({ since: 1_000, last: "later" })
    expect(steps([ShortageEvent.TestPassed()], kept)).toBe(noShortage)
  })

  it("never takes it as short by calls when the calls' limit is 0 (engine.failed_calls_unhealthy = 0)", () => {
    expect(stepShortage(noShortage, refused(1_000), { calls: 0, probes: 2 }, 0).short).toBeUndefined()
  })

  it("names the shortage and that the engine is not restarted for it", () => {
    expect(shortageProblem({ since: 0, last: "engine unreachable: EMFILE" })).toBe(
      "the agent is short of resources to reach its engine (calls end UNAVAILABLE, cgn-reason agent_resources; the engine is not restarted for it): engine unreachable: EMFILE"
    )
  })
})

describe("the AgentShortage state machine", () => {
  effectIt.effect("logs and emits each change of whether the agent is short, once", () =>
    Effect.gen(function* () {
      const lines: Array<readonly [string, unknown]> = []
      const capture = Logger.make(({ logLevel, message }) => lines.push([logLevel, [message].flat()[0]]))
      const shortage = yield* make(limits)
      const seen = yield* shortage.changes.pipe(Stream.take(2), Stream.runCollect, Effect.forkScoped)
      yield* Effect.yieldNow
      yield* Effect.forEach([refused(3), refused(1), ShortageEvent.TestPassed(), ShortageEvent.TestPassed()], (e) =>
        shortage.report(e)
      ).pipe(Effect.provide(Logger.layer([capture])))
      const changes = yield* Fiber.join(seen)
      assert.deepStrictEqual(
        [...changes].map((c) => c?.last),
        ["EMFILE", undefined]
      )
      assert.deepStrictEqual(lines, [
        ["Warn", `node unhealthy: ${shortageProblem({ since: 0, last: "EMFILE" })}`],
        ["Info", "the agent can open connections to its engine again: the node is no longer unhealthy for its shortage"]
      ])
      assert.strictEqual(yield* shortage.current, undefined)
    })
  )
})

describe("the shortage test's fresh connection", () => {
  it("passes on a connection made and on one refused by a closed port; fails with what ran out on EMFILE, or an unresolved name", async () => {
    const server = net.createServer((s) => s.destroy())
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
    const open = (server.address() as net.AddressInfo).port
    try {
      expect(await Effect.runPromise(connectTest("127.0.0.1", open))).toBeUndefined()
      expect(await Effect.runPromise(connectTest("127.0.0.1", await freePort()))).toBeUndefined()
    } finally {
      server.close()
    }
    // a name not resolved: nothing is known of the host's sockets (a lookup out of descriptors can fail ENOTFOUND)
    expect(await Effect.runPromise(connectTest("cgn-agent-test.invalid", open))).toMatch(
      /^cgn-agent-test\.invalid not resolved/
    )
    // a socket the host cannot give: net.connect's own error event, as libuv reports EMFILE
    const original = net.Socket.prototype.connect
    net.Socket.prototype.connect = function (this: net.Socket) {
      process.nextTick(() => this.emit("error", Object.assign(new Error("connect EMFILE"), { code: "EMFILE" })))
      return this
    } as typeof original
    try {
      expect(await Effect.runPromise(connectTest("127.0.0.1", open))).toBe(`EMFILE: ${hostShortage("EMFILE")}`)
    } finally {
      net.Socket.prototype.connect = original
    }
  })
})

describe("the supervisor's probes that cannot be sent", () => {
  const unsentAnswer = {
    ok: false as const,
    reason: `EMFILE: ${hostShortage("EMFILE")}`,
    phase: "the agent's host is out of resources",
    inconclusive: true as const
  }

  // The run is spawned through real file I/O (its state_dir's pid file): the clock moves only once its first probe
  // was made, or a run spawned after the moves would start its budget, and its probes, where the clock stopped.
  const firstUnsentProbe = (lines: ReadonlyArray<LoggedLine>) =>
    settle(
      "run 0's first probe, not sent",
      Effect.sync(() => lines.some((l) => l.text.startsWith("engine run 0: readiness probe not sent")))
    )

  effectIt.effect(
    "do not spend the startup budget: an engine still loading is not ended for the agent's shortage",
    () =>
      Effect.gen(function* () {
        const shortage = yield* make({ calls: 5, probes: 3 })
        const { fake, settings, states, lines } = yield* superviseFakeHost({ startupTimeoutMs: 10_000 }, shortage)
        yield* Ref.set(fake.answer, unsentAnswer)
        yield* firstUnsentProbe(lines)
        // three startup budgets of unsent probes, a probe interval at a time
        for (let t = 0; t < 3 * settings.startupTimeoutMs; t += settings.probeIntervalMs)
          yield* TestClock.adjust(settings.probeIntervalMs)
        assert.isFalse(
          states.some((s) => s._tag !== "Starting"),
          "not ended by the startup timeout"
        )
        assert.strictEqual((yield* shortage.current)?.last, unsentAnswer.reason, "the agent taken as short")
        // probes sent again, the engine up: Ready, the same run
        yield* Ref.set(fake.answer, undefined)
        yield* Ref.set(fake.up, true)
        yield* settle(
          "run 0 Ready",
          Effect.gen(function* () {
            yield* TestClock.adjust(settings.probeIntervalMs)
            return states.at(-1)?._tag === "Ready"
          })
        )
        assert.strictEqual((yield* Ref.get(fake.runs)).length, 1)
        assert.deepStrictEqual(
          lines.filter((l) => l.text.includes("readiness probe")).map((l) => [l.level, l.text]),
          [
            [
              "Warn",
              `engine run 0: readiness probe not sent: ${unsentAnswer.reason}; engine.startup_timeout waits until probes are sent again`
            ],
            ["Info", "engine run 0: readiness probes sent again"]
          ]
        )
      })
  )

  effectIt.effect("once probes are sent again the budget runs: an engine that never answers still times out", () =>
    Effect.gen(function* () {
      const { fake, settings, states, lines } = yield* superviseFakeHost({ startupTimeoutMs: 10_000 })
      yield* Ref.set(fake.answer, unsentAnswer)
      yield* firstUnsentProbe(lines)
      for (let t = 0; t < settings.startupTimeoutMs; t += settings.probeIntervalMs)
        yield* TestClock.adjust(settings.probeIntervalMs)
      // sent again, refused (the engine is not up): the whole budget from here, then the timeout
      yield* Ref.set(fake.answer, undefined)
      for (let t = 0; t < settings.startupTimeoutMs - 2 * settings.probeIntervalMs; t += settings.probeIntervalMs)
        yield* TestClock.adjust(settings.probeIntervalMs)
      yield* settle(
        "probes sent, budget not yet spent",
        Effect.sync(() => states.at(-1)?._tag === "Starting")
      )
      // the first run, never out of Starting: its budget waited through the unsent probes
      assert.isTrue(
        states.every((s) => s._tag === "Starting" && s.run === 0),
        JSON.stringify(states.map((s) => s._tag))
      )
      assert.strictEqual((yield* Ref.get(fake.runs)).length, 1)
      yield* settle(
        "the startup timeout",
        Effect.gen(function* () {
          yield* TestClock.adjust(settings.probeIntervalMs)
          return states.some((s) => s._tag !== "Starting")
        })
      )
    })
  )
})
