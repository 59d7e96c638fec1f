// An engine that wedges while idle (or one data-parallel rank of it), through the built agent on the simulator.
// Nothing else shows it: no stream to stall, no work held for the progress counters to stand still on, and vLLM's
// /health answers from the API server.
// After engine.idle_probe_after without calls the agent sends the engine a test completion; one that gets no answer
// within engine.stream_idle_timeout takes the engine as stalled (unhealthy, logged), and the stall's own test, once
// it completes, makes the node ready again (logged). Requires dist/ (`npm run build`; `npm test` builds first).
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { killAllAgents, requireDist, simAgentConfig, simDistEntry, startAgent } from "../support/agent.ts"
import { pollUntil } from "../support/poll.ts"

beforeAll(() => requireDist())
afterEach(() => killAllAgents())
afterAll(() => killAllAgents())

const REASON =
  "engine stalled: a test completion sent after 1s without calls (engine.idle_probe_after) got no answer within 2s " +
  "(engine.stream_idle_timeout)"

const faults = async (engineUrl: string, f: Record<string, unknown>) =>
  expect((await fetch(`${engineUrl}/sim/faults`, { method: "POST", body: JSON.stringify(f) })).status).toBe(200)

const readyz = async (adminUrl: string) => {
  const res = await fetch(`${adminUrl}/readyz`)
  return { status: res.status, text: await res.text() }
}

describe("an engine that wedges with no call in flight", () => {
  it("vLLM: is found by the idle test completion: unhealthy with the reason, ready again once it goes on", async () => {
    const { config, engineUrl } = await simAgentConfig({
      agent: { heartbeat: "200ms" },
      engine: { idle_probe_after: "1s", stream_idle_timeout: "2s", stall_restart_after: "0s" }
    })
    const agent = await startAgent({ config, readyTimeoutMs: 45_000 })
    // a healthy idle engine completes the tests (the engine counts them: no call was made) and the node stays ready
    await pollUntil(
      "two idle tests completed by the engine",
      async () => {
        const page = await (await fetch(`${engineUrl}/metrics`)).text()
        const done = [...page.matchAll(/^vllm:request_success_total\{[^}]*finished_reason="length"[^}]*\} (\S+)$/gm)]
        return done.reduce((n, m) => n + Number(m[1]), 0) >= 2 || undefined
      },
      20_000
    )
    expect((await readyz(agent.adminUrl)).status).toBe(200)
    await faults(engineUrl, { wedged: true })
    const stalled = await pollUntil(
      "/readyz says the idle test got no answer",
      async () => {
        const r = await readyz(agent.adminUrl)
        return r.status === 503 && r.text.includes("test completion") ? r.text : undefined
      },
      20_000
    )
    expect(stalled).toContain(REASON)
    await agent.waitForLine((l) => l.includes(`the node is unhealthy: ${REASON}`), 5_000)
    // vLLM's liveness endpoint kept answering all along: the run was not ended
    await faults(engineUrl, { wedged: false })
    await pollUntil("ready again", async () => (await readyz(agent.adminUrl)).status === 200 || undefined, 20_000)
    await agent.waitForLine(
      (l) =>
        l.includes("the engine is no longer stalled: the engine completed a test request sent with no call in flight"),
      5_000
    )
    const status = (await (await fetch(`${agent.adminUrl}/status`)).json()) as { engine: { exits: unknown[] } }
    expect(status.engine.exits).toEqual([])
    expect((await agent.stop()).code).toBe(0)
  }, 120_000)

  // vLLM's test is pinned to each rank by the X-data-parallel-rank header, SGLang's (no P/D) by routed_dp_rank
  it.each(["vllm", "sglang"] as const)(
    "%s with two data-parallel ranks: one that hangs alone is named, and both must answer to clear it",
    async (kind) => {
      const { config, engineUrl } = await simAgentConfig({
        agent: { heartbeat: "200ms" },
        engine: {
          idle_probe_after: "1s",
          stream_idle_timeout: "2s",
          stall_restart_after: "0s",
          kind,
          command: [process.execPath, simDistEntry, "--flavor", kind]
        }
      })
      const agent = await startAgent({ config: { ...config, models: { m: { hf_repo: "org/m", dp: 2 } } } })
      await faults(engineUrl, { wedged_rank: 1 })
      const stalled = await pollUntil(
        "/readyz names the rank",
        async () => {
          const r = await readyz(agent.adminUrl)
          return r.status === 503 && r.text.includes("test completion") ? r.text : undefined
        },
        20_000
      )
      expect(stalled).toContain("got no answer from data-parallel rank 1 within 2s (engine.stream_idle_timeout)")
      await faults(engineUrl, { wedged_rank: null })
      await pollUntil("ready again", async () => (await readyz(agent.adminUrl)).status === 200 || undefined, 20_000)
      await agent.waitForLine((l) => l.includes("on each of its 2 data-parallel ranks"), 5_000)
      expect((await agent.stop()).code).toBe(0)
    },
    120_000
  )
})
