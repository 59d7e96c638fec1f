// The built agent (`node dist/main.js run`) in front of the simulator as an SGLang decode server, stalled: the
// stall watchdog's test completion must be one a decode server serves with no prefill peer. A plain request is
// refused there ("bootstrap_host, bootstrap_port and bootstrap_room are required in decode mode"), so before the
// fix such a node, once stalled, stayed unhealthy until its engine restarted (routers send it nothing). The probe
// names SGLang's fake bootstrap host as SGLang's own warm-up does (layers/engine/stallProbe.ts,
// Engine.capabilities.peerlessFields). Requires dist/ (`npm run build`).
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { killAllAgents, requireDist, simAgentConfig, simDistEntry, startAgent } from "../support/agent.ts"
import { agentClient, generate, grpcCode } from "../support/generate.ts"
import { pollUntil } from "../support/poll.ts"
import { freePort } from "../support/ports.ts"
import { postJson, type SimHandle, startSim } from "../support/sim.ts"

beforeAll(() => requireDist())
afterEach(() => killAllAgents())
afterAll(() => killAllAgents())

describe("a stalled SGLang decode node", () => {
  it("becomes ready again by itself once the engine recovers, with no call made", async () => {
    const bootPort = await freePort()
    // The prefill engine of the one real hand-off, which the test sends straight to it (the router's prefill leg).
    const prefill: SimHandle = await startSim({
      args: [
        "--model-path",
        "m",
        "--disaggregation-mode",
        "prefill",
        "--disaggregation-transfer-backend",
        "mooncake",
        "--disaggregation-bootstrap-port",
        String(bootPort),
        "--sim-mode",
        "echo"
      ]
    })
    const { config, engineUrl, grpcPort } = await simAgentConfig({
      agent: { role: "decode" },
      engine: {
        kind: "sglang",
        command: [process.execPath, simDistEntry, "--flavor", "sglang"],
        stream_idle_timeout: "500ms"
      }
    })
    const { client, channel } = agentClient(`127.0.0.1:${grpcPort}`)
    const faults = (f: Record<string, unknown>) =>
      fetch(`${engineUrl}/sim/faults`, { method: "POST", body: JSON.stringify(f) }).then((r) =>
        expect(r.status).toBe(200)
      )
    try {
      await prefill.waitForLine((l) => l.includes('"model loaded"'))
      const agent = await startAgent({ config, readyTimeoutMs: 45_000 })
      await faults({ stallAfterTokens: 3 })

      // Both legs of one request with the same room: the decode leg through the agent stalls after 3 tokens.
      const prompt = Array.from({ length: 40 }, (_, i) => `w${i}`).join(" ")
      const room = 4242
      const prefillLeg = postJson(`${prefill.url}/v1/completions`, {
        model: "m",
        prompt,
        max_tokens: 1,
        bootstrap_host: "127.0.0.1",
        bootstrap_port: bootPort,
        bootstrap_room: room
      })
      const stalled = await generate(client, {
        prompt,
        sampling: { maxTokens: 50 },
        bootstrap: { host: "127.0.0.1", port: bootPort, room: String(room) }
      }).done
      expect(grpcCode(stalled.error), `${JSON.stringify(stalled.final)}\n${agent.tail()}`).toBe("UNAVAILABLE")
      expect((await prefillLeg).status).toBe(200)
      await pollUntil(
        "/readyz says the engine stalled",
        async () => {
          const res = await fetch(`${agent.adminUrl}/readyz`)
          return res.status === 503 && (await res.text()).includes("engine stalled") ? true : undefined
        },
        30_000
      )
      // the probe is taken and fails while the engine still stalls every stream
      await agent.waitForLine((l) => l.includes("the engine failed a test request sent with no call in flight"), 30_000)
      expect((await fetch(`${agent.adminUrl}/readyz`)).status).toBe(503)

      // the engine recovers; no call comes: the decode server's answer to the agent's own probe clears the stall
      await faults({ stallAfterTokens: null })
      await pollUntil(
        "ready again",
        async () => ((await fetch(`${agent.adminUrl}/readyz`)).status === 200 ? true : undefined),
        20_000
      ).catch((e: unknown) => {
        throw new Error(`${String(e)}\n${agent.tail()}`)
      })
      await agent.waitForLine(
        (l) =>
          l.includes(
            "the engine is no longer stalled: the engine completed a test request sent with no call in flight"
          ),
        1_000
      )
      expect((await agent.stop()).code).toBe(0)
    } finally {
      channel.close()
      await prefill.stop()
    }
  }, 120_000)
})
