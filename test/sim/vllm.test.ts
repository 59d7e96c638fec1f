// The simulator's vLLM flavor as a real subprocess: endpoints, body shapes, SSE, errors, metrics, queueing,
// client-disconnect aborts, and startup (no listener until loaded).
import * as http from "node:http"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { loadSignals } from "../../src/services/engine/PromText.ts"
import { freePort } from "../support/ports.ts"
import { getJson, pollUntil, postJson, type SimHandle, sseData, startSim } from "../support/sim.ts"

let sim: SimHandle
const state = async () => (await getJson(`${sim.url}/sim/state`)).json as Record<string, unknown>

beforeAll(async () => {
  sim = await startSim({
    args: [
      "serve",
      "org/model",
      "--served-model-name",
      "served",
      "other-name",
      "--tensor-parallel-size",
      "2",
      "--max-model-len",
      "64",
      "--gpu-memory-utilization",
      "0.8",
      "--some-unknown-flag",
      "x",
      "--sim-max-seqs",
      "2",
      "--sim-block-size",
      "4"
    ]
  })
})
afterAll(() => sim?.stop())

describe("vLLM flavor", () => {
  it("logs unmodelled flags once and serves /health with an empty 200", async () => {
    const lines = sim.stderrLines.filter((l) => l.includes("unmodelled"))
    expect(lines).toHaveLength(1)
    expect(lines[0]).toContain("--some-unknown-flag")
    const res = await fetch(`${sim.url}/health`)
    expect(res.status).toBe(200)
    expect(await res.text()).toBe("")
  })

  it("lists the first served name in /v1/models", async () => {
    const { json } = await getJson(`${sim.url}/v1/models`)
    expect(json).toMatchObject({
      object: "list",
      data: [{ id: "served", object: "model", owned_by: "vllm", root: "org/model", max_model_len: 64 }]
    })
  })

  it("answers non-streaming chat with echo and finish_reason stop / length", async () => {
    const r = await postJson(`${sim.url}/v1/chat/completions`, {
      model: "served",
      messages: [{ role: "user", content: "one two three" }],
      max_tokens: 10
    })
    expect(r.status).toBe(200)
    expect(r.json).toMatchObject({
      object: "chat.completion",
      model: "served",
      choices: [{ index: 0, message: { role: "assistant", content: "one two three" }, finish_reason: "stop" }],
      usage: { prompt_tokens: 3, completion_tokens: 3, total_tokens: 6 },
      kv_transfer_params: null
    })
    const cut = await postJson(`${sim.url}/v1/completions`, { prompt: "a b c d e", max_tokens: 2 })
    expect(cut.json).toMatchObject({ object: "text_completion", choices: [{ text: "a b", finish_reason: "length" }] })
  })

  it("streams chat chunks, the usage chunk with choices [] and [DONE]", async () => {
    const r = await postJson(`${sim.url}/v1/chat/completions`, {
      messages: [{ role: "user", content: "x y" }],
      stream: true,
      stream_options: { include_usage: true }
    })
    expect(r.headers.get("content-type")).toContain("text/event-stream")
    const data = sseData(r.text)
    expect(data.at(-1)).toBe("[DONE]")
    const chunks = data.slice(0, -1).map((d) => JSON.parse(d))
    expect(chunks[0].choices[0].delta).toEqual({ role: "assistant", content: "" })
    expect(chunks.map((c) => c.choices[0]?.delta?.content ?? "").join("")).toBe("x y")
    expect(chunks.at(-2).choices[0].finish_reason).toBe("stop")
    expect(chunks.at(-1)).toMatchObject({
      object: "chat.completion.chunk",
      choices: [],
      usage: { completion_tokens: 2 }
    })
    const noUsage = sseData((await postJson(`${sim.url}/v1/completions`, { prompt: "p q", stream: true })).text)
    expect(noUsage.some((d) => d.includes('"usage"'))).toBe(false)
  })

  it("refuses a seed outside int64 with 400, as vLLM's request model bounds it (a uint64 that fits passes)", async () => {
    const ask = (seed: string) =>
      fetch(`${sim.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: `{"prompt":"a b","max_tokens":1,"seed":${seed}}`
      })
    const over = await ask("18446744073709551615")
    expect(over.status).toBe(400)
    expect(await over.text()).toContain("less than or equal to 9223372036854775807")
    expect((await ask("-9223372036854775809")).status).toBe(400)
    expect((await ask("9223372036854775807")).status).toBe(200)
    expect((await ask("-1")).status).toBe(200)
  })

  it("random mode is deterministic for a request seed", async () => {
    // The shared simulator is in echo mode; random mode is covered by a second one.
    const rnd = await startSim({ args: ["serve", "m", "--sim-mode", "random", "--sim-seed", "7"] })
    try {
      const a = await postJson(`${rnd.url}/v1/completions`, { prompt: "hi", max_tokens: 8, seed: 3 })
      const b = await postJson(`${rnd.url}/v1/completions`, { prompt: "hi", max_tokens: 8, seed: 3 })
      const ca = (a.json as { choices: Array<{ text: string; finish_reason: string }> }).choices[0]
      expect(ca?.finish_reason).toBe("length")
      expect(ca?.text.split(" ")).toHaveLength(8)
      expect(ca?.text).toBe((b.json as { choices: Array<{ text: string }> }).choices[0]?.text)
    } finally {
      await rnd.stop()
    }
  })

  it.each([
    // a required field pydantic misses: FastAPI's RequestValidationError, "Bad Request" (upstream-refusals.test.ts)
    ["missing messages", "/v1/chat/completions", { model: "served" }, 400, "Bad Request"],
    ["missing prompt", "/v1/completions", { model: "served" }, 400, "BadRequestError"],
    ["max_tokens 0", "/v1/completions", { prompt: "a", max_tokens: 0 }, 400, "BadRequestError"],
    ["over max-model-len", "/v1/completions", { prompt: "a", max_tokens: 100 }, 400, "BadRequestError"],
    // No max_tokens: a prompt that fills the context leaves no room for a token (OpenAIServing._validate_input).
    [
      "a prompt filling max-model-len",
      "/v1/chat/completions",
      { messages: [{ role: "user", content: Array.from({ length: 64 }, (_, i) => `w${i}`).join(" ") }] },
      400,
      "BadRequestError"
    ],
    ["unknown model", "/v1/completions", { model: "nope", prompt: "a" }, 404, "NotFoundError"]
  ])("rejects %s with vLLM's error body", async (_name, path, body, status, type) => {
    const r = await postJson(`${sim.url}${path}`, body)
    expect(r.status).toBe(status)
    const err = (r.json as { error: Record<string, unknown> }).error
    expect(Object.keys(err)).toEqual(["message", "type", "param", "code"])
    expect(err).toMatchObject({ message: expect.any(String), type, code: status })
  })

  it("exposes vLLM metric names with engine/model_name labels reflecting the state", async () => {
    const text = await (await fetch(`${sim.url}/metrics`)).text()
    for (const name of [
      "vllm:num_requests_running",
      "vllm:num_requests_waiting",
      "vllm:kv_cache_usage_perc",
      "vllm:prompt_tokens_total",
      "vllm:generation_tokens_total",
      "vllm:prefix_cache_queries_total",
      "vllm:prefix_cache_hits_total"
    ]) {
      expect(text).toMatch(new RegExp(`^${name}\\{engine="0",model_name="served"\\} \\d`, "m"))
    }
    expect(text).toContain("# TYPE vllm:prompt_tokens_total counter")
    expect(text).toContain("# TYPE vllm:time_to_first_token_seconds histogram")
    // prometheus_client writes a sample's labels sorted by name (exposition.py, generate_latest).
    expect(text).toMatch(/^vllm:time_to_first_token_seconds_bucket\{engine="0",le="\+Inf",model_name="served"\} [1-9]/m)
    expect(text).toMatch(/^vllm:inter_token_latency_seconds_count\{engine="0",model_name="served"\} [1-9]/m)
    expect(text).toMatch(/^vllm:request_success_total\{engine="0",finished_reason="stop",model_name="served"\} [1-9]/m)
    // Every finish reason has its child from the start (PrometheusStatLogger: `for reason in FinishReason`).
    expect(text).toMatch(/^vllm:request_success_total\{engine="0",finished_reason="abort",model_name="served"\} 0\.0$/m)
    const gen = /^vllm:generation_tokens_total\{[^}]*\} (\d+)/m.exec(text)
    expect(Number(gen?.[1])).toBeGreaterThan(0)
  })

  it("queues past --sim-max-seqs and a disconnecting client aborts and frees its slot", async () => {
    const before = (await state()).aborted as number
    await postJson(`${sim.url}/sim/faults`, { stallAfterTokens: 1 })
    const open = () => {
      const req = http.request(`${sim.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" }
      })
      req.on("error", () => {})
      req.end(JSON.stringify({ prompt: "a b c", stream: true }))
      return req
    }
    const reqs = [open(), open(), open()]
    const busy = await pollUntil(async () => {
      const s = await state()
      return s.running === 2 && s.waiting === 1 ? s : undefined
    })
    expect(busy).toMatchObject({ running: 2, waiting: 1 })
    const metrics = await (await fetch(`${sim.url}/metrics`)).text()
    expect(metrics).toMatch(/^vllm:num_requests_running\{[^}]*\} 2\.0$/m)
    expect(metrics).toMatch(/^vllm:num_requests_waiting\{[^}]*\} 1\.0$/m)
    expect(metrics).not.toMatch(/^vllm:kv_cache_usage_perc\{[^}]*\} 0\.0$/m)
    for (const r of reqs) r.destroy()
    const after = await pollUntil(async () => {
      const s = await state()
      return s.running === 0 && s.waiting === 0 ? s : undefined
    })
    expect(after.aborted).toBe(before + 3)
    await postJson(`${sim.url}/sim/faults`, { stallAfterTokens: null })
  })
})

