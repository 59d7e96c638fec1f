// SIGHUP on the built agent (`node dist/main.js run`): it reloads and never kills, in every mode. Node's
// default for SIGHUP is to terminate at once (no drain, no lease revoke); before the fix only a TLS agent had a
// handler. After any number of SIGHUPs the agent keeps serving, and SIGTERM still drains it to exit 0.
// Requires dist/ (`npm run build`; `npm test` builds first).
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { killAllAgents, requireDist, simAgentConfig, startAgent } from "./support/agent.ts"
import { pollUntil } from "./support/poll.ts"

beforeAll(() => requireDist())
afterEach(() => killAllAgents())
afterAll(() => killAllAgents())

describe("SIGHUP", () => {
  it("without TLS: the agent reloads, keeps serving, then drains on SIGTERM with exit 0", async () => {
    const { config } = await simAgentConfig()
    const agent = await startAgent({ config, readyTimeoutMs: 45_000 })
    const reloads = () => agent.stderrLines.filter((l) => l.includes("SIGHUP: nothing to reload")).length
    const died = agent.exited.then((e) => {
      throw new Error(`the agent died after SIGHUP (${JSON.stringify(e)}):\n${agent.tail()}`)
    })
    died.catch(() => {})
    for (let i = 1; i <= 3; i++) {
      process.kill(agent.pid, "SIGHUP")
      await Promise.race([pollUntil(`reload ${i} logged`, () => reloads() >= i || undefined, 10_000), died])
    }
    const ready = await fetch(`${agent.adminUrl}/readyz`)
    expect(ready.status, agent.tail()).toBe(200)
    const exit = await agent.stop("SIGTERM")
    expect(exit, agent.tail()).toEqual({ code: 0, signal: null })
    expect(agent.stderrLines.some((l) => l.includes("drain: started"))).toBe(true)
  }, 90_000)
})
