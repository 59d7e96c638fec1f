// SGLang's --allow-auto-truncate, as TokenizerManager._validate_one_request has it (sgl-project/sglang
// python/sglang/srt/managers/tokenizer_manager.py; src/sim/contextLimit.ts): a prompt of the whole context or more is
// cut to its first context-length tokens, and a max_tokens past what is left cut to it, each with its warning,
// where without the flag both are refused 400; and the total check's bound, `>` since sgl-project/sglang#22546 (a
// request filling the context exactly is served). The simulators run with --context-length 16: the scheduler's own,
// stricter bound comes after these (an input of context - 6 tokens or more aborted or cut again, max_new_tokens capped
// at context - input - 2: sglang-scheduler-bound.test.ts), so every request here also meets it.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { parseArgs } from "../../src/sim/args.ts"
import { contextFit } from "../../src/sim/contextLimit.ts"
import { getJson, pollUntil, postJson, type SimHandle, startSim } from "../support/sim.ts"

const prompt = (n: number) => Array.from({ length: n }, (_, i) => `w${i}`).join(" ")

describe("the flag (pure)", () => {
  it("SGLang's command line takes --allow-auto-truncate as a flag of its own; other flavors leave it unmodelled", () => {
    const on = parseArgs(["--flavor", "sglang", "--allow-auto-truncate", "--context-length", "8"])
    expect([on.allowAutoTruncate, on.maxModelLen, on.unmodelled]).toEqual([true, 8, []])
    expect(parseArgs(["--flavor", "sglang"]).allowAutoTruncate).toBe(false)
    const vllm = parseArgs(["--flavor", "vllm", "serve", "m", "--allow-auto-truncate"])
    expect([vllm.allowAutoTruncate, vllm.unmodelled]).toEqual([false, ["--allow-auto-truncate"]])
  })

  it("contextFit: what is kept, with and without the flag", () => {
    expect(contextFit("sglang", 8, 5, 3, false)).toEqual({ keep: 5, maxTokens: 3, warnings: [] })
    expect(contextFit("sglang", 8, 5, 4, false)).toMatchObject({ param: null })
    expect(contextFit("sglang", 8, 12, undefined, false, true)).toEqual({
      keep: 8,
      maxTokens: undefined,
      warnings: ["The input (12 tokens) is longer than the model's context length (8 tokens). Truncating the input."]
    })
    expect(contextFit("sglang", 8, 5, 3, false, true)).toEqual({ keep: 5, maxTokens: 3, warnings: [] })
  })
})

let plain: SimHandle
let truncating: SimHandle

beforeAll(async () => {
  ;[plain, truncating] = await Promise.all([
    startSim({ flavor: "sglang", args: ["--model-path", "org/sg", "--context-length", "16"] }),
    startSim({ flavor: "sglang", args: ["--model-path", "org/sg", "--context-length", "16", "--allow-auto-truncate"] })
  ])
  await Promise.all(
    [plain, truncating].map((s) =>
      pollUntil(async () => ((await getJson(`${s.url}/sim/state`)).json as { ready: boolean }).ready || undefined)
    )
  )
})
afterAll(() => Promise.all([plain, truncating].map((s) => s?.stop())))

interface Completion {
  readonly choices: ReadonlyArray<{
    readonly text?: string
    readonly message?: { content: string }
    finish_reason: string
  }>
  readonly usage: { readonly prompt_tokens: number; readonly completion_tokens: number }
}

const warned = (s: SimHandle, text: string) =>
  s.waitForLine((l) => l.includes(JSON.stringify(text).slice(1, -1)), 5_000)

describe("without the flag", () => {
  it("a request filling the context exactly is served; one token more is refused", async () => {
    const fits = await postJson(`${plain.url}/v1/completions`, { prompt: prompt(9), max_tokens: 7 })
    expect(fits.status).toBe(200)
    const over = await postJson(`${plain.url}/v1/completions`, { prompt: prompt(9), max_tokens: 8 })
    expect([over.status, (over.json as { message: string }).message]).toEqual([
      400,
      "Requested token count exceeds the model's maximum context length of 16 tokens. You requested a total of 17 tokens: 9 tokens from the input messages and 8 tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit."
    ])
  })

  it("a prompt of the whole context is refused", async () => {
    const r = await postJson(`${plain.url}/v1/completions`, { prompt: prompt(20), max_tokens: 1 })
    expect([r.status, (r.json as { message: string }).message]).toEqual([
      400,
      "The input (20 tokens) is longer than the model's context length (16 tokens)."
    ])
  })
})

describe("with --allow-auto-truncate", () => {
  it("a prompt past the context is cut to its first 16 tokens, logged (then to 10 by the scheduler); a chat with no max_tokens is not checked for it", async () => {
    const r = await postJson(`${truncating.url}/v1/chat/completions`, {
      messages: [{ role: "user", content: prompt(20) }]
    })
    expect(r.status).toBe(200)
    const body = r.json as Completion
    // 16 tokens leave the scheduler no room to generate (max_new_tokens capped at 16 - 16 - 2, so 0)
    expect([body.usage.prompt_tokens, body.usage.completion_tokens, body.choices[0]?.message?.content]).toEqual([
      10,
      0,
      ""
    ])
    await warned(
      truncating,
      "The input (20 tokens) is longer than the model's context length (16 tokens). Truncating the input."
    )
    await warned(
      truncating,
      "Request length is longer than the KV cache pool size or the max context length. Truncated. len(req.origin_input_ids)=16, max_req_input_len=10."
    )
  })

  it("max_tokens past what is left is cut to it, logged: 9 input + 10 new gives 7, then the scheduler's 5", async () => {
    const r = await postJson(`${truncating.url}/v1/completions`, {
      prompt: prompt(9),
      max_tokens: 10,
      ignore_eos: true
    })
    expect(r.status).toBe(200)
    const body = r.json as Completion
    expect([body.usage.prompt_tokens, body.usage.completion_tokens, body.choices[0]?.finish_reason]).toEqual([
      9,
      5,
      "length"
    ])
    await warned(
      truncating,
      "Requested token count (9 input + 10 new) exceeds the model's context length (16 tokens). Truncating max_new_tokens."
    )
  })

  it("both: a long prompt with max_tokens keeps the context and no room to generate", async () => {
    const r = await postJson(`${truncating.url}/v1/completions`, { prompt: prompt(20), max_tokens: 3 })
    expect(r.status).toBe(200)
    const body = r.json as Completion
    expect([body.usage.prompt_tokens, body.usage.completion_tokens, body.choices[0]?.text]).toEqual([10, 0, ""])
    await warned(
      truncating,
      "Requested token count (16 input + 3 new) exceeds the model's context length (16 tokens). Truncating max_new_tokens."
    )
  })
})
