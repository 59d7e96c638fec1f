// A wedged prefill engine, through the built agent on the simulator. A prefill leg is one non-streaming engine
// request, which the stall watchdog cannot see move: a vLLM prefill engine that takes legs and never answers them
// (its health endpoint still green) had every leg end DEADLINE_EXCEEDED while the node stayed ready (a chaos soak's
// finding). vLLM's prefill answer does not wait for the decode peer, so such a leg is the engine's stall: the node
// is unhealthy with the reason, and the engine is restarted after engine.stall_restart_after. SGLang's prefill
// server holds a leg until its decode peer connects, so a leg that ends at handoff_timeout there says nothing
// about the engine: the node stays ready.
// Requires dist/ (`npm run build`; `npm test` builds first).
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { killAllAgents, requireDist, simAgentConfig, simDistEntry, startAgent } from "../support/agent.ts"
import { agentClient, generate, grpcCode } from "../support/generate.ts"
import { pollUntil } from "../support/poll.ts"

beforeAll(() => requireDist())
afterEach(() => killAllAgents())
afterAll(() => killAllAgents())

const status = async (adminUrl: string) =>
  (await (await fetch(`${adminUrl}/status`)).json()) as {
    engine: { exits: ReadonlyArray<{ run: number; reason: string }> }
  }

describe("a prefill node whose engine takes legs and never answers", () => {
  it("vLLM: the leg ends DEADLINE_EXCEEDED, the node is unhealthy as stalled, and the engine is restarted", async () => {
    // 2 s: the restarted (cold) simulator must answer a leg within it on a loaded CI machine
    const { config, engineUrl, grpcPort } = await simAgentConfig({
      agent: { role: "prefill", handoff_timeout: "2s" },
      engine: {
        kv_offload: "nixl",
        stream_idle_timeout: "500ms",
        stall_restart_after: "1s",
        restart_backoff_initial: "100ms"
      }
    })
    const agent = await startAgent({ config, readyTimeoutMs: 45_000 })
    const { client, channel } = agentClient(`127.0.0.1:${grpcPort}`)
    try {
      // the simulator takes each request and sends nothing, not even for a non-streaming one
      const res = await fetch(`${engineUrl}/sim/faults`, {
        method: "POST",
        body: JSON.stringify({ stallAfterTokens: 0 })
      })
      expect(res.status).toBe(200)
      const leg = await generate(client, { prompt: "alpha beta", sampling: { maxTokens: 4 } }).done
      expect(grpcCode(leg.error)).toBe("DEADLINE_EXCEEDED")
      const exit = await pollUntil(
        "the stalled run's exit in /status",
        async () => (await status(agent.adminUrl)).engine.exits[0],
        30_000
      )
      expect(exit.run).toBe(0)
      expect(exit.reason).toMatch(
        /^restarted: engine stalled: 1 prefill leg\(s\) did not finish within 2s \(\[agent\]\.handoff_timeout\) and no call has completed since, for 1s \(engine\.stall_restart_after\)$/
      )
      // the new run is a fresh simulator, without the fault: ready, and its prefill legs complete
      await pollUntil("ready again", async () => (await fetch(`${agent.adminUrl}/readyz`)).status === 200, 45_000)
      const ok = await generate(client, { prompt: "alpha beta", sampling: { maxTokens: 4 } }).done
      expect(ok.error).toBeUndefined()
      expect(await (await fetch(`${agent.adminUrl}/metrics`)).text()).toMatch(
        /^cgn_agent_engine_restart_requests_total\{source="stall"\} 1$/m
      )
    } finally {
      channel.close()
    }
    expect((await agent.stop()).code).toBe(0)
  }, 120_000)

  it("vLLM: /readyz names the stalled prefill leg while the engine is not yet due for a restart", async () => {
    const { config, engineUrl, grpcPort } = await simAgentConfig({
      agent: { role: "prefill", handoff_timeout: "500ms" },
      engine: { kv_offload: "nixl", stream_idle_timeout: "500ms", stall_restart_after: "0s" }
    })
    const agent = await startAgent({ config, readyTimeoutMs: 45_000 })
    const { client, channel } = agentClient(`127.0.0.1:${grpcPort}`)
    try {
      const fault = (f: Record<string, unknown>) =>
        fetch(`${engineUrl}/sim/faults`, { method: "POST", body: JSON.stringify(f) }).then((r) =>
          expect(r.status).toBe(200)
        )
      await fault({ stallAfterTokens: 0 })
      expect(grpcCode((await generate(client, { prompt: "alpha beta", sampling: { maxTokens: 4 } }).done).error)).toBe(
        "DEADLINE_EXCEEDED"
      )
      const readyz = await pollUntil(
        "/readyz says the engine stalled",
        async () => {
          const r = await fetch(`${agent.adminUrl}/readyz`)
          const text = await r.text()
          return r.status === 503 && text.includes("engine stalled") ? text : undefined
        },
        30_000
      )
      expect(readyz).toContain("engine stalled: 1 prefill leg(s) did not finish within 500ms ([agent].handoff_timeout)")
      // the engine recovers: the agent's own test completion clears the stall, with no call coming
      await fault({ stallAfterTokens: null })
      await pollUntil("ready again", async () => (await fetch(`${agent.adminUrl}/readyz`)).status === 200, 30_000)
      expect((await status(agent.adminUrl)).engine.exits).toEqual([])
    } finally {
      channel.close()
    }
    expect((await agent.stop()).code).toBe(0)
  }, 120_000)

  it("SGLang: a leg whose decode peer never comes ends DEADLINE_EXCEEDED and the node stays ready", async () => {
    const { config, grpcPort } = await simAgentConfig({
      agent: { role: "prefill", handoff_timeout: "500ms" },
      engine: {
        kind: "sglang",
        command: [process.execPath, simDistEntry, "--flavor", "sglang"],
        stream_idle_timeout: "500ms",
        stall_restart_after: "1s"
      }
    })
    const agent = await startAgent({ config, readyTimeoutMs: 45_000 })
    const { client, channel } = agentClient(`127.0.0.1:${grpcPort}`)
    try {
      const bootstrap = { host: "127.0.0.1", port: 1, room: "7" }
      const leg = await generate(client, { prompt: "alpha beta", sampling: { maxTokens: 4 }, bootstrap }).done
      expect(grpcCode(leg.error)).toBe("DEADLINE_EXCEEDED")
      // A stall is taken before the leg's status is written (EngineLegs.ts), and /readyz reads it live: had this leg
      // been taken as one, the node would read unhealthy now.
      const readyz = await fetch(`${agent.adminUrl}/readyz`)
      expect(readyz.status, await readyz.text()).toBe(200)
    } finally {
      channel.close()
    }
    expect((await agent.stop()).code).toBe(0)
  }, 120_000)
})
