// The real llama-server's lines in the agent's log, each at llama-server's own level: a chaos soak found every line
// relayed at info (1,212 W and E lines among them), so an operator could keep all of the per-request chatter (a slot's
// launch, print_timing x4, release... for each request) or lose every engine warning with it. Here the built agent
// (dist/main.js) runs at log_level = "warn" on the real llama-server (test/real/engine.ts): llama-server's start-up
// warning (no API key: "CORS is set to allow all origins", a W line, tools/server/server.cpp) is logged at warn,
// and none of its I lines, a completion's slot lines included, is written.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { killAllAgents, requireDist, startAgent } from "../support/agent.ts"
import { agentClient, generate } from "../support/generate.ts"
import { pollUntil } from "../support/poll.ts"
import { llamaAgentConfig, type RealEngine, realEngine, serverPids, tinyModel } from "./engine.ts"

let engine: RealEngine
let dir: string

beforeAll(() => {
  requireDist()
  engine = realEngine()
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-real-levels-"))
}, 30 * 60_000)
afterAll(async () => {
  await killAllAgents()
  if (dir) fs.rmSync(dir, { recursive: true, force: true })
})

describe("the real llama-server's lines at log_level = warn", () => {
  it("its W line is logged at warn; its I lines (a request's slot lines too) are not written", async () => {
    const c = await llamaAgentConfig({ engine, model: tinyModel(engine, dir, "words"), agent: { log_level: "warn" } })
    const agent = await startAgent({ config: c.config, readyTimeoutMs: 60_000 })
    const { client, channel } = agentClient(agent.grpcAddress)
    try {
      expect((await generate(client, { prompt: "a b c", sampling: { maxTokens: 4 } }).done).error).toBeUndefined()
      const engineLines = () => agent.logs().filter((l) => l.stream !== undefined)
      const cors = await pollUntil(
        "llama-server's CORS warning in the agent's log",
        () => engineLines().find((l) => String(l.msg).includes("CORS is set to allow all origins")),
        30_000
      )
      expect(cors).toMatchObject({ level: "warn", stream: "stderr" })
      expect(String(cors.msg)).toMatch(/^\d+\.\d\d\.\d{3}\.\d{3} W srv {2}llama_server: CORS is set/)
      // the completion's slot lines (I) and every other I line: below warn, not written
      expect(engineLines().filter((l) => l.level === "info")).toEqual([])
      expect(engineLines().every((l) => l.level === "warn" || l.level === "error")).toBe(true)
    } finally {
      channel.close()
      expect((await agent.stop("SIGTERM", 30_000)).code).toBe(0)
      expect(serverPids(c.enginePort)).toEqual([])
    }
  }, 120_000)
})
