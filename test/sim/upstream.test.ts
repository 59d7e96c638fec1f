// Behaviour the simulator takes from the engines' own sources, flavor by flavor: vLLM's refusal of
// stream_options without stream, which health paths each engine serves, how each ends a stream (the last token
// with the finish reason or a chunk of its own), mlx-lm's mid-stream failure (the body just ends) and its
// --max-tokens default. The upstream files are named where the simulator implements each (src/sim/*.ts).
import * as http from "node:http"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { getJson, pollUntil, postJson, type SimHandle, sseData, startSim } from "../support/sim.ts"
import { simGguf } from "../support/simModel.ts"

let vllm: SimHandle
let sglang: SimHandle
let llama: SimHandle
let mlx: SimHandle

beforeAll(async () => {
  ;[vllm, sglang, llama, mlx] = await Promise.all([
    startSim({ flavor: "vllm", args: ["serve", "org/m"] }),
    startSim({ flavor: "sglang", args: ["--model-path", "org/sg"] }),
    startSim({ flavor: "llama_cpp", args: ["-m", simGguf("m.gguf")] }),
    startSim({ flavor: "mlx", args: ["--model", "mlx-community/tiny"] })
  ])
  // The non-vLLM flavors listen before they have loaded.
  await Promise.all(
    [sglang, llama, mlx].map((s) =>
      pollUntil(async () => ((await getJson(`${s.url}/sim/state`)).json as { ready: boolean }).ready || undefined)
    )
  )
})
afterAll(() => Promise.all([vllm, sglang, llama, mlx].map((s) => s?.stop())))

type Choice = { text?: string; delta?: { content?: string }; finish_reason: string | null }
const chunksOf = (text: string): Array<{ choices: Array<Choice> }> =>
  sseData(text)
    .filter((d) => d !== "[DONE]")
    .map((d) => JSON.parse(d))

