/**
 * The numbers NodeHealth's engine detail and load carry (services/node/NodeHealthView.ts), as routers, dashboards and
 * /status readers see them: how seconds are rounded in the phase line, when the GPU gate's words replace the phase,
 * and the precision of tokens per second.
 */
import { describe, expect, it } from "vitest"
import type { ExitRecord } from "../../src/services/engine/EngineProcess.ts"
import { State } from "../../src/services/engine/EngineState.ts"
import { engineDetail, ratePerSecond } from "../../src/services/node/NodeHealthView.ts"

const exit: ExitRecord = {
  run: 0,
  pid: 7,
  code: 1,
  signal: null,
  startedAt: 0,
  endedAt: 3000,
  runtimeMs: 3000,
  reason: "exited",
  endedBy: { kind: "exited" },
  lastLines: [],
  oomKills: undefined,
  memoryLimitBytes: undefined
}

describe("NodeHealth engine detail and rate", () => {
  it("says a restart still to come is at least 1s away: a wait under half a second rounds up, not to 0s", () => {
    expect(engineDetail(State.Restarting({ attempt: 2, nextAt: 1400, lastExit: exit }), 1000)).toMatch(
      /^restart 2 in 1s;/
    )
    expect(engineDetail(State.Restarting({ attempt: 2, nextAt: 1001, lastExit: exit }), 1000)).toMatch(
      /^restart 2 in 1s;/
    )
    // due (or overdue): 0s, never negative
    expect(engineDetail(State.Restarting({ attempt: 2, nextAt: 900, lastExit: exit }), 1000)).toMatch(
      /^restart 2 in 0s;/
    )
  })

  it("counts a start's seconds to the nearest second", () => {
    expect(engineDetail(State.Starting({ phase: "loading", since: 0, run: 1 }), 12_600)).toBe("loading for 13s (run 1)")
    expect(engineDetail(State.Starting({ phase: "loading", since: 0, run: 1 }), 12_400)).toBe("loading for 12s (run 1)")
  })

  it("puts the GPU gate's wait in place of the phase only while the run is spawning (the gate holds the spawn)", () => {
    // Once the engine is spawned, its own phase is what the run is doing: a gate still waiting says nothing of it.
    const loading = State.Starting({ phase: "loading", since: 0, run: 1 })
    expect(engineDetail(loading, 3_000, true)).toBe("loading for 3s (run 1)")
    const spawning = State.Starting({ phase: "spawning", since: 0, run: 1 })
    expect(engineDetail(spawning, 3_000, true)).toBe("waiting for the engine's GPUs for 3s (run 1)")
  })

  it("tells a stopped engine's last exit, and only without one says stopped", () => {
    expect(engineDetail(State.Stopped({ lastExit: exit }), 5_000)).toMatch(
      /^run 0 \(pid 7\) ended: exited, exit code 1/
    )
    expect(engineDetail(State.Stopped({ lastExit: undefined }), 5_000)).toBe("stopped")
  })

  it("gives tokens per second to two decimals", () => {
    // 10 tokens in 3 s: 3.33 (a slow model's rate is all in its decimals)
    expect(ratePerSecond({ total: 0, at: 0 }, { total: 10, at: 3_000 })).toBe(3.33)
    expect(ratePerSecond({ total: 0, at: 0 }, { total: 1, at: 8_000 })).toBe(0.13)
  })
})
