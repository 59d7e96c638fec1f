// openai_compat in front of a real llama-server someone else runs, told what it is (engine.proxied_kind =
// "llama_cpp"): the agent speaks to it as to the llama-server it spawns. Told nothing, it speaks as to a generic
// OpenAI server: a repetition penalty goes out as `repetition_penalty`, which llama-server ignores without a word,
// and its output parser's 500 counts against the node. Found by a differential of the two agent kinds on one binary.
// Told, the agent also reads the server's /metrics by llama-server's series, as for the llama-server it spawns.
import type { ChildProcess } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { type Channel, ClientError, Metadata, Status } from "nice-grpc"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { ProxiedKind } from "../../src/services/config/Config.ts"
import { parsePromText } from "../../src/services/engine/PromText.ts"
import { killAllAgents, requireDist, startAgent } from "../support/agent.ts"
import { agentClient, generate } from "../support/generate.ts"
import { pollUntil } from "../support/poll.ts"
import { freePorts } from "../support/ports.ts"
import { engineMetric, type RealEngine, realEngine, startLlamaServer, tinyModel } from "./engine.ts"

let engine: RealEngine
let dir: string
let model: string
let server: { readonly url: string; readonly process: ChildProcess }
const channels: Array<Channel> = []

beforeAll(async () => {
  requireDist()
  engine = realEngine()
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-real-compat-"))
  model = tinyModel(engine, dir, "words")
  server = await startLlamaServer(engine, model, ["-np", "1", "--metrics"])
}, 30 * 60_000)

afterAll(async () => {
  for (const c of channels) c.close()
  await killAllAgents()
  server?.process.kill("SIGKILL")
  if (dir) fs.rmSync(dir, { recursive: true, force: true })
})

const proxy = async (proxiedKind?: ProxiedKind, url = server.url, engineKeys: Record<string, string> = {}) => {
  const [grpcPort, adminPort] = (await freePorts(2)) as [number, number]
  const agent = await startAgent({
    config: {
      agent: {
        listen_grpc: `127.0.0.1:${grpcPort}`,
        listen_admin: `127.0.0.1:${adminPort}`,
        state_dir: "state",
        heartbeat: "300ms"
      },
      engine: {
        kind: "openai_compat",
        url,
        failed_calls_unhealthy: 2,
        ...engineKeys,
        ...(proxiedKind === undefined ? {} : { proxied_kind: proxiedKind })
      },
      models: { tiny: { path: model } }
    },
    readyTimeoutMs: 30_000
  })
  const { client, channel } = agentClient(agent.grpcAddress)
  channels.push(channel)
  return { agent, client }
}

/** The repetition penalty llama-server's one slot last ran with (its /slots shows each slot's sampling). */
const slotPenalty = async (): Promise<number | undefined> => {
  const slots = (await (await fetch(`${server.url}/slots`)).json()) as Array<{ params?: { repeat_penalty?: number } }>
  return slots[0]?.params?.repeat_penalty
}

// this model, greedy, generates a lone UTF-8 continuation byte here (llama-cpp.test.ts)
const UNPARSABLE = {
  prompt: "😀".repeat(30),
  sampling: { maxTokens: 5, temperature: 0, frequencyPenalty: -2, presencePenalty: 1.5 }
}

