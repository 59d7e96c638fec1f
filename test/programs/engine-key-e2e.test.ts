// engine.api_key end to end on the built agent with the simulator as vLLM (the key in VLLM_API_KEY) and as SGLang (on
// its --api-key): the engine refuses a caller without the key, and the agent, which hands it over and sends it, is
// ready and serves. The real llama-server's case: test/real/llama-cpp-api-key.test.ts.
import type { Channel } from "nice-grpc"
import { afterAll, describe, expect, it } from "vitest"
import { killAllAgents, requireDist, simAgentConfig, simDistEntry, startAgent } from "../support/agent.ts"
import { agentClient, generate } from "../support/generate.ts"

const KEY = "sk-sim-engine-key"
const channels: Array<Channel> = []

afterAll(async () => {
  for (const c of channels) c.close()
  await killAllAgents()
})

describe.each(["vllm", "sglang"] as const)("%s given engine.api_key", (flavor) => {
  it("refuses a caller without the key; the agent has it, is ready and serves", async () => {
    requireDist()
    const c = await simAgentConfig({
      engine: { kind: flavor, command: [process.execPath, simDistEntry, "--flavor", flavor], api_key: KEY }
    })
    const agent = await startAgent({ config: c.config })
    const models = (key?: string) =>
      fetch(`${c.engineUrl}/v1/models`, key === undefined ? {} : { headers: { authorization: `Bearer ${key}` } })
    expect((await models()).status).toBe(401)
    expect((await models("other")).status).toBe(401)
    expect((await models(KEY)).status).toBe(200)
    const { client, channel } = agentClient(agent.grpcAddress)
    channels.push(channel)
    const call = await generate(client, { prompt: "a b c", sampling: { maxTokens: 3 } }).done
    expect([call.error, call.tokens()]).toEqual([undefined, 3])
    expect(agent.stderrLines.join("\n")).not.toContain(KEY)
    await agent.stop()
  })
})
