// listen_grpc with port 0: the OS picks the port, and the node advertises that one (in NodeHealth, and so to etcd
// and /status), never port 0, which no router can dial. Requires dist/ (`npm run build`; `npm test` builds first).
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { killAllAgents, requireDist, simAgentConfig, startAgent } from "../support/agent.ts"

beforeAll(() => requireDist())
afterEach(() => killAllAgents())
afterAll(() => killAllAgents())

describe("listen_grpc on port 0", () => {
  it("advertises the port the gRPC server bound", async () => {
    const { config } = await simAgentConfig({ agent: { listen_grpc: "127.0.0.1:0" } })
    const agent = await startAgent({ config })
    const line = await agent.waitForLine((l) => l.includes("gRPC listening"))
    const bound = (JSON.parse(line) as { address: string }).address
    expect(bound).toMatch(/^127\.0\.0\.1:[1-9]\d*$/)
    const status = (await (await fetch(`${agent.adminUrl}/status`)).json()) as { health: { advertiseAddr: string } }
    expect(status.health.advertiseAddr).toBe(bound)
    expect((await agent.stop()).code).toBe(0)
  }, 60_000)
})
