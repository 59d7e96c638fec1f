// The bytes of each flavor's answers, key for key as the engines write them (the sources are cited in
// src/sim/chunks.ts and src/sim/mlxChunks.ts):
// - mlx-lm (mlx_lm/server.py generate_response, completion_usage_response, handle_completion): no opening role
//   chunk, `: keepalive N/M` comments while the prompt is processed, `system_fingerprint` on every chunk, chat
//   deltas with role, content, reasoning and tool_calls, no logprobs key; the usage chunk "chat.completion" on
//   /v1/completions too, with prompt_tokens_details.cached_tokens, which a whole answer carries too.
// - SGLang: completion chunks are pydantic dumps (`"usage":null`, usage objects with `prompt_tokens_details: null`
//   and `reasoning_tokens: 0`, the last usage chunk without nulls); chat chunks are msgspec structs
//   (sse_utils.py: `reasoning_content` always, null; no usage key when none).
// - stream_options.continuous_usage_stats: usage on every chunk, for vLLM only with include_usage, for SGLang
//   without it too.
// - SGLang's completion request refuses max_tokens <= 0 with "max_tokens must be positive".
// Prompt words are the echo mode's tokens: "one", " two", " three".
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { getJson, pollUntil, postJson, type SimHandle, startSim } from "../support/sim.ts"

let vllm: SimHandle
let sglang: SimHandle
let mlx: SimHandle

beforeAll(async () => {
  ;[vllm, sglang, mlx] = await Promise.all([
    startSim({ flavor: "vllm", args: ["serve", "org/m"] }),
    startSim({ flavor: "sglang", args: ["--model-path", "org/sg"] }),
    startSim({ flavor: "mlx", args: ["--model", "mlx-community/tiny"] })
  ])
  await Promise.all(
    [sglang, mlx].map((s) =>
      pollUntil(async () => ((await getJson(`${s.url}/sim/state`)).json as { ready: boolean }).ready || undefined)
    )
  )
})
afterAll(() => Promise.all([vllm, sglang, mlx].map((s) => s?.stop())))

const PROMPT = "one two three"
const MESSAGES = [{ role: "user", content: PROMPT }]

/** A stream's events as sent: `data:` payloads and comments, in order, [DONE] left out. */
const events = async (sim: SimHandle, path: string, extra: Record<string, unknown>): Promise<Array<string>> => {
  const input = path.includes("chat") ? { messages: MESSAGES } : { prompt: PROMPT }
  const r = await postJson(`${sim.url}${path}`, { ...input, max_tokens: 2, ignore_eos: true, ...extra, stream: true })
  expect(r.status).toBe(200)
  return r.text
    .split("\n\n")
    .filter((e) => e !== "" && e !== "data: [DONE]")
    .map((e) => (e.startsWith("data: ") ? e.slice("data: ".length) : e))
}
/** A chunk's first choice ({} when it has none). */
const choice0 = (c: Record<string, unknown> | undefined): Record<string, unknown> =>
  ((c?.choices ?? []) as Array<Record<string, unknown>>)[0] ?? {}
const parsed = (es: Array<string>) =>
  es.filter((e) => !e.startsWith(":")).map((e) => JSON.parse(e) as Record<string, unknown>)

describe("mlx-lm wire shape (mlx_lm/server.py)", () => {
  it("a chat stream: keep-alive comments first, no role chunk, fingerprint and four-key deltas on every chunk", async () => {
    const es = await events(mlx, "/v1/chat/completions", { stream_options: { include_usage: true } })
    const comments = es.filter((e) => e.startsWith(":"))
    expect(comments.length).toBeGreaterThan(0)
    expect(comments[0]).toMatch(/^: keepalive 0\/\d+$/)
    expect(es.findIndex((e) => !e.startsWith(":"))).toBe(comments.length)
    const chunks = parsed(es)
    const body = chunks.slice(0, -1)
    for (const c of chunks) expect(Object.keys(c).slice(0, 2)).toEqual(["id", "system_fingerprint"])
    for (const c of body) {
      const choice = choice0(c)
      expect(Object.keys(choice)).toEqual(["index", "finish_reason", "delta"])
      expect(Object.keys(choice.delta as object)).toEqual(["role", "content", "reasoning", "tool_calls"])
      expect(choice.delta).toMatchObject({ role: "assistant", reasoning: "", tool_calls: [] })
    }
    // the first chunk already carries text: no opening role-only chunk
    expect(String((choice0(body[0]).delta as { content?: string } | undefined)?.content ?? "").length).toBeGreaterThan(
      0
    )
    const usage = chunks.at(-1) as { object: string; choices: unknown[]; usage: Record<string, unknown> }
    expect(usage.object).toBe("chat.completion")
    expect(usage.choices).toEqual([])
    expect(Object.keys(usage.usage)).toEqual([
      "prompt_tokens",
      "completion_tokens",
      "total_tokens",
      "prompt_tokens_details"
    ])
    expect(usage.usage.prompt_tokens_details).toEqual({ cached_tokens: expect.any(Number) })
  })

  it("a completion stream: text chunks without logprobs; its usage chunk says chat.completion", async () => {
    const chunks = parsed(await events(mlx, "/v1/completions", { stream_options: { include_usage: true } }))
    const choice = choice0(chunks[0])
    expect(Object.keys(choice)).toEqual(["index", "finish_reason", "text"])
    expect(chunks[0]?.object).toBe("text_completion")
    expect(chunks.at(-1)?.object).toBe("chat.completion")
  })

  it("a whole answer: fingerprint, a four-key message, prompt_tokens_details", async () => {
    const r = await postJson(`${mlx.url}/v1/chat/completions`, { messages: MESSAGES, max_tokens: 2 })
    const body = r.json as Record<string, unknown> & { choices: Array<Record<string, unknown>>; usage: object }
    expect(Object.keys(body)).toEqual(["id", "system_fingerprint", "object", "model", "created", "choices", "usage"])
    expect(Object.keys(body.choices[0] ?? {})).toEqual(["index", "finish_reason", "message"])
    expect(body.choices[0]?.message).toMatchObject({ role: "assistant", reasoning: "", tool_calls: [] })
    expect(body.usage).toMatchObject({ prompt_tokens_details: { cached_tokens: expect.any(Number) } })
  })
})