describe("stream_options without stream", () => {
  const STREAM_OPTIONS = { include_usage: true }

  it.each([
    ["/v1/completions", { prompt: "a b", stream_options: STREAM_OPTIONS }],
    [
      "/v1/chat/completions",
      { messages: [{ role: "user", content: "a" }], stream: false, stream_options: STREAM_OPTIONS }
    ]
  ])("vLLM answers %s with its 400 validation error", async (path, body) => {
    const r = await postJson(`${vllm.url}${path}`, body)
    expect(r.status).toBe(400)
    expect(r.json).toEqual({
      error: {
        message: expect.stringContaining("Stream options can only be defined when `stream=True`."),
        type: "Bad Request",
        param: "stream_options",
        code: 400
      }
    })
    expect((r.json as { error: { message: string } }).error.message).toMatch(
      /^1 validation error:\n {2}\{'type': 'value_error'/
    )
  })

  it("vLLM checks it before the model and the fields, and lets empty options or a stream through", async () => {
    const early = await postJson(`${vllm.url}/v1/chat/completions`, { model: "nope", stream_options: STREAM_OPTIONS })
    expect(early.status).toBe(400)
    expect((early.json as { error: { param: string } }).error.param).toBe("stream_options")
    expect((await postJson(`${vllm.url}/v1/completions`, { prompt: "a", stream_options: {} })).status).toBe(200)
    expect((await postJson(`${vllm.url}/v1/completions`, { prompt: "a", stream_options: null })).status).toBe(200)
    const streamed = await postJson(`${vllm.url}/v1/completions`, {
      prompt: "a",
      stream: true,
      stream_options: STREAM_OPTIONS
    })
    expect(streamed.status).toBe(200)
  })

  it.each([
    ["sglang", () => sglang],
    ["llama_cpp", () => llama],
    ["mlx", () => mlx]
  ])("%s accepts it and answers a whole completion", async (_flavor, sim) => {
    const r = await postJson(`${sim().url}/v1/completions`, { prompt: "a b", stream_options: STREAM_OPTIONS })
    expect(r.status).toBe(200)
    expect((r.json as { choices: Array<Choice> }).choices[0]?.text).toBe("a b")
  })
})

describe("health paths per engine", () => {
  const status = async (url: string, method = "GET") => (await fetch(url, { method })).status

  it.each([
    ["vllm", () => vllm, ["/health", "/ping"], ["/health_generate", "/v1/health"]],
    ["sglang", () => sglang, ["/health", "/health_generate"], ["/ping", "/v1/health"]],
    ["llama_cpp", () => llama, ["/health", "/v1/health"], ["/ping", "/health_generate"]],
    ["mlx", () => mlx, ["/health"], ["/ping", "/health_generate", "/v1/health"]]
  ] as const)("%s answers %j and 404s %j", async (_flavor, sim, served, absent) => {
    for (const p of served) expect([p, await status(`${sim().url}${p}`)]).toEqual([p, 200])
    for (const p of absent) expect([p, await status(`${sim().url}${p}`)]).toEqual([p, 404])
  })

  it("an absent path is the flavor's own 404", async () => {
    expect(await getJson(`${vllm.url}/health_generate`)).toMatchObject({ status: 404, json: { detail: "Not Found" } })
    expect(await getJson(`${sglang.url}/ping`)).toMatchObject({ status: 404, json: { detail: "Not Found" } })
    expect(await getJson(`${llama.url}/ping`)).toMatchObject({
      status: 404,
      json: { error: { code: 404, message: "File Not Found", type: "not_found_error" } }
    })
    // mlx-lm writes the bare words under a JSON content type.
    const m = await fetch(`${mlx.url}/v1/health`)
    expect([m.status, m.headers.get("content-type"), await m.text()]).toEqual([404, "application/json", "Not Found"])
  })

  it("vLLM's /ping also answers POST, as SageMaker calls it", async () => {
    expect(await status(`${vllm.url}/ping`, "POST")).toBe(200)
  })
})

describe("the end of a stream", () => {
  const stream = (sim: SimHandle, path: string, extra: Record<string, unknown>) =>
    postJson(`${sim.url}${path}`, { ...extra, stream: true })
  const PROMPT = { prompt: "a b c" }
  const CHAT = { messages: [{ role: "user", content: "a b c" }] }

  it("vLLM sends the last token with the finish reason, completions and chat", async () => {
    const done = (await stream(vllm, "/v1/completions", PROMPT)).text
    expect(sseData(done).at(-1)).toBe("[DONE]")
    const c = chunksOf(done)
    expect(c.map((x) => x.choices[0]?.text)).toEqual(["a", " b", " c"])
    expect(c.map((x) => x.choices[0]?.finish_reason)).toEqual([null, null, "stop"])
    const chat = chunksOf((await stream(vllm, "/v1/chat/completions", { ...CHAT, max_tokens: 2 })).text)
    // The role chunk, then one chunk per token, the last carrying "length".
    expect(chat.map((x) => x.choices[0]?.delta?.content)).toEqual(["", "a", " b"])
    expect(chat.at(-1)?.choices[0]).toEqual({
      index: 0,
      delta: { content: " b" },
      logprobs: null,
      finish_reason: "length",
      stop_reason: null
    })
  })

  it("vLLM's usage chunk still follows the finish chunk when asked", async () => {
    const r = await stream(vllm, "/v1/completions", { ...PROMPT, stream_options: { include_usage: true } })
    const c = chunksOf(r.text) as Array<{ choices: Array<Choice>; usage?: { completion_tokens: number } }>
    expect(c.at(-2)?.choices[0]).toMatchObject({ text: " c", finish_reason: "stop" })
    expect(c.at(-1)).toMatchObject({ choices: [], usage: { completion_tokens: 3 } })
  })

  it("SGLang merges them for completions but ends chat with a finish chunk of its own", async () => {
    const c = chunksOf((await stream(sglang, "/v1/completions", PROMPT)).text)
    expect(c.map((x) => [x.choices[0]?.text, x.choices[0]?.finish_reason])).toEqual([
      ["a", null],
      [" b", null],
      [" c", "stop"]
    ])
    const chat = chunksOf((await stream(sglang, "/v1/chat/completions", CHAT)).text)
    expect(chat.at(-2)?.choices[0]).toMatchObject({ delta: { content: " c" }, finish_reason: null })
    expect(chat.at(-1)?.choices[0]).toMatchObject({ delta: {}, finish_reason: "stop" })
  })

  it("mlx-lm and llama-server end with a finish chunk of their own", async () => {
    const m = chunksOf((await stream(mlx, "/v1/completions", PROMPT)).text)
    expect(m.at(-1)?.choices[0]).toMatchObject({ text: "", finish_reason: "stop" })
    expect(m.at(-2)?.choices[0]).toMatchObject({ text: " c", finish_reason: null })
    const l = chunksOf((await stream(llama, "/v1/completions", PROMPT)).text)
    expect(l.at(-1)?.choices[0]).toMatchObject({ text: "", finish_reason: "stop" })
  })
})

// SGLang's mid-stream failure (its scheduler's abort): test/sim/error-shapes.test.ts.

describe("mlx-lm mid-stream failure", () => {
  const setFaults = async (faults: Record<string, unknown>) =>
    expect((await postJson(`${mlx.url}/sim/faults`, faults)).status).toBe(200)

  it("a stream just ends: no error event, no [DONE]", async () => {
    await setFaults({ errorRate: 1, errorKind: "midstream" })
    try {
      const r = await postJson(`${mlx.url}/v1/completions`, { prompt: "a b c", stream: true })
      expect(r.status).toBe(200)
      const data = sseData(r.text)
      expect(data).not.toContain("[DONE]")
      expect(data.some((d) => d.includes('"error"'))).toBe(false)
    } finally {
      await setFaults({ errorRate: 0 })
    }
  })

  it("a whole response gets no bytes at all before the connection closes", async () => {
    await setFaults({ errorRate: 1, errorKind: "midstream" })
    try {
      const outcome = await new Promise<string>((resolve) => {
        const body = JSON.stringify({ prompt: "a b c" })
        const req = http.request(`${mlx.url}/v1/completions`, {
          method: "POST",
          headers: { "content-type": "application/json", "content-length": Buffer.byteLength(body) }
        })
        req.on("response", (res) => resolve(`response ${res.statusCode}`))
        req.on("error", (e: NodeJS.ErrnoException) => resolve(e.code ?? e.message))
        req.end(body)
      })
      expect(outcome).toBe("ECONNRESET")
    } finally {
      await setFaults({ errorRate: 0 })
    }
  })
})

describe("mlx-lm --max-tokens", () => {
  it("is the completion length of a request that names none (512 without the flag)", async () => {
    const capped = await startSim({
      flavor: "mlx",
      args: ["--model", "m", "--max-tokens", "3", "--sim-mode", "random"]
    })
    try {
      await pollUntil(
        async () => ((await getJson(`${capped.url}/sim/state`)).json as { ready: boolean }).ready || undefined
      )
      const r = await postJson(`${capped.url}/v1/completions`, { prompt: "a" })
      expect(r.json).toMatchObject({ choices: [{ finish_reason: "length" }], usage: { completion_tokens: 3 } })
      const asked = await postJson(`${capped.url}/v1/completions`, { prompt: "a", max_tokens: 5 })
      expect(asked.json).toMatchObject({ usage: { completion_tokens: 5 } })
    } finally {
      await capped.stop()
    }
    const words = Array.from({ length: 600 }, (_, i) => `w${i}`).join(" ")
    const r = await postJson(`${mlx.url}/v1/completions`, { prompt: words })
    expect(r.json).toMatchObject({ choices: [{ finish_reason: "length" }], usage: { completion_tokens: 512 } })
  })
})
