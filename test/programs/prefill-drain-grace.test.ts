// The built agent (`node dist/main.js run`) as a vLLM prefill node in front of the simulator, drained right after a
// prefill leg: vLLM's prefill engine keeps the leg's KV for its decode leg, which reads it from this engine after the
// leg ended (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py). The drain stopped the engine as soon
// as the last stream ended, so every decode leg still to read failed, even one sent 50 ms after the SIGTERM (a P/D
// soak). Now the engine is kept until agent.handoff_timeout after the last handoff, within drain_timeout.
// Requires dist/ (`npm run build`).
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { killAllAgents, requireDist, simAgentConfig, startAgent } from "../support/agent.ts"
import { agentClient, generate } from "../support/generate.ts"
import { freePort } from "../support/ports.ts"
import { postJson, type SimHandle, startSim } from "../support/sim.ts"

beforeAll(() => requireDist())
afterEach(() => killAllAgents())
afterAll(() => killAllAgents())

describe("a drained vLLM prefill node", () => {
  let d: SimHandle | undefined
  afterAll(async () => {
    await d?.stop()
  })

  it("keeps its engine for a decode leg sent after the SIGTERM, then exits 0 before agent.drain_timeout", async () => {
    const kvCfg = JSON.stringify({ kv_connector: "NixlConnector", kv_role: "kv_both", kv_load_failure_policy: "fail" })
    const dSide = await freePort()
    // the decode engine, which the test asks itself (the decode agent's part is not what is tested here)
    d = await startSim({
      args: ["serve", "m", "--kv-transfer-config", kvCfg, "--sim-mode", "echo"],
      env: { VLLM_NIXL_SIDE_CHANNEL_HOST: "127.0.0.1", VLLM_NIXL_SIDE_CHANNEL_PORT: String(dSide) }
    })
    const { config, grpcPort } = await simAgentConfig({
      agent: { role: "prefill", handoff_timeout: "3s", drain_timeout: "20s" },
      engine: { kv_offload: "nixl", side_channel_host: "127.0.0.1", side_channel_port: await freePort() },
      simArgs: ["--sim-mode", "echo"]
    })
    const agent = await startAgent({ config, readyTimeoutMs: 45_000 })
    const { client, channel } = agentClient(`127.0.0.1:${grpcPort}`)
    const prompt = "alpha beta gamma delta epsilon"
    try {
      const pr = await generate(client, { prompt, sampling: { maxTokens: 4, stop: [] } }).done
      expect(pr.error, agent.tail()).toBeUndefined()
      const { cgn_input_digest: _digest, ...params } = pr.final?.kvTransferParams ?? {}
      expect(params).toMatchObject({ do_remote_prefill: true, remote_host: "127.0.0.1" })
      process.kill(agent.pid, "SIGTERM")
      await agent.waitForLine((l) => l.includes("drain: keeping the engine"), 10_000)
      // the router's decode leg, after the prefill node began its drain
      const dr = await postJson(`${d.url}/v1/completions`, {
        model: "m",
        prompt,
        max_tokens: 4,
        kv_transfer_params: params
      })
      expect([dr.status, (dr.json as { choices?: Array<{ text?: string }> }).choices?.[0]?.text], dr.text).toEqual([
        200,
        "alpha beta gamma delta"
      ])
      expect(await agent.exited).toEqual({ code: 0, signal: null })
      // the grace is the handoff's, not the whole drain_timeout: the engine was stopped once it passed
      const at = (msg: string) => Date.parse(String(agent.logs().find((l) => String(l.msg).startsWith(msg))?.ts))
      const kept = at("drain: in-flight streams done; stopping the engine") - at("drain: keeping the engine")
      expect(kept, agent.tail()).toBeGreaterThan(0)
      expect(kept, "handoff_timeout's 3 s at most, not drain_timeout's 20").toBeLessThan(10_000)
    } finally {
      channel.close()
    }
  })

  it("a second signal ends the wait, said at warn", async () => {
    const { config, grpcPort } = await simAgentConfig({
      agent: { role: "prefill", handoff_timeout: "60s", drain_timeout: "60s" },
      engine: { kv_offload: "nixl", side_channel_host: "127.0.0.1", side_channel_port: await freePort() },
      simArgs: ["--sim-mode", "echo"]
    })
    const agent = await startAgent({ config, readyTimeoutMs: 45_000 })
    const { client, channel } = agentClient(`127.0.0.1:${grpcPort}`)
    try {
      const pr = await generate(client, { prompt: "alpha beta gamma delta", sampling: { maxTokens: 4, stop: [] } }).done
      expect(pr.error, agent.tail()).toBeUndefined()
      process.kill(agent.pid, "SIGTERM")
      await agent.waitForLine((l) => l.includes("drain: keeping the engine"), 10_000)
      process.kill(agent.pid, "SIGTERM")
      expect(await agent.exited).toEqual({ code: 0, signal: null })
      expect(agent.logs().map((l) => [l.level, l.msg])).toContainEqual([
        "warn",
        "drain: the wait for decode legs cut short by a second SIGTERM or SIGINT"
      ])
    } finally {
      channel.close()
    }
  })
})
