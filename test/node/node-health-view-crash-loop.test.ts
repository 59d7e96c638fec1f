/**
 * NodeHealth's engine detail (services/node/NodeHealthView.ts engineDetail) while the engine crash-loops: the last
 * exit's status and hint said once. A lifecycle review saw /readyz and etcd's `engine.detail` tell them twice, once
 * in the failing reason (EngineState.ts failingReason) and again in the Restarting phase's describeExit.
 */
import { describe, expect, it } from "vitest"
import type { ExitRecord } from "../../src/services/engine/EngineProcess.ts"
import { describeExit, failingReason, State } from "../../src/services/engine/EngineState.ts"
import { engineDetail } from "../../src/services/node/NodeHealthView.ts"

const hint = "the engine ran out of GPU memory: lower models.m.gpu_memory_utilization"

const exit: ExitRecord = {
  run: 9,
  pid: 18789,
  code: 1,
  signal: null,
  startedAt: 0,
  endedAt: 200,
  runtimeMs: 200,
  reason: "exited",
  endedBy: { kind: "exited" },
  lastLines: [],
  oomKills: undefined,
  memoryLimitBytes: undefined,
  hint
}

describe("NodeHealth engine detail in a crash loop", () => {
  it("says the last exit's status and hint once, with its run, pid and how long it ran", () => {
    const failing = failingReason({ attempt: 10, unstableRuns: 10, delayMs: 1000, crashLoop: true }, exit)
    expect(failing).toBeDefined()
    const restarting = State.Restarting({
      attempt: 10,
      nextAt: 1_000,
      lastExit: exit,
      ...(failing === undefined ? {} : { failing })
    })
    const detail = engineDetail(restarting, 0)
    expect(detail).toBe(
      "engine failing: 10 runs in a row ended before being stable, the last: exited (exit code 1); " +
        `hint: ${hint}; still retrying with backoff; restart 10 in 1s; run 9 (pid 18789) ended after 0.2 s`
    )
    expect(detail.split("exit code 1")).toHaveLength(2)
    expect(detail.split(hint)).toHaveLength(2)
  })

  it("keeps the whole last exit in a Restarting detail that is not failing", () => {
    const restarting = State.Restarting({ attempt: 2, nextAt: 1_000, lastExit: exit })
    expect(engineDetail(restarting, 0)).toBe(
      `restart 2 in 1s; run 9 (pid 18789) ended: exited, exit code 1, after 0.2 s; hint: ${hint}`
    )
    expect(engineDetail(restarting, 0)).toBe(`restart 2 in 1s; ${describeExit(exit)}`)
  })

  it("keeps the failing reason before the next run's phase once it starts (the last exit said there alone)", () => {
    const failing = failingReason({ attempt: 10, unstableRuns: 10, delayMs: 1000, crashLoop: true }, exit) ?? ""
    const starting = State.Starting({ phase: "loading", since: 0, run: 10, failing })
    expect(engineDetail(starting, 2_000)).toBe(`${failing}; loading for 2s (run 10)`)
  })
})
