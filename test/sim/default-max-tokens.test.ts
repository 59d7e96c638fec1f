// A request that names no max_tokens gets its engine's default (src/sim/contextLimit.ts unnamedMaxTokens): vLLM's
// chat the rest of the context (vllm/entrypoints/utils.py get_max_tokens), SGLang's chat what its scheduler leaves
// of 1 << 30 (scheduler.py init_req_max_new_tokens), and the completions of both CompletionRequest's 16, which their
// context checks count as named.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { sglangSchedulerFit } from "../../src/sim/sglangSchedulerBound.ts"
import { postJson, type SimHandle, startSim } from "../support/sim.ts"

const CONTEXT = 64
const chat = { model: "m", messages: [{ role: "user", content: "one two three four five" }] }
type Answer = { usage: { prompt_tokens: number; completion_tokens: number }; choices: Array<{ finish_reason: string }> }

describe.each([
  ["vllm", ["serve", "m", "--max-model-len", String(CONTEXT)]],
  ["sglang", ["--model-path", "m", "--context-length", String(CONTEXT)]]
] as const)("%s without max_tokens", (flavor, args) => {
  let s: SimHandle
  beforeAll(async () => {
    s = await startSim({ flavor, args: [...args, "--sim-mode", "random"] })
  })
  afterAll(() => s?.stop(200))

  it("a chat generates to its engine's bound, not 16", async () => {
    const r = await postJson(`${s.url}/v1/chat/completions`, chat)
    expect(r.status).toBe(200)
    const { usage, choices } = r.json as Answer
    const input = usage.prompt_tokens
    // vLLM: max_model_len - input; SGLang: 1 << 30 capped by its scheduler (its KV pool: 4096 blocks of 1 token)
    const fit = sglangSchedulerFit(CONTEXT, 4096, 1, input, 2 ** 30, false)
    const expected = flavor === "vllm" ? CONTEXT - input : "maxTokens" in fit ? fit.maxTokens : -1
    expect([usage.completion_tokens, choices[0]?.finish_reason]).toEqual([expected, "length"])
    expect(expected).toBeGreaterThan(16)
  })

  it("a completion generates CompletionRequest's 16", async () => {
    const r = await postJson(`${s.url}/v1/completions`, { model: "m", prompt: "one two three" })
    expect(r.status).toBe(200)
    expect((r.json as Answer).usage.completion_tokens).toBe(16)
  })

  it("a completion's default 16 counts in the context check, as a named max_tokens does", async () => {
    const prompt = Array.from({ length: CONTEXT - 10 }, (_, i) => `w${i}`).join(" ")
    const r = await postJson(`${s.url}/v1/completions`, { model: "m", prompt })
    expect(r.status).toBe(400)
    expect(JSON.stringify(r.json)).toMatch(flavor === "vllm" ? /is too large: 16\b/ : /exceeds the model's maximum/)
  })
})
