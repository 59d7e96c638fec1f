// The error bodies the simulator sends per engine and engine age, over HTTP and inside a stream, as the
// upstream sources write them (src/sim/errors.ts, src/sim/faultReply.ts name the files): vLLM >= 0.10.1 nested
// and before it flat (--sim-legacy-errors), SGLang flat over HTTP and wrapped in a stream, with a scheduler
// abort's status name as the streamed type, each engine's words and param for a request too long for the context,
// and mlx-lm's own words for a body that is not JSON.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { getJson, pollUntil, postJson, type SimHandle, sseData, startSim } from "../support/sim.ts"

let vllm: SimHandle
let vllmOld: SimHandle
let sglang: SimHandle
let mlx: SimHandle

beforeAll(async () => {
  ;[vllm, vllmOld, sglang, mlx] = await Promise.all([
    startSim({ flavor: "vllm", args: ["serve", "org/m", "--max-model-len", "8"] }),
    startSim({ flavor: "vllm", args: ["serve", "org/m", "--max-model-len", "8", "--sim-legacy-errors"] }),
    // 16, not 8: SGLang's scheduler aborts an input of context - 6 tokens or more (sglang-scheduler-bound.test.ts)
    startSim({ flavor: "sglang", args: ["--model-path", "org/sg", "--context-length", "16"] }),
    startSim({ flavor: "mlx", args: ["--model", "mlx-community/tiny"] })
  ])
  await Promise.all(
    [sglang, mlx].map((s) =>
      pollUntil(async () => ((await getJson(`${s.url}/sim/state`)).json as { ready: boolean }).ready || undefined)
    )
  )
})
afterAll(() => Promise.all([vllm, vllmOld, sglang, mlx].map((s) => s?.stop())))

const faults = async (s: SimHandle, body: Record<string, unknown>) =>
  expect((await postJson(`${s.url}/sim/faults`, body)).status).toBe(200)

/** The `data:` payloads of a streamed completion that fails mid-stream. */
const failedStream = async (s: SimHandle): Promise<Array<string>> => {
  await faults(s, { errorRate: 1, errorKind: "midstream" })
  try {
    // max_tokens named: CompletionRequest's default 16 would not fit these small contexts (8, 16) beside the prompt
    const r = await postJson(`${s.url}/v1/completions`, { prompt: "a b c", max_tokens: 3, stream: true })
    expect(r.status).toBe(200)
    return sseData(r.text)
  } finally {
    await faults(s, { errorRate: 0 })
  }
}

describe("vLLM", () => {
  it(">= 0.10.1: a 404 nested under error, the same object mid-stream, then [DONE]", async () => {
    const r = await postJson(`${vllm.url}/v1/completions`, { model: "other", prompt: "a" })
    expect(r.status).toBe(404)
    expect(r.json).toEqual({
      error: { message: "The model `other` does not exist.", type: "NotFoundError", param: "model", code: 404 }
    })
    const data = await failedStream(vllm)
    expect(data.at(-1)).toBe("[DONE]")
    expect(JSON.parse(data.at(-2) ?? "{}")).toEqual({
      error: { message: "simulated mid-stream engine failure", type: "InternalServerError", param: null, code: 500 }
    })
  })

  it("before 0.10.1 (--sim-legacy-errors): flat bodies in ErrorResponse's field order", async () => {
    const r = await postJson(`${vllmOld.url}/v1/completions`, { model: "other", prompt: "a" })
    expect(r.status).toBe(404)
    expect(r.text).toBe(
      '{"object":"error","message":"The model `other` does not exist.","type":"NotFoundError","param":"model","code":404}'
    )
    // A refusal the request model's validator makes is flat as well.
    const v = await postJson(`${vllmOld.url}/v1/completions`, { prompt: "a", stream_options: { include_usage: true } })
    expect(v.status).toBe(400)
    expect(Object.keys(v.json as object)).toEqual(["object", "message", "type", "param", "code"])
    expect(v.json).toMatchObject({ object: "error", param: "stream_options", code: 400 })
  })

  it("before 0.10.1: mid-stream the flat object wrapped in error, then [DONE]", async () => {
    const data = await failedStream(vllmOld)
    expect(data.at(-1)).toBe("[DONE]")
    expect(JSON.parse(data.at(-2) ?? "{}")).toEqual({
      error: {
        object: "error",
        message: "simulated mid-stream engine failure",
        type: "InternalServerError",
        param: null,
        code: 500
      }
    })
  })
})

