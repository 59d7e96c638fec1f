// The context one request can use, against the real llama-server: `-c 1024 -np 2` gives each slot, so each request,
// 512 tokens (tools/server/server-context.cpp n_ctx_slot), which its /v1/models says as meta.n_ctx. The built agent
// (dist/main.js) reads that once the engine is Ready: ListModels reports 512, not the configured 1024, and a max_tokens
// of 900 is refused INVALID_ARGUMENT naming 512, where llama-server would accept it and cut the answer at the slot's end.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import type { Channel } from "nice-grpc"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type AgentHandle, killAllAgents, requireDist, startAgent } from "../support/agent.ts"
import { agentClient, generate, grpcCode } from "../support/generate.ts"
import { pollUntil } from "../support/poll.ts"
import { llamaAgentConfig, type RealEngine, realEngine, tinyModel } from "./engine.ts"

let engine: RealEngine
let dir: string
const channels: Array<Channel> = []

beforeAll(() => {
  requireDist()
  engine = realEngine()
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-real-context-"))
}, 30 * 60_000)

afterAll(async () => {
  for (const c of channels) c.close()
  await killAllAgents()
  if (dir) fs.rmSync(dir, { recursive: true, force: true })
})

describe("llama-server -c 1024 -np 2: each request gets 512", () => {
  let agent: AgentHandle
  let engineUrl: string

  beforeAll(async () => {
    const c = await llamaAgentConfig({ engine, model: tinyModel(engine, dir, "words"), contextSize: 1024, slots: 2 })
    engineUrl = c.engineUrl
    agent = await startAgent({ config: c.config, readyTimeoutMs: 60_000 })
  }, 120_000)

  it("ListModels says the engine's 512; max_tokens 900 is refused INVALID_ARGUMENT naming 512", async () => {
    // llama-server's own word, which the agent reads
    const listed = (await (await fetch(`${engineUrl}/v1/models`)).json()) as {
      data: Array<{ meta: { n_ctx: number } }>
    }
    expect(listed.data[0]?.meta.n_ctx).toBe(512)
    const { client, channel } = agentClient(agent.grpcAddress)
    channels.push(channel)
    // read once the run is Ready, which /readyz may say a moment before
    const models = await pollUntil(
      "ListModels with the engine's per-request context",
      async () => {
        const r = await client.listModels({})
        return r.models[0]?.maxModelLen === 512 ? r.models : undefined
      },
      15_000
    )
    expect(models[0]).toMatchObject({ name: "tiny", maxModelLen: 512 })

    const r = await generate(client, { prompt: "the story goes", sampling: { maxTokens: 900 } }).done
    expect(grpcCode(r.error), agent.tail()).toBe("INVALID_ARGUMENT")
    expect((r.error as Error).message).toMatch(/sampling\.max_tokens 900 leaves no room .*512 tokens/)
    expect(r.deltas).toEqual([])

    // within it: served as before
    const ok = await generate(client, { prompt: "the story goes", sampling: { maxTokens: 8 } }).done
    expect(ok.error, agent.tail()).toBeUndefined()
    expect(ok.final?.usage?.completionTokens).toBe(8)
  })
})
