// The 400s vLLM and SGLang give a request they refuse, in the words of their sources (src/sim/upstreamRefusals.ts,
// src/sim/requestChecks.ts, src/sim/pyWords.ts):
// - a body FastAPI cannot take (not JSON, empty, not an object, no `messages`) is a RequestValidationError, which vLLM
//   answers type "Bad Request" with the error's loc as `param` and its fields summarised (vllm-project/vllm
//   vllm/entrypoints/serve/exception_handling/handlers/validation.py), SGLang as str(exc.errors()) in its flat body
//   (sgl-project/sglang python/sglang/srt/entrypoints/http_server.py validation_exception_handler); json.loads'
//   own message and character position name where the body stops being JSON;
// - vLLM's sampling errors quote Python floats (3.0, not 3), temperature's and top_p's and max_tokens' name their
//   parameter and value after the text (vllm/exceptions.py VLLMValidationError.__str__); greedy sampling with n > 1
//   and logprobs beyond --max-logprobs (20) are refused (vllm/sampling_params.py);
// - SGLang's handler refuses an empty messages list, max_completion_tokens beyond --context-length, an empty or blank
//   prompt first (serving_chat.py, serving_completions.py _validate_request), and its CompletionRequest a max_tokens
//   of 0 as a validation error (protocol.py validate_max_tokens_positive), a message whose role neither of its
//   message models takes as the union's two errors (protocol.py ChatCompletionMessageParam).
// And a stream its client leaves: SGLang's TokenizerManager.abort_request counts it in
// sglang:num_aborted_requests_total (python/sglang/srt/managers/tokenizer_manager.py, metrics/collector.py).
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { pyFloat, pyJsonError } from "../../src/sim/pyWords.ts"
import { pollUntil, postJson, type SimHandle, startSim } from "../support/sim.ts"

let vllm: SimHandle
let sglang: SimHandle

beforeAll(async () => {
  ;[vllm, sglang] = await Promise.all([
    startSim({ args: ["serve", "org/m"] }),
    startSim({ args: ["--model-path", "org/sg", "--context-length", "100"] })
  ])
})
afterAll(() => Promise.all([vllm, sglang].map((s) => s?.stop())))

/** POSTs `raw` as it is (not JSON-encoded). */
const postRaw = async (url: string, raw: string): Promise<{ status: number; json: unknown }> => {
  const res = await fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: raw })
  return { status: res.status, json: JSON.parse(await res.text()) as unknown }
}

const vllmError = (message: string, param: string | null, type = "BadRequestError") => ({
  error: { message, type, param, code: 400 }
})
const sglangError = (message: string, type = "BadRequestError") => ({
  object: "error",
  message,
  type,
  param: null,
  code: 400
})

describe("Python's words for the values quoted", () => {
  it("a float as repr() writes it", () => {
    expect([3, -1, 0, 2.5, 1e-5, 1.5e-7, 1e16, 123456.75, -0.0001].map(pyFloat)).toEqual([
      "3.0",
      "-1.0",
      "0.0",
      "2.5",
      "1e-05",
      "1.5e-07",
      "1e+16",
      "123456.75",
      "-0.0001"
    ])
  })

  it("where json.loads stops, and why", () => {
    expect(pyJsonError('{"a": 1}')).toBeUndefined()
    expect(pyJsonError("not json")).toEqual({ msg: "Expecting value", pos: 0 })
    expect(pyJsonError(" ")).toEqual({ msg: "Expecting value", pos: 1 })
    expect(pyJsonError("{bad")).toEqual({ msg: "Expecting property name enclosed in double quotes", pos: 1 })
    expect(pyJsonError('{"a" 1}')).toEqual({ msg: "Expecting ':' delimiter", pos: 5 })
    expect(pyJsonError('{"a": 1 "b": 2}')).toEqual({ msg: "Expecting ',' delimiter", pos: 8 })
    expect(pyJsonError('{"a": 1,}')).toEqual({ msg: "Expecting property name enclosed in double quotes", pos: 8 })
    expect(pyJsonError("[1,]")).toEqual({ msg: "Expecting value", pos: 3 })
    expect(pyJsonError('{"a": "b')).toEqual({ msg: "Unterminated string starting at", pos: 6 })
    expect(pyJsonError('{"a": 1} x')).toEqual({ msg: "Extra data", pos: 9 })
    expect(pyJsonError('"é" x')).toEqual({ msg: "Extra data", pos: 4 })
  })
})