describe("vLLM data parallelism", () => {
  it("routes to the least-loaded rank and exposes one series per rank, which the agent's reader sums", async () => {
    const dp = await startSim({
      args: ["serve", "m", "--data-parallel-size", "2", "--sim-max-seqs", "1", "--sim-stall-after-tokens", "1"]
    })
    const reqs: Array<http.ClientRequest> = []
    try {
      const open = () => {
        const req = http.request(`${dp.url}/v1/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" }
        })
        req.on("error", () => {})
        req.end(JSON.stringify({ prompt: "a b c d e f g h", stream: true }))
        reqs.push(req)
      }
      const settled = (running: number, waiting: number) =>
        pollUntil(async () => {
          const s = (await getJson(`${dp.url}/sim/state`)).json as Record<string, unknown>
          return s.running === running && s.waiting === waiting ? s : undefined
        })
      // One at a time, so each choice sees the previous one: rank 0 (tie, first), rank 1 (score 0 < 1),
      // rank 0 again (tie at 1), where it waits for the one slot.
      open()
      await settled(1, 0)
      open()
      await settled(2, 0)
      open()
      await settled(2, 1)
      const text = await (await fetch(`${dp.url}/metrics`)).text()
      const sample = (name: string, engine: number) =>
        new RegExp(`^${name}\\{engine="${engine}",model_name="m"\\} (\\S+)$`, "m").exec(text)?.[1]
      expect([0, 1].map((e) => sample("vllm:num_requests_running", e))).toEqual(["1.0", "1.0"])
      expect([0, 1].map((e) => sample("vllm:num_requests_waiting", e))).toEqual(["1.0", "0.0"])
      for (const e of [0, 1]) expect(Number(sample("vllm:kv_cache_usage_perc", e))).toBeGreaterThan(0)
      expect(text.match(/^# TYPE vllm:num_requests_running gauge$/gm)).toHaveLength(1)
      // Prompt tokens count once prefilled: the waiting request has none yet.
      expect([0, 1].map((e) => sample("vllm:prompt_tokens_total", e))).toEqual(["8.0", "8.0"])
      const load = loadSignals(text, {
        running: ["vllm:num_requests_running"],
        waiting: ["vllm:num_requests_waiting"],
        kvUsage: ["vllm:kv_cache_usage_perc"]
      })
      expect(load).toMatchObject({ running: 2, waiting: 1 })
    } finally {
      for (const r of reqs) r.destroy()
      await dp.stop()
    }
  })
})

describe("vLLM startup", () => {
  it("binds its port only after the startup delay (the model loads first), then serves /health", async () => {
    const port = await freePort()
    const late = await startSim({ args: ["serve", "m", "--port", String(port), "--sim-startup-delay", "1500ms"] })
    try {
      // The simulator's own log: the process was up ("starting") and bound the port ("listening") no sooner than
      // the delay later. A connect attempt from here could not tell a closed port from a process still booting.
      const at = (msg: string): number => {
        const line = late.stderrLines.find((l) => l.includes(`"msg":"${msg}"`))
        if (line === undefined) throw new Error(`no "${msg}" line in:\n${late.stderrLines.join("\n")}`)
        return Date.parse((JSON.parse(line) as { ts: string }).ts)
      }
      expect(at("listening") - at("starting")).toBeGreaterThanOrEqual(1_490)
      expect(at("model loaded")).toBeLessThanOrEqual(at("listening"))
      expect((await fetch(`${late.url}/health`)).status).toBe(200)
      expect((await getJson(`${late.url}/sim/state`)).json).toMatchObject({ flavor: "vllm", ready: true })
    } finally {
      await late.stop()
    }
  })
})