describe("SGLang serialization (protocol.py pydantic dumps, sse_utils.py msgspec structs)", () => {
  it("completion chunks carry usage null; the last usage chunk has reasoning_tokens and no nulls", async () => {
    const es = await events(sglang, "/v1/completions", { stream_options: { include_usage: true } })
    const chunks = parsed(es)
    for (const c of chunks.slice(0, -1)) expect(c).toHaveProperty("usage", null)
    expect(es.at(-1)).toMatch(
      /"usage":\{"prompt_tokens":\d+,"total_tokens":\d+,"completion_tokens":2,"reasoning_tokens":0\}\}$/
    )
  })

  it("chat deltas always carry reasoning_content null; no usage key; the usage chunk dumps its nulls", async () => {
    const es = await events(sglang, "/v1/chat/completions", { stream_options: { include_usage: true } })
    const chunks = parsed(es)
    const body = chunks.slice(0, -1)
    expect(body[0]?.choices).toEqual([
      {
        index: 0,
        delta: { reasoning_content: null, role: "assistant", content: "" },
        logprobs: null,
        finish_reason: null,
        matched_stop: null
      }
    ])
    for (const c of body) {
      expect(c).not.toHaveProperty("usage")
      const delta = (choice0(c).delta ?? {}) as Record<string, unknown>
      expect(Object.keys(delta)[0]).toBe("reasoning_content")
    }
    expect(choice0(body.at(-1)).delta).toEqual({ reasoning_content: null })
    expect(chunks.at(-1)?.usage).toEqual({
      prompt_tokens: expect.any(Number),
      total_tokens: expect.any(Number),
      completion_tokens: 2,
      prompt_tokens_details: null,
      reasoning_tokens: 0
    })
  })

  it("a whole chat answer: reasoning_content and tool_calls null, the usage's nulls", async () => {
    const r = await postJson(`${sglang.url}/v1/chat/completions`, { messages: MESSAGES, max_tokens: 2 })
    const body = r.json as { choices: Array<{ message: unknown }>; usage: unknown }
    expect(body.choices[0]?.message).toEqual({
      role: "assistant",
      content: expect.any(String),
      reasoning_content: null,
      tool_calls: null
    })
    expect(body.usage).toMatchObject({ prompt_tokens_details: null, reasoning_tokens: 0 })
  })

  it("a completion with max_tokens 0 is refused with the validator's text", async () => {
    const r = await postJson(`${sglang.url}/v1/completions`, { prompt: PROMPT, max_tokens: 0 })
    expect(r.status).toBe(400)
    expect(r.text).toContain("max_tokens must be positive")
  })
})

describe("stream_options.continuous_usage_stats", () => {
  const counts = (cs: Array<Record<string, unknown>>) =>
    cs.map((c) => (c.usage as { completion_tokens?: number } | undefined)?.completion_tokens)

  it("vLLM: usage on every chunk with include_usage, the opening one with 0", async () => {
    const so = { include_usage: true, continuous_usage_stats: true }
    const chat = parsed(await events(vllm, "/v1/chat/completions", { stream_options: so }))
    expect(counts(chat)).toEqual([0, 1, 2, 2])
    expect(chat[0]?.usage).toEqual({
      prompt_tokens: expect.any(Number),
      total_tokens: expect.any(Number),
      completion_tokens: 0
    })
    const completion = parsed(await events(vllm, "/v1/completions", { stream_options: so }))
    expect(counts(completion)).toEqual([1, 2, 2])
  })

  it("vLLM: nothing without include_usage", async () => {
    const chat = parsed(
      await events(vllm, "/v1/chat/completions", { stream_options: { continuous_usage_stats: true } })
    )
    for (const c of chat) expect(c).not.toHaveProperty("usage")
  })

  it("SGLang: usage on content chunks, include_usage or not", async () => {
    const so = { continuous_usage_stats: true }
    const completion = parsed(await events(sglang, "/v1/completions", { stream_options: so }))
    expect(counts(completion)).toEqual([1, 2])
    expect(completion[0]?.usage).toMatchObject({ prompt_tokens_details: null, reasoning_tokens: 0 })
    // chat: the opening and finish chunks carry none (build_sse_content without usage)
    const chat = parsed(await events(sglang, "/v1/chat/completions", { stream_options: so }))
    expect(counts(chat)).toEqual([undefined, 1, 2, undefined])
  })
})