describe("vLLM", () => {
  const completion = (body: Record<string, unknown>) =>
    postJson(`${vllm.url}/v1/completions`, { model: "org/m", prompt: "a b", max_tokens: 2, ...body })

  it("sampling errors quote floats as Python does; temperature, top_p and max_tokens name parameter and value", async () => {
    const cases: Array<[Record<string, unknown>, string, string | null]> = [
      [
        { temperature: -1 },
        "temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0)",
        "temperature"
      ],
      [{ top_p: 0 }, "top_p must be in (0, 1], got 0.0. (parameter=top_p, value=0.0)", "top_p"],
      [{ presence_penalty: 3 }, "presence_penalty must be in [-2, 2], got 3.0.", null],
      [{ repetition_penalty: 0 }, "repetition_penalty must be greater than zero, got 0.0.", null],
      [{ max_tokens: 0 }, "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)", "max_tokens"]
    ]
    for (const [body, message, param] of cases) {
      const r = await completion(body)
      expect([r.status, r.json]).toEqual([400, vllmError(message, param)])
    }
  })

  it("refuses greedy sampling with n > 1, and logprobs beyond max_logprobs (completion and chat)", async () => {
    const greedy = await completion({ temperature: 0, n: 2 })
    expect([greedy.status, greedy.json]).toEqual([
      400,
      vllmError("n must be 1 when using greedy sampling, got 2.", null)
    ])
    const words =
      "Requested sample logprobs of 21, which is greater than max allowed: 20 (parameter=logprobs, value=21)"
    const text = await completion({ logprobs: 21 })
    expect([text.status, text.json]).toEqual([400, vllmError(words, "logprobs")])
    const chat = await postJson(`${vllm.url}/v1/chat/completions`, {
      messages: [{ role: "user", content: "a" }],
      logprobs: true,
      top_logprobs: 21
    })
    expect([chat.status, chat.json]).toEqual([400, vllmError(words, "logprobs")])
    expect((await completion({ logprobs: 20 })).status).toBe(200)
  })

  it("a temperature below 1e-2 is raised to 1e-2 before the greedy check: only 0 refuses n > 1", async () => {
    // vllm-project/vllm vllm/sampling_params.py SamplingParams.__post_init__ (_MAX_TEMP, then _SAMPLING_EPS)
    const tiny = await completion({ temperature: 0.000001, n: 2 })
    expect(tiny.status).toBe(200)
    expect((await completion({ temperature: 0.005, n: 2 })).status).toBe(200)
  })

  it("logprobs below 0: -1 is the whole vocabulary (beyond max_logprobs), any other a validation error", async () => {
    // -1 passes check_logprobs and SamplingParams._validate_logprobs makes it the vocabulary's size: the sim's 32000
    const vocab =
      "Requested sample logprobs of 32000, which is greater than max allowed: 20 (parameter=logprobs, value=32000)"
    const all = await completion({ logprobs: -1 })
    expect([all.status, all.json]).toEqual([400, vllmError(vocab, "logprobs")])
    const chatAll = await postJson(`${vllm.url}/v1/chat/completions`, {
      messages: [{ role: "user", content: "a" }],
      logprobs: true,
      top_logprobs: -1
    })
    expect([chatAll.status, chatAll.json]).toEqual([400, vllmError(vocab, "logprobs")])
    // check_logprobs (completion/protocol.py, chat_completion/protocol.py): a VLLMValidationError at loc ('body',),
    // its parameter the param
    const detail = (field: string, value: number, keys: number) => {
      const text = `\`${field}\` must be a positive value or -1.`
      return `1 validation error:\n  {'type': 'value_error', 'loc': 'body', 'msg': 'Value error, ${text} (parameter=${field}, value=${value})', 'input': '<dict of ${keys} items>', 'ctx': {'error': VLLMValidationError('${text}')}}`
    }
    const negative = await completion({ logprobs: -2 })
    expect([negative.status, negative.json]).toEqual([
      400,
      vllmError(detail("logprobs", -2, 4), "logprobs", "Bad Request")
    ])
    const chatNegative = await postJson(`${vllm.url}/v1/chat/completions`, {
      messages: [{ role: "user", content: "a" }],
      logprobs: true,
      top_logprobs: -3
    })
    expect([chatNegative.status, chatNegative.json]).toEqual([
      400,
      vllmError(detail("top_logprobs", -3, 3), "top_logprobs", "Bad Request")
    ])
  })

  it("a body FastAPI cannot take: its validation error, type Bad Request, loc as param", async () => {
    const url = `${vllm.url}/v1/chat/completions`
    const detail = (d: string) => `1 validation error:\n  ${d}`
    const bad = await postRaw(url, '{"messages": [1,]}')
    const json = `{'type': 'json_invalid', 'loc': 'body.16', 'msg': 'JSON decode error', 'input': '<dict of 0 items>', 'ctx': {'error': 'Expecting value'}}`
    expect([bad.status, bad.json]).toEqual([400, vllmError(detail(json), "body.16", "Bad Request")])
    const empty = await postRaw(url, "")
    const missing = `{'type': 'missing', 'loc': 'body', 'msg': 'Field required', 'input': 'None'}`
    expect(empty.json).toEqual(vllmError(detail(missing), "body", "Bad Request"))
    const list = await postRaw(url, "[1]")
    const shape = `{'type': 'model_attributes_type', 'loc': 'body', 'msg': 'Input should be a valid dictionary or object to extract fields from', 'input': '<list of 1 items>'}`
    expect(list.json).toEqual(vllmError(detail(shape), "body", "Bad Request"))
    const noMessages = await postJson(url, { model: "nope" })
    const field = `{'type': 'missing', 'loc': 'body.messages', 'msg': 'Field required', 'input': '<dict of 1 items>'}`
    expect([noMessages.status, noMessages.json]).toEqual([
      400,
      vllmError(detail(field), "body.messages", "Bad Request")
    ])
  })
})