describe("SGLang", () => {
  it("an engine-side abort mid-stream: the wrapped flat error typed INTERNAL_SERVER_ERROR, code 500, then [DONE]", async () => {
    const data = await failedStream(sglang)
    expect(data.at(-1)).toBe("[DONE]")
    expect(JSON.parse(data.at(-2) ?? "{}")).toEqual({
      error: {
        object: "error",
        message: "simulated mid-stream engine failure",
        type: "INTERNAL_SERVER_ERROR",
        param: null,
        code: 500
      }
    })
  })

  it("--sim-legacy-errors leaves SGLang's flat HTTP body as it is", async () => {
    const s = await startSim({ flavor: "sglang", args: ["--model-path", "org/sg", "--sim-legacy-errors"] })
    try {
      await pollUntil(async () => ((await getJson(`${s.url}/sim/state`)).json as { ready: boolean }).ready || undefined)
      const r = await postJson(`${s.url}/v1/chat/completions`, { model: "org/sg" })
      expect(r.status).toBe(400)
      expect(Object.keys(r.json as object)).toEqual(["object", "message", "type", "param", "code"])
    } finally {
      await s.stop()
    }
  })
})

/** A prompt of `n` words (the simulator's tokens). */
const prompt = (n: number) => Array.from({ length: n }, (_, i) => `w${i}`).join(" ")

describe("a request too long for the context (vLLM's 8 tokens, SGLang's 16)", () => {
  const refusal = async (s: SimHandle, body: Record<string, unknown>) => {
    const r = await postJson(`${s.url}/v1/completions`, body)
    expect(r.status).toBe(400)
    return r.json as Record<string, unknown>
  }

  it("vLLM: VLLMValidationError's words with (parameter=..., value=...), its parameter as param", async () => {
    expect(await refusal(vllm, { prompt: prompt(8), max_tokens: 1 })).toEqual({
      error: {
        message:
          "This model's maximum context length is 8 tokens. However, your request has 8 input tokens. Please reduce the length of the input messages. (parameter=input_tokens, value=8)",
        type: "BadRequestError",
        param: "input_tokens",
        code: 400
      }
    })
    expect(await refusal(vllm, { prompt: prompt(5), max_tokens: 4 })).toEqual({
      error: {
        message:
          "'max_tokens' or 'max_completion_tokens' is too large: 4. This model's maximum context length is 8 tokens and your request has 5 input tokens (4 > 8 - 5). (parameter=max_tokens, value=4)",
        type: "BadRequestError",
        param: "max_tokens",
        code: 400
      }
    })
    // Prompt and max_tokens filling the context exactly fit.
    expect((await postJson(`${vllm.url}/v1/completions`, { prompt: prompt(5), max_tokens: 3 })).status).toBe(200)
  })

  it("vLLM before 0.10.1: the older words, flat, no param", async () => {
    expect(await refusal(vllmOld, { prompt: prompt(5), max_tokens: 4 })).toEqual({
      object: "error",
      message:
        "This model's maximum context length is 8 tokens. However, you requested 9 tokens (5 in the messages, 4 in the completion). Please reduce the length of the messages or completion.",
      type: "BadRequestError",
      param: null,
      code: 400
    })
  })

  it("SGLang: TokenizerManager's words, flat BadRequestError, no param; input plus max_tokens past the context is refused", async () => {
    expect(await refusal(sglang, { prompt: prompt(16) })).toEqual({
      object: "error",
      message: "The input (16 tokens) is longer than the model's context length (16 tokens).",
      type: "BadRequestError",
      param: null,
      code: 400
    })
    expect(await refusal(sglang, { prompt: prompt(9), max_tokens: 8 })).toEqual({
      object: "error",
      message:
        "Requested token count exceeds the model's maximum context length of 16 tokens. You requested a total of 17 tokens: 9 tokens from the input messages and 8 tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit.",
      type: "BadRequestError",
      param: null,
      code: 400
    })
    // filling the context exactly fits (`>` since sgl-project/sglang#22546)
    expect((await postJson(`${sglang.url}/v1/completions`, { prompt: prompt(9), max_tokens: 7 })).status).toBe(200)
  })
})

describe("mlx-lm", () => {
  it("a body that is not JSON: 400 {error: 'Invalid JSON in request body: ...'}", async () => {
    const res = await fetch(`${mlx.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: "{not json"
    })
    expect(res.status).toBe(400)
    const body = (await res.json()) as { error: string }
    expect(Object.keys(body)).toEqual(["error"])
    expect(body.error).toMatch(/^Invalid JSON in request body: /)
  })
})
