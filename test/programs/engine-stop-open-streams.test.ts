// The agent stops an engine that would wait on its open streams (llama-server often does: ggml-org/llama.cpp#18237;
// here the simulator with --sim-sigterm-waits-streams). The agent ends its calls and with them their engine requests
// before the engine's SIGTERM, so the engine exits at once on it rather than after engine.stop_grace and a SIGKILL.
// Requires dist/ (`npm run build`).
import type { Channel } from "nice-grpc"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { killAllAgents, requireDist, simAgentConfig, simDistEntry, startAgent } from "../support/agent.ts"
import { agentClient, generate } from "../support/generate.ts"

const channels: Array<Channel> = []
beforeAll(() => requireDist())
afterAll(async () => {
  for (const c of channels) c.close()
  await killAllAgents()
})

describe("an engine that waits on its open streams at SIGTERM", () => {
  it("is stopped without a SIGKILL: the agent's calls, and their engine requests, end first", async () => {
    const { config } = await simAgentConfig({
      engine: {
        kind: "llama_cpp",
        command: [process.execPath, simDistEntry, "--flavor", "llama_cpp"],
        // long enough that a kill would show: the engine waits up to 30 s for its streams' clients
        stop_grace: "20s"
      },
      simArgs: ["--sim-sigterm-waits-streams", "--sim-itl", "5ms", "--sim-mode", "random"],
      agent: { drain_timeout: "1s" }
    })
    const agent = await startAgent({ config, readyTimeoutMs: 30_000 })
    const ac = agentClient(agent.grpcAddress)
    channels.push(ac.channel)
    // about 20 s of tokens: still streaming when the agent is stopped
    const call = generate(ac.client, { prompt: "a b", sampling: { maxTokens: 4000 } })
    await call.firstDelta
    const started = Date.now()
    const exit = await agent.stop("SIGTERM", 60_000)
    expect(exit.code, agent.tail(60)).toBe(0)
    const stops = agent.logs().filter((l) => /^engine group \d+ stopped:/.test(String(l.msg)))
    expect(
      stops.map((l) => String(l.msg).replace(/\d+/, "N")),
      agent.tail(60)
    ).toEqual(["engine group N stopped: terminated"])
    // the drain's 1 s and the engine's own exit, far from stop_grace's 20 s
    expect(Date.now() - started).toBeLessThan(15_000)
    expect((await call.done).tokens()).toBeGreaterThan(0)
  }, 90_000)
})