describe("SGLang", () => {
  it("its handler's checks come first, in its words", async () => {
    const chat = (body: Record<string, unknown>) => postJson(`${sglang.url}/v1/chat/completions`, body)
    const empty = await chat({ messages: [], temperature: -1 })
    expect([empty.status, empty.json]).toEqual([400, sglangError("Messages cannot be empty.")])
    const long = await chat({ messages: [{ role: "user", content: "a" }], max_completion_tokens: 200 })
    const words = "max_completion_tokens is too large: 200.This model supports at most 100 completion tokens."
    expect([long.status, long.json]).toEqual([400, sglangError(words)])
    const text = (prompt: unknown) => postJson(`${sglang.url}/v1/completions`, { prompt, max_tokens: 2 })
    expect((await text("")).json).toEqual(sglangError("Prompt cannot be None"))
    expect((await text(" \n")).json).toEqual(sglangError("Prompt cannot be empty or whitespace only"))
    expect((await text(["a", " "])).json).toEqual(sglangError("Prompt at index 1 cannot be empty or whitespace only"))
  })

  it("sampling errors quote floats as Python does", async () => {
    const r = await postJson(`${sglang.url}/v1/completions`, { prompt: "a", repetition_penalty: 3 })
    const words = "repetition_penalty must be in (0, 2] (1.0 = no penalty), got 3.0."
    expect([r.status, r.json]).toEqual([400, sglangError(words)])
  })

  it("a body FastAPI cannot take, or a CompletionRequest refuses: str(exc.errors()), type Bad Request", async () => {
    const bad = await postRaw(`${sglang.url}/v1/chat/completions`, "not json")
    const json = `[{'type': 'json_invalid', 'loc': ('body', 0), 'msg': 'JSON decode error', 'input': {}, 'ctx': {'error': 'Expecting value'}}]`
    expect([bad.status, bad.json]).toEqual([400, sglangError(json, "Bad Request")])
    const noMessages = await postJson(`${sglang.url}/v1/chat/completions`, { model: "m" })
    const missing = `[{'type': 'missing', 'loc': ('body', 'messages'), 'msg': 'Field required', 'input': {'model': 'm'}}]`
    expect(noMessages.json).toEqual(sglangError(missing, "Bad Request"))
    const role = await postJson(`${sglang.url}/v1/chat/completions`, { messages: [{ role: "wizard", content: "a" }] })
    const roles = "'system', 'assistant', 'tool', 'function', 'developer', 'latest_reminder'"
    const text = `'role' must be one of ${roles} (case-insensitive).`
    const union = [
      `{'type': 'value_error', 'loc': ('body', 'messages', 0, 'ChatCompletionMessageGenericParam', 'role'), 'msg': "Value error, ${text}", 'input': 'wizard', 'ctx': {'error': ValueError("${text}")}}`,
      `{'type': 'literal_error', 'loc': ('body', 'messages', 0, 'ChatCompletionMessageUserParam', 'role'), 'msg': "Input should be 'user'", 'input': 'wizard', 'ctx': {'expected': "'user'"}}`
    ]
    expect([role.status, role.json]).toEqual([400, sglangError(`[${union.join(", ")}]`, "Bad Request")])
    const zero = await postJson(`${sglang.url}/v1/completions`, { prompt: "a", max_tokens: 0 })
    const positive = `[{'type': 'value_error', 'loc': ('body', 'max_tokens'), 'msg': 'Value error, max_tokens must be positive', 'input': 0, 'ctx': {'error': ValueError('max_tokens must be positive')}}]`
    expect([zero.status, zero.json]).toEqual([400, sglangError(positive, "Bad Request")])
  })
})

describe("SGLang: a stream its client leaves", () => {
  it("is counted in sglang:num_aborted_requests_total, a family with no sample until the first abort", async () => {
    const sim = await startSim({ args: ["--model-path", "org/sg", "--enable-metrics", "--sim-itl", "20ms"] })
    const aborted = async () => {
      const page = await (await fetch(`${sim.url}/metrics`)).text()
      return page.split("\n").filter((l) => l.startsWith("sglang:num_aborted_requests_total"))
    }
    try {
      expect(await aborted()).toEqual([])
      const ac = new AbortController()
      const res = await fetch(`${sim.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ prompt: "a b", max_tokens: 2000, ignore_eos: true, stream: true }),
        signal: ac.signal
      })
      expect(res.status).toBe(200)
      await res.body?.getReader().read()
      ac.abort()
      const lines = await pollUntil(async () => ((await aborted()).length > 0 ? aborted() : undefined))
      expect(lines).toEqual(['sglang:num_aborted_requests_total{engine_type="unified",model_name="org/sg"} 1.0'])
    } finally {
      await sim.stop()
    }
  })
})
