// engine.api_key against the real llama-server: spawned, the agent hands the key over (LLAMA_API_KEY) and the server
// then refuses anyone without it, while the agent's probe, calls, /metrics read and model list carry it; proxied
// (openai_compat in front of a llama-server started with --api-key), an agent without the key is told why it is not
// ready, and one with it serves.
import type { ChildProcess } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import type { Channel } from "nice-grpc"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { parsePromText } from "../../src/services/engine/PromText.ts"
import { killAllAgents, requireDist, startAgent } from "../support/agent.ts"
import { agentClient, generate } from "../support/generate.ts"
import { pollUntil } from "../support/poll.ts"
import { freePorts } from "../support/ports.ts"
import { llamaAgentConfig, type RealEngine, realEngine, startLlamaServer, tinyModel } from "./engine.ts"

const KEY = "sk-real-engine-key-1"
let engine: RealEngine
let dir: string
let model: string
const channels: Array<Channel> = []
const servers: Array<ChildProcess> = []

beforeAll(async () => {
  requireDist()
  engine = realEngine()
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-real-key-"))
  model = tinyModel(engine, dir, "words")
}, 30 * 60_000)

afterAll(async () => {
  for (const c of channels) c.close()
  await killAllAgents()
  for (const s of servers) s.kill("SIGKILL")
  if (dir) fs.rmSync(dir, { recursive: true, force: true })
})

const get = async (url: string, key?: string) => {
  const res = await fetch(url, key === undefined ? {} : { headers: { authorization: `Bearer ${key}` } })
  return [res.status, await res.text()] as const
}

const UNAUTHORIZED = '{"error":{"message":"Invalid API Key","type":"authentication_error","code":401}}'

describe("a spawned llama-server given engine.api_key", () => {
  it("refuses everyone without the key, and the agent, which has it, is ready, serves and reads its metrics", async () => {
    const c = await llamaAgentConfig({ engine, model, engineSection: { api_key: KEY } })
    // Ready means the readiness probe (GET /v1/models, which the key guards) got 200.
    const agent = await startAgent({ config: c.config, readyTimeoutMs: 60_000 })
    expect(await get(`${c.engineUrl}/v1/models`)).toEqual([401, UNAUTHORIZED])
    expect((await get(`${c.engineUrl}/v1/models`, KEY))[0]).toBe(200)
    expect((await get(`${c.engineUrl}/health`))[0]).toBe(200)

    const { client, channel } = agentClient(agent.grpcAddress)
    channels.push(channel)
    const call = await generate(client, { prompt: "the quick", sampling: { maxTokens: 4 } }).done
    expect([call.error, call.final?.finishReason, call.tokens()]).toEqual([undefined, "length", 4])

    // the load read (llama-server's /metrics, guarded too) and the served context (its model list) got through
    await pollUntil("the engine's load in the agent's /metrics", async () =>
      parsePromText(await (await fetch(`${agent.adminUrl}/metrics`)).text()).some(
        (s) => s.name === "cgn_agent_engine_running_requests"
      )
    )
    await agent.waitForLine((l) => l.includes("the engine says the context one request can use"))
    expect(agent.stderrLines.join("\n")).not.toContain(KEY)
    await agent.stop()
  })
})

describe("openai_compat in front of a llama-server started with --api-key", () => {
  let url: string
  beforeAll(async () => {
    const server = await startLlamaServer(engine, model, ["--api-key", KEY])
    servers.push(server.process)
    url = server.url
  }, 90_000)

  const proxied = async (key?: string) => {
    const [grpcPort, adminPort] = (await freePorts(2)) as [number, number]
    return startAgent({
      config: {
        agent: { listen_grpc: `127.0.0.1:${grpcPort}`, listen_admin: `127.0.0.1:${adminPort}`, state_dir: "state" },
        engine: { kind: "openai_compat", url, ...(key === undefined ? {} : { api_key: key }) },
        models: { tiny: { path: model } }
      },
      awaitReady: key !== undefined,
      readyTimeoutMs: 30_000
    })
  }

  it("without the key: not ready, in phase unauthorized, and the log says the engine asks for one", async () => {
    const agent = await proxied()
    await pollUntil("phase unauthorized in /status", async () => {
      const s = (await (await fetch(`${agent.adminUrl}/status`)).json()) as {
        engine?: { state?: { phase?: string } }
        health?: { engine?: { detail?: string } }
      }
      return s.engine?.state?.phase === "unauthorized" && s.health?.engine?.detail?.startsWith("unauthorized for ")
    })
    await agent.waitForLine((l) => l.includes("(HTTP 401: the engine asks for an API key: set engine.api_key)"))
    expect((await fetch(`${agent.adminUrl}/readyz`)).status).toBe(503)
    await agent.stop()
  })

  it("with it: ready, and Generate is served", async () => {
    const agent = await proxied(KEY)
    const { client, channel } = agentClient(agent.grpcAddress)
    channels.push(channel)
    const call = await generate(client, { prompt: "the quick", sampling: { maxTokens: 3 } }).done
    expect([call.error, call.tokens()]).toEqual([undefined, 3])
    await agent.stop()
  })
})
