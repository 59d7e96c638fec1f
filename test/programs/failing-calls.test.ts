// An engine that answers every call with HTTP 500, through the built agent on the simulator. Each call's status was
// right (UNAVAILABLE, engine_http) but the node stayed ready: a node failing every call in milliseconds, with no
// load, drew the routers' traffic. engine.failed_calls_unhealthy calls in a row that the engine failed take it as
// failing calls: unhealthy with the reason (/readyz, NodeHealth), a warning, a metric; the agent's test completion,
// once the engine answers again, makes the node ready (logged). Requires dist/ (`npm run build`; `npm test` builds
// first).
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { killAllAgents, requireDist, simAgentConfig, startAgent } from "../support/agent.ts"
import { agentClient, generate, grpcCode } from "../support/generate.ts"
import { pollUntil } from "../support/poll.ts"

beforeAll(() => requireDist())
afterEach(() => killAllAgents())
afterAll(() => killAllAgents())

const REASON =
  "engine failing calls: the last 3 calls failed in the engine with none completed (engine.failed_calls_unhealthy), " +
  "the last with: engine answered HTTP 500"

const faults = async (engineUrl: string, f: Record<string, unknown>) =>
  expect((await fetch(`${engineUrl}/sim/faults`, { method: "POST", body: JSON.stringify(f) })).status).toBe(200)

const readyz = async (adminUrl: string) => {
  const res = await fetch(`${adminUrl}/readyz`)
  return { status: res.status, text: await res.text() }
}

describe("an engine that answers every call with HTTP 500", () => {
  it("makes the node unhealthy with the reason after 3 calls, and ready again once the test completion completes", async () => {
    const { config, engineUrl, grpcPort } = await simAgentConfig({
      agent: { heartbeat: "200ms" },
      engine: { failed_calls_unhealthy: 3, stream_idle_timeout: "2s", stall_restart_after: "0s" }
    })
    const agent = await startAgent({ config, readyTimeoutMs: 45_000 })
    const { client, channel } = agentClient(`127.0.0.1:${grpcPort}`)
    try {
      await faults(engineUrl, { errorRate: 1, errorKind: "http500" })
      for (let i = 0; i < 3; i++) {
        const call = await generate(client, { prompt: "alpha beta", sampling: { maxTokens: 4 } }).done
        expect(grpcCode(call.error), agent.tail()).toBe("UNAVAILABLE")
      }
      const failing = await pollUntil(
        "/readyz says the engine fails calls",
        async () => {
          const r = await readyz(agent.adminUrl)
          return r.status === 503 && r.text.includes("engine failing calls") ? r.text : undefined
        },
        10_000
      )
      expect(failing).toContain(`${REASON} (InternalServerError): simulated error (http500)`)
      await agent.waitForLine((l) => l.includes(`the node is unhealthy: ${REASON}`), 5_000)
      const page = await (await fetch(`${agent.adminUrl}/metrics`)).text()
      expect(page).toMatch(/^cgn_agent_engine_call_failure_streaks_total\{model="m"\} 1$/m)
      // the test completion fails as the calls did; once the engine answers again, the next one clears it
      await faults(engineUrl, { errorRate: 0 })
      await pollUntil("ready again", async () => (await readyz(agent.adminUrl)).status === 200 || undefined, 20_000)
      await agent.waitForLine(
        (l) =>
          l.includes(
            "the engine is no longer failing calls: the engine completed a test request sent with no call in flight"
          ),
        5_000
      )
      const status = (await (await fetch(`${agent.adminUrl}/status`)).json()) as { engine: { exits: unknown[] } }
      expect(status.engine.exits, "not restarted (stall_restart_after 0s)").toEqual([])
    } finally {
      channel.close()
    }
    expect((await agent.stop()).code).toBe(0)
  }, 120_000)
})
