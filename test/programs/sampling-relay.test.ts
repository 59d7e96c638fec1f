// Generate with `sampling.stop` through the built agent (`node dist/main.js run`) to the built simulator, no
// etcd: the agent relays the stop strings, and the engine's answer (its text cut before the stop, finish
// "stop", its own field naming the stop: vLLM `stop_reason`, SGLang `matched_stop`, mlx-lm none) reaches the
// caller as the text before the stop and finish_reason "stop"; and `sampling.top_k` -1 ("off") reaches each engine
// as a value it takes (mlx-lm refuses -1 and closes the connection unanswered: the agent sends it 0). Requires dist/
// (`npm run build`).
import type { Channel } from "nice-grpc"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { killAllAgents, requireDist, simAgentConfig, simDistEntry, startAgent } from "../support/agent.ts"
import { runCli } from "../support/cli.ts"
import { agentClient, generate } from "../support/generate.ts"

const channels: Array<Channel> = []
beforeAll(() => requireDist())
afterAll(async () => {
  for (const c of channels) c.close()
  await killAllAgents()
})

const PROMPT = "one two three four five"

/**
 * Tokens the engine counts up to the stop (vLLM and SGLang count the stopping token, mlx-lm drops the stop's), and
 * whether the engine names the stop string (vLLM stop_reason, SGLang matched_stop), which the final message carries.
 */
describe.each([
  ["vllm", 3, true],
  ["sglang", 3, true],
  ["mlx", 2, false]
] as const)("%s", (kind, completionTokens, named) => {
  let client: ReturnType<typeof agentClient>["client"]
  let address = ""
  beforeAll(async () => {
    const engine = { kind, command: [process.execPath, simDistEntry, "--flavor", kind] }
    const c = await simAgentConfig({ engine })
    const agent = await startAgent({ config: c.config, readyTimeoutMs: 30_000 })
    address = agent.grpcAddress
    const ac = agentClient(agent.grpcAddress)
    channels.push(ac.channel)
    client = ac.client
  })

  it("a prompt with sampling.stop ends with finish_reason stop and the text before the stop", async () => {
    const r = await generate(client, { prompt: PROMPT, sampling: { maxTokens: 20, stop: [" three"] } }).done
    expect(r.error).toBeUndefined()
    expect(r.text()).toBe("one two")
    expect(r.final?.finishReason).toBe("stop")
    expect(r.final?.usage?.completionTokens).toBe(completionTokens)
    expect(r.final?.stopSequence).toBe(named ? " three" : "")
  })

  it("chat too, with several stop strings", async () => {
    const messages = [{ role: "user", content: PROMPT }]
    const r = await generate(client, { chat: { messages }, sampling: { maxTokens: 20, stop: ["zzz", " four"] } }).done
    expect(r.error).toBeUndefined()
    expect([r.text(), r.final?.finishReason, r.final?.stopSequence]).toEqual([
      "one two three",
      "stop",
      named ? " four" : ""
    ])
  })

  it("top_k -1 (off) and 40 are served", async () => {
    for (const topK of [-1, 40]) {
      const r = await generate(client, { prompt: PROMPT, sampling: { maxTokens: 2, topK } }).done
      expect(r.error, `top_k ${topK}`).toBeUndefined()
      expect(r.text()).toBe("one two")
    }
  })

  it("a call that runs to its length names no stop sequence", async () => {
    const r = await generate(client, { prompt: PROMPT, sampling: { maxTokens: 2, stop: ["zzz"] } }).done
    expect([r.final?.finishReason, r.final?.stopSequence]).toEqual(["length", ""])
  })

  it("cgn-agent generate --stop: the text before the stop on stdout, the stop named in the summary", async () => {
    const r = await runCli([
      "generate",
      "--addr",
      address,
      "--prompt",
      PROMPT,
      "--max-tokens",
      "20",
      "--stop",
      " three"
    ])
    expect(r.code, r.stderr).toBe(0)
    expect(r.stdout).toBe("one two\n")
    expect(r.stderr).toContain("finish stop")
    expect(r.stderr.includes('at stop " three"')).toBe(named)
  })
})
