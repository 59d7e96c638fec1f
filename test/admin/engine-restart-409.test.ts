// POST /engine/restart refused (409) says what the engine is doing in the operator's words, never the supervisor's
// state name as if it were a fault: a second request right after an operator's restart met "the engine is not ready
// (Unhealthy)" while /readyz said `starting` (README: an operator's restart is no fault). And the request line is
// info, not warn: an intended action. Over real loopback, on the test supervisor (src/testing/EngineProcess.ts).
import { afterEach, describe, expect, it } from "vitest"
import { ADMIN_RESTART_REASON, notRestartedWhy } from "../../src/services/admin/EngineRestart.ts"
import type { EngineState } from "../../src/services/engine/EngineProcess.ts"
import { State } from "../../src/services/engine/EngineState.ts"
import * as EngineTest from "../../src/testing/EngineProcess.ts"
import { startAdmin } from "../support/admin.ts"

const closes: Array<() => Promise<void>> = []
afterEach(async () => {
  for (const close of closes.splice(0)) await close()
})

/** The answer of one POST /engine/restart to an engine in `initial`, and whether a restart was asked of it. */
const refusal = async (initial: EngineState) => {
  const admin = await startAdmin({ engine: EngineTest.layerTest({ plan: EngineTest.testPlan(), initial }) })
  closes.push(admin.close)
  const res = await fetch(`${admin.url}/engine/restart`, { method: "POST" })
  return { status: res.status, body: (await res.json()) as Record<string, unknown> }
}

describe("POST /engine/restart refused: why, in the operator's words", () => {
  it("a run an operator's restart is ending: a restart is already under way (not 'not ready (Unhealthy)')", async () => {
    const ending = { kind: "requested", source: "admin", reason: ADMIN_RESTART_REASON } as const
    const state = State.Unhealthy({ reason: `restart requested: ${ADMIN_RESTART_REASON}`, since: 0, run: 0, ending })
    const answer = await refusal(state)
    expect(answer).toEqual({
      status: 409,
      body: {
        error: "a restart is already under way (asked for over the admin API (POST /engine/restart)): nothing was done"
      }
    })
    expect(String(answer.body.error)).not.toMatch(/Unhealthy|not ready/)
  })

  it("a starting run names its phase; a run torn down for a fault gives its reason", async () => {
    expect(await refusal(State.Starting({ phase: "waiting for port", since: 0, run: 2 }))).toEqual({
      status: 409,
      body: {
        error:
          "the engine is starting (phase waiting for port, run 2): nothing was done; a starting run is not restarted"
      }
    })
    const liveness = "3 liveness probes failed in a row, last: connection refused"
    expect(await refusal(State.Unhealthy({ reason: liveness, since: 0, run: 0 }))).toEqual({
      status: 409,
      body: {
        error: `the engine's run is ending (${liveness}): nothing was done; the next run starts after the restart backoff`
      }
    })
  })

  it("no state's answer shows the state's name alone", () => {
    const exit = EngineTest.testExit(0)
    const states: ReadonlyArray<EngineState> = [
      State.Starting({ phase: "spawning", since: 0, run: 0 }),
      State.Ready({ since: 0, run: 0 }),
      State.Unhealthy({ reason: "the engine exited (exit code 1); stopping its process group", since: 0, run: 0 }),
      State.Restarting({ attempt: 1, nextAt: 0, lastExit: exit }),
      State.Stopping({ since: 0 }),
      State.Stopped({ lastExit: exit })
    ]
    for (const s of states) {
      const why = notRestartedWhy(s)
      expect(why).toMatch(/: nothing was done/)
      expect(why).not.toMatch(/\b(Starting|Ready|Unhealthy|Restarting|Stopping|Stopped)\b/)
    }
  })

  it("the request that restarts is logged at info, not as a warning", async () => {
    const logs: Array<string> = []
    const admin = await startAdmin({
      logs,
      engine: EngineTest.layerTest({ plan: EngineTest.testPlan(), initial: State.Ready({ since: 0, run: 0 }) })
    })
    closes.push(admin.close)
    expect((await fetch(`${admin.url}/engine/restart`, { method: "POST" })).status).toBe(202)
    // logged before the answer is sent (layers/admin/engineRestartRoute.ts): no wait
    expect(logs.filter((l) => l.includes("restarting the engine"))).toEqual([
      `Info restarting the engine: ${ADMIN_RESTART_REASON}`
    ])
  })
})
