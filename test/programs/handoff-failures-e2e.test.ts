// The built agent (`node dist/main.js run`) as a vLLM decode node in front of the simulator, its decode legs reading
// from a prefill node that is gone (crashed, drained: its NIXL side channel refuses). Each leg fails at its KV load
// before any token (UNAVAILABLE, retried as a new pair), but the node's engine is sound. They were counted toward
// engine.failed_calls_unhealthy as the engine's: five took the node out of traffic, and a prefill node crashing again
// and again held every decode node it served out for flapping, minutes each (a P/D soak). Now the engine's own test
// judges them: it completes, the node stays ready. Requires dist/ (`npm run build`).
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { killAllAgents, requireDist, simAgentConfig, startAgent } from "../support/agent.ts"
import { agentClient, generate, grpcCode } from "../support/generate.ts"
import { PREFILL_PARAMS } from "../support/nixlParams.ts"
import { freePort } from "../support/ports.ts"

beforeAll(() => requireDist())
afterEach(() => killAllAgents())
afterAll(() => killAllAgents())

describe("decode legs whose prefill node is gone", () => {
  it("each ends UNAVAILABLE as a new pair's, the node stays ready: the engine completed its own test", async () => {
    const { config, grpcPort } = await simAgentConfig({
      agent: { role: "decode" },
      engine: { kv_offload: "nixl", side_channel_port: await freePort() }
    })
    const agent = await startAgent({ config, readyTimeoutMs: 45_000 })
    const { client, channel } = agentClient(`127.0.0.1:${grpcPort}`)
    try {
      const gone = await freePort()
      const kvTransferParams = { ...PREFILL_PARAMS, remote_host: "127.0.0.1", remote_port: gone }
      for (let i = 0; i < 5; i++) {
        const r = await generate(client, { prompt: "a b c d", sampling: { maxTokens: 4 }, kvTransferParams }).done
        expect(grpcCode(r.error), agent.tail()).toBe("UNAVAILABLE")
        expect(r.deltas).toEqual([])
      }
      await agent.waitForLine(
        (l) =>
          l.includes(
            "5 decode legs in a row failed before their first token, and the engine completed a test request of its own"
          ),
        30_000
      )
      const ready = await fetch(`${agent.adminUrl}/readyz`)
      expect([ready.status, await ready.text()]).toEqual([200, "ready"])
      expect(agent.tail()).not.toContain("the node is unhealthy")
    } finally {
      channel.close()
    }
  })
})
