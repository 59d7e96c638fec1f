// The built agent (`node dist/main.js run`) as operators meet it. SIGHUP reloads and never kills, in every mode
// (Node's default for SIGHUP is to terminate at once: no drain, no lease revoke; before the fix only a TLS agent
// had a handler): after any number of SIGHUPs the agent keeps serving, and SIGTERM still drains it to exit 0.
// An engine command that does not exist is reported as failing (/readyz, metric) while it is still retried.
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

describe("an engine command that does not exist", () => {
  it("is shown as failing (/readyz reason, cgn_agent_engine_failing) while the restarts go on", async () => {
    const { config } = await simAgentConfig({
      engine: {
        command: ["/nonexistent/engine-binary"],
        restart_backoff_initial: "100ms",
        restart_backoff_max: "500ms"
      }
    })
    const agent = await startAgent({ config, awaitReady: false })
    const readyz = await pollUntil(
      "/readyz says the engine is failing",
      async () => {
        const res = await fetch(`${agent.adminUrl}/readyz`)
        const text = await res.text()
        return res.status === 503 && text.includes("engine failing") ? text : undefined
      },
      45_000,
      200
    )
    expect(readyz).toMatch(/^unhealthy \(engine (restarting|starting): engine failing: \d+ runs in a row/)
    expect(readyz).toContain("ENOENT")
    const metric = async (name: string) => {
      const body = await (await fetch(`${agent.adminUrl}/metrics`)).text()
      const line = body.split("\n").find((l) => l.startsWith(`${name} `))
      return line === undefined ? undefined : Number(line.split(" ")[1])
    }
    expect(await metric("cgn_agent_engine_failing")).toBe(1)
    const before = (await metric("cgn_agent_engine_restarts_total")) ?? 0
    await pollUntil(
      "more restarts",
      async () => ((await metric("cgn_agent_engine_restarts_total")) ?? 0) > before,
      20_000
    )
    const exit = await agent.stop("SIGTERM")
    expect(exit, agent.tail()).toEqual({ code: 0, signal: null })
  }, 120_000)
})
