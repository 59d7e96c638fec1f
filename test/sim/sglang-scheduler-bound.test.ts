// SGLang's second bound on a request's length, its scheduler's (src/sim/sglangSchedulerBound.ts; sgl-project/sglang
// python/sglang/srt/managers/tp_worker.py, scheduler.py handle_generate_request and init_req_max_new_tokens,
// utils.py validate_input_length): an input of min(context, KV pool) - 6 tokens or more, which the tokenizer
// manager's context check passed, is aborted (a whole answer 400, a stream 200 with an error event,
// faultReply.ts schedulerAbort) or, with --allow-auto-truncate, cut again; max_new_tokens is capped at
// context - input - 2 (and at what the KV pool leaves).
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { sglangRequestBounds, sglangSchedulerFit } from "../../src/sim/sglangSchedulerBound.ts"
import { getJson, pollUntil, postJson, type SimHandle, sseData, startSim } from "../support/sim.ts"

const prompt = (n: number) => Array.from({ length: n }, (_, i) => `w${i}`).join(" ")
const abortWords = (n: number, bound: number) =>
  `Input length (${n} tokens) exceeds the maximum allowed length (${bound} tokens). Use a shorter input or enable --allow-auto-truncate.`
const truncated = (n: number, bound: number) =>
  `Request length is longer than the KV cache pool size or the max context length. Truncated. len(req.origin_input_ids)=${n}, max_req_input_len=${bound}.`

describe("the bound (pure)", () => {
  it("max_req_len = min(context, pool) - 1 and max_req_input_len 5 below it", () => {
    expect(sglangRequestBounds(4096, 4096)).toEqual({ maxReqLen: 4095, maxReqInputLen: 4090 })
    expect(sglangRequestBounds(4096, 1024)).toEqual({ maxReqLen: 1023, maxReqInputLen: 1018 })
    expect(sglangRequestBounds(16, 4096)).toEqual({ maxReqLen: 15, maxReqInputLen: 10 })
  })

  it("an input at the bound (`>=`) is aborted, or cut to it with the flag; below it max_new_tokens is capped", () => {
    expect(sglangSchedulerFit(16, 4096, 1, 9, 7, false)).toEqual({ keep: 9, maxTokens: 5, warnings: [] })
    expect(sglangSchedulerFit(16, 4096, 1, 10, 1, false)).toEqual({ abort: abortWords(10, 10) })
    expect(sglangSchedulerFit(16, 4096, 1, 12, 2, true)).toEqual({
      keep: 10,
      maxTokens: 2,
      warnings: [truncated(12, 10)]
    })
    // #33814's numbers: --context-length 4096, an input of 4080 with 16 new tokens is served, 14 of them made
    expect(sglangSchedulerFit(4096, 65536, 1, 4080, 16, false)).toEqual({ keep: 4080, maxTokens: 14, warnings: [] })
  })

  it("the KV pool caps max_new_tokens too: pool - the input in whole pages - a page - 1, never below 0", () => {
    // pool 128 tokens in pages of 16: an input of 40 takes 48, leaving 128 - 48 - 16 - 1 = 63
    expect(sglangSchedulerFit(4096, 128, 16, 40, 100, false)).toMatchObject({ keep: 40, maxTokens: 63 })
    expect(sglangSchedulerFit(4096, 128, 16, 100, 100, false)).toMatchObject({ keep: 100, maxTokens: 0 })
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
  readonly choices: ReadonlyArray<{ readonly text?: string; readonly finish_reason: string }>
  readonly usage: { readonly prompt_tokens: number; readonly completion_tokens: number }
}

const logged = (s: SimHandle, text: string) =>
  s.waitForLine((l) => l.includes(JSON.stringify(text).slice(1, -1)), 5_000)

describe("--context-length 16 (max_req_input_len 10)", () => {
  it("an input the tokenizer manager passes but the scheduler does not: 400 BadRequestError, logged as an error", async () => {
    const r = await postJson(`${plain.url}/v1/completions`, { prompt: prompt(10), max_tokens: 1 })
    expect([r.status, r.json]).toEqual([
      400,
      { object: "error", message: abortWords(10, 10), type: "BadRequestError", param: null, code: 400 }
    ])
    // at error by SGLang's logger, whose format writes no level (configure_logger): its own prefix, as the real line
    expect(await logged(plain, abortWords(10, 10))).toMatch(/^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] /)
  })

  it("streamed: 200 text/event-stream, the error typed BAD_REQUEST as the first event, then [DONE]", async () => {
    const r = await postJson(`${plain.url}/v1/chat/completions`, {
      messages: [{ role: "user", content: prompt(11) }],
      stream: true
    })
    expect(r.status).toBe(200)
    expect(r.headers.get("content-type")).toContain("text/event-stream")
    expect(sseData(r.text)).toEqual([
      JSON.stringify({
        error: { object: "error", message: abortWords(11, 10), type: "BAD_REQUEST", param: null, code: 400 }
      }),
      "[DONE]"
    ])
  })

  it("the tokenizer manager's own refusal of a stream stays a 400 before any SSE", async () => {
    const r = await postJson(`${plain.url}/v1/completions`, { prompt: prompt(16), stream: true })
    expect(r.status).toBe(400)
    expect((r.json as { message: string }).message).toBe(
      "The input (16 tokens) is longer than the model's context length (16 tokens)."
    )
  })

  it("below the bound, max_tokens is capped at context - input - 2: 9 input + 7 new makes 5", async () => {
    const r = await postJson(`${plain.url}/v1/completions`, { prompt: prompt(9), max_tokens: 7, ignore_eos: true })
    expect(r.status).toBe(200)
    const body = r.json as Completion
    expect([body.usage.prompt_tokens, body.usage.completion_tokens, body.choices[0]?.finish_reason]).toEqual([
      9,
      5,
      "length"
    ])
  })
})

describe("--allow-auto-truncate", () => {
  it("the input is cut again to max_req_input_len, logged; usage counts the tokens kept", async () => {
    const r = await postJson(`${truncating.url}/v1/completions`, {
      prompt: prompt(12),
      max_tokens: 2,
      ignore_eos: true
    })
    expect(r.status).toBe(200)
    const body = r.json as Completion
    // max_new_tokens was capped from the input before its cut: 15 - 12 - 1 = 2
    expect([body.usage.prompt_tokens, body.usage.completion_tokens]).toEqual([10, 2])
    await logged(truncating, truncated(12, 10))
  })

  it("both bounds cut a prompt past the context: the tokenizer manager's to 16, then the scheduler's to 10", async () => {
    const r = await postJson(`${truncating.url}/v1/completions`, { prompt: prompt(20), stream: true })
    expect(r.status).toBe(200)
    await logged(
      truncating,
      "The input (20 tokens) is longer than the model's context length (16 tokens). Truncating the input."
    )
    await logged(truncating, truncated(16, 10))
  })
})