describe("openai_compat with engine.proxied_kind = llama_cpp", () => {
  it("sends the repetition penalty as llama-server reads it; unnamed, the server never sees it", async () => {
    const named = await proxy("llama_cpp")
    const r = await generate(named.client, { prompt: "the quick", sampling: { maxTokens: 2, repetitionPenalty: 1.7 } })
      .done
    expect(r.error).toBeUndefined()
    expect(await slotPenalty()).toBeCloseTo(1.7, 5)
    await named.agent.stop()

    const generic = await proxy()
    const g = await generate(generic.client, {
      prompt: "the quick",
      sampling: { maxTokens: 2, repetitionPenalty: 1.7 }
    }).done
    expect(g.error).toBeUndefined()
    expect(await slotPenalty()).toBe(1)
    await generic.agent.stop()
  })

  it("ends llama-server's output-parser failure as the request's (engine_output), and stays ready", async () => {
    const { agent, client } = await proxy("llama_cpp")
    for (let i = 0; i < 3; i++) {
      let trailer = new Metadata()
      const r = await generate(client, UNPARSABLE, { onTrailer: (t) => (trailer = t) }).done
      expect(r.error).toBeInstanceOf(ClientError)
      expect(Status[(r.error as ClientError).code]).toBe("INTERNAL")
      expect([trailer.get("cgn-reason"), trailer.get("cgn-retryable")]).toEqual(["engine_output", "false"])
    }
    // three in a row with engine.failed_calls_unhealthy = 2
    expect((await fetch(`${agent.adminUrl}/readyz`)).status).toBe(200)
    await agent.stop()
  })

  it("reads llama-server's /metrics by its series: one slot running one call, deferring the other", async () => {
    const { agent, client } = await proxy("llama_cpp")
    const aborts = [new AbortController(), new AbortController()]
    const calls = aborts.map(
      (a) => generate(client, { prompt: "the quick", sampling: { maxTokens: 1500 } }, { signal: a.signal }).done
    )
    try {
      await pollUntil(
        "llama-server: 1 processing, 1 deferred",
        async () =>
          (await engineMetric(server.url, "llamacpp:requests_processing")) === 1 &&
          (await engineMetric(server.url, "llamacpp:requests_deferred")) === 1,
        20_000
      )
      // told nothing, the agent would show its own two calls as running and none waiting
      await pollUntil("the agent's /metrics: engine running 1, waiting 1", async () => {
        const m = parsePromText(await (await fetch(`${agent.adminUrl}/metrics`)).text())
        const value = (name: string) => m.find((x) => x.name === name)?.value
        return value("cgn_agent_engine_running_requests") === 1 && value("cgn_agent_engine_waiting_requests") === 1
      })
    } finally {
      for (const a of aborts) a.abort()
      await Promise.all(calls)
    }
    await agent.stop()
  })

  it("a llama-server started without --metrics: warned in its own words, and the agent's count stands", async () => {
    const bare = await startLlamaServer(engine, model, ["-np", "1"])
    try {
      const { agent, client } = await proxy("llama_cpp", bare.url)
      const warned = () => agent.stderrLines.filter((l) => l.includes("engine metrics scrape failed"))
      await pollUntil("the scrape's warning", async () => warned().length > 0)
      expect(warned()[0]).toContain("HTTP 501")
      expect(warned()[0]).toContain("Start it with `--metrics`")
      const r = await generate(client, { prompt: "the quick", sampling: { maxTokens: 2 } }).done
      expect(r.error).toBeUndefined()
      // the failing scrapes leave the load to the agent's own count (engineLoad.ts logs one line per spell)
      const m = parsePromText(await (await fetch(`${agent.adminUrl}/metrics`)).text())
      expect(m.find((x) => x.name === "cgn_agent_engine_running_requests")?.value).toBe(0)
      expect((await fetch(`${agent.adminUrl}/readyz`)).status).toBe(200)
      await agent.stop()
    } finally {
      bare.process.kill("SIGKILL")
    }
  })

  it("its idle test completion is llama-server's (ignore_eos, so an early end cannot pass for a working engine)", async () => {
    const { agent } = await proxy("llama_cpp", server.url, { idle_probe_after: "1s" })
    // the slot shows the last task's sampling: the test's 16 tokens, generated whatever the model's end
    await pollUntil("the idle test on llama-server's slot", async () => {
      const slots = (await (await fetch(`${server.url}/slots`)).json()) as Array<{
        params?: { ignore_eos?: boolean; n_predict?: number }
      }>
      return slots[0]?.params?.n_predict === 16 && slots[0].params.ignore_eos === true
    })
    await agent.stop()
  })
})
