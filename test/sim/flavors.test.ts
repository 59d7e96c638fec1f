// SGLang, llama.cpp and mlx flavors of the simulator: readiness phases during load, /v1/models names,
// error bodies, metrics names (and their absence), and mlx's Content-Length / model-field rules.
import * as http from "node:http"
import { Effect, Result } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { decodeConfigObject } from "../../src/layers/config/Config.ts"
import { engineFor } from "../../src/layers/engine/backends/index.ts"
import { probeOnce } from "../../src/layers/engine/probe.ts"
import { parseArgs } from "../../src/sim/args.ts"
import { freePort } from "../support/ports.ts"
import { getJson, pollUntil, postJson, type SimHandle, sseData, startSim } from "../support/sim.ts"
import { simGguf } from "../support/simModel.ts"

let sglang: SimHandle
let llama: SimHandle
let llamaNoMetrics: SimHandle
let mlx: SimHandle
// Long enough that the four simulators' starts, run together on a busy 2-core machine, all end before the first
// of them has loaded: every "still loading" check below must land inside it.
const DELAY = ["--sim-startup-delay", "5s"]
/** SGLang listens once its model is loaded, then warms up (/health 503) for this long. */
const WARMUP = ["--sim-warmup", "5s"]

beforeAll(async () => {
  ;[sglang, llama, mlx, llamaNoMetrics] = await Promise.all([
    startSim({
      args: ["--model-path", "org/sg", "--served-model-name", "sg", "--tp-size", "1", "--enable-metrics", ...WARMUP]
    }),
    startSim({ args: ["-m", simGguf("tiny.gguf"), "-c", "2048", "-np", "3", "-ngl", "999", "--metrics", ...DELAY] }),
    startSim({ args: ["--model", "mlx-community/tiny", ...DELAY] }),
    startSim({ args: ["-hf", "org/repo:Q4_K_M", "-a", "alias"] })
  ])
})
afterAll(() => Promise.all([sglang, llama, mlx, llamaNoMetrics].map((s) => s?.stop())))

const waitReady = (s: SimHandle) =>
  pollUntil(async () => ((await getJson(`${s.url}/sim/state`)).json as { ready: boolean }).ready || undefined)

describe("loading phases", () => {
  // All three load (SGLang: warms up) concurrently (5 s), so every "still loading" check runs before any "loaded" wait.
  it("SGLang's /health 503s while a completion waits, llama.cpp answers Loading model, mlx is healthy while generation waits", async () => {
    expect((await fetch(`${sglang.url}/health`)).status).toBe(503)
    // Not refused: SGLang takes the request and it runs once the server is up.
    const early = postJson(`${sglang.url}/v1/completions`, { prompt: "a b", max_tokens: 2 })

    const loading = { error: { code: 503, message: "Loading model", type: "unavailable_error" } }
    const h = await getJson(`${llama.url}/health`)
    expect(h).toMatchObject({ status: 503, json: loading })
    const c = await postJson(`${llama.url}/v1/chat/completions`, { messages: [{ role: "user", content: "x" }] })
    expect(c).toMatchObject({ status: 503, json: loading })

    expect(await getJson(`${mlx.url}/health`)).toMatchObject({ status: 200, json: { status: "ok" } })
    expect(((await getJson(`${mlx.url}/sim/state`)).json as { ready: boolean }).ready).toBe(false)
    const late = await postJson(`${mlx.url}/v1/completions`, {
      model: "default_model",
      prompt: "late words",
      max_tokens: 5
    })
    expect(late.status).toBe(200)
    expect(late.json).toMatchObject({ choices: [{ text: "late words", finish_reason: "stop" }] })
    expect(((await getJson(`${mlx.url}/sim/state`)).json as { ready: boolean }).ready).toBe(true)

    await waitReady(sglang)
    expect((await fetch(`${sglang.url}/health`)).status).toBe(200)
    expect(await early).toMatchObject({ status: 200, json: { choices: [{ text: "a b" }] } })
    await waitReady(llama)
    expect(await getJson(`${llama.url}/health`)).toMatchObject({ status: 200, json: { status: "ok" } })
  })
})

describe("SGLang flavor", () => {
  it("serves the served name, streams, and reports sglang metrics", async () => {
    await waitReady(sglang)
    expect((await getJson(`${sglang.url}/v1/models`)).json).toMatchObject({ data: [{ id: "sg", owned_by: "sglang" }] })
    const s = await postJson(`${sglang.url}/v1/chat/completions`, {
      model: "sg",
      messages: [{ role: "user", content: "p q r" }],
      stream: true,
      stream_options: { include_usage: true }
    })
    const data = sseData(s.text)
    expect(data.at(-1)).toBe("[DONE]")
    expect(JSON.parse(data.at(-2) ?? "{}")).toMatchObject({ choices: [], usage: { prompt_tokens: 3 } })
    const text = await (await fetch(`${sglang.url}/metrics`)).text()
    // The scheduler's gauges carry its parallel ranks (no dp_rank without --dp-size); the tokenizer manager's
    // counters only the model and engine type.
    const scheduler = 'engine_type="unified",model_name="sg",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
    for (const n of ["sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"]) {
      expect(text).toMatch(new RegExp(`^${n}\\{${scheduler}\\} `, "m"))
    }
    expect(text).toMatch(/^sglang:prompt_tokens_total\{engine_type="unified",model_name="sg"\} \d+\.0$/m)
    expect(text).not.toContain("dp_rank")
    expect(text).toContain("# TYPE sglang:time_to_first_token_seconds histogram")
  })

  it("uses the flat error body", async () => {
    const r = await postJson(`${sglang.url}/v1/chat/completions`, { model: "sg" })
    expect(r.status).toBe(400)
    const body = r.json as Record<string, unknown>
    expect(Object.keys(body).sort()).toEqual(["code", "message", "object", "param", "type"])
    expect(body).toMatchObject({ object: "error", code: 400 })
    // Any model name is served, and echoed (sgl-project/sglang#4293: "the model field is only for compatibility").
    const other = await postJson(`${sglang.url}/v1/completions`, { model: "other", prompt: "a" })
    expect(other).toMatchObject({ status: 200, json: { model: "other" } })
  })

  it("has no /metrics without --enable-metrics", async () => {
    const plain = await startSim({ args: ["--model-path", "m"] })
    try {
      expect((await fetch(`${plain.url}/metrics`)).status).toBe(404)
    } finally {
      await plain.stop()
    }
  })
})

describe("llama.cpp flavor", () => {
  it("names the model by file name or alias and ignores the request's model", async () => {
    await waitReady(llama)
    expect((await getJson(`${llama.url}/v1/models`)).json).toMatchObject({
      object: "list",
      data: [{ id: "tiny.gguf" }]
    })
    expect((await getJson(`${llamaNoMetrics.url}/v1/models`)).json).toMatchObject({
      models: [{ name: "alias", details: { format: "gguf" } }],
      data: [{ id: "alias", aliases: ["alias"], owned_by: "llamacpp", meta: { n_ctx_train: expect.any(Number) } }]
    })
    const r = await postJson(`${llama.url}/v1/completions`, { model: "anything", prompt: "z", max_tokens: 3 })
    expect(r.json).toMatchObject({ model: "tiny.gguf", choices: [{ text: "z", finish_reason: "stop" }] })
  })

  it("reports llamacpp metrics without labels, honours -np, and 501s /metrics without --metrics", async () => {
    const text = await (await fetch(`${llama.url}/metrics`)).text()
    for (const n of [
      "llamacpp:requests_processing",
      "llamacpp:requests_deferred",
      "llamacpp:prompt_tokens_total",
      "llamacpp:tokens_predicted_total",
      "llamacpp:n_decode_total",
      "llamacpp:prompt_tokens_cached_total",
      "llamacpp:spec_decode_num_drafts_total"
    ]) {
      expect(text).toMatch(new RegExp(`^${n} \\d`, "m"))
    }
    expect((await getJson(`${llama.url}/props`)).json).toMatchObject({ total_slots: 3 })
    // llama-server's words (measured: test/real/sim-differential-5.test.ts compares them with the real one's)
    const off = await fetch(`${llamaNoMetrics.url}/metrics`)
    expect([off.status, await off.text()]).toEqual([
      501,
      '{"error":{"code":501,"message":"This server does not support metrics endpoint. Start it with `--metrics`","type":"not_supported_error"}}'
    ])
  })

  it("a prompt over a slot's context (-c 2048 over -np 3: 682 padded to 768): 400 exceed_context_size_error with the counts", async () => {
    await waitReady(llama)
    const prompt = Array.from({ length: 800 }, () => "w").join(" ")
    const r = await postJson(`${llama.url}/v1/completions`, { prompt, max_tokens: 2, stream: true })
    expect(r.status).toBe(400)
    expect(r.json).toEqual({
      error: {
        code: 400,
        message: "request (801 tokens) exceeds the available context size (768 tokens), try increasing it",
        type: "exceed_context_size_error",
        n_prompt_tokens: 801,
        n_ctx: 768
      }
    })
    // max_tokens past the context is not refused: generation stops at the end of the slot's context.
    const ok = await postJson(`${llama.url}/v1/completions`, { prompt: "a b", max_tokens: 5000 })
    expect(ok.status).toBe(200)
  })

  it("streams as llama-server does: completions end with finish_reason, usage and timings in one chunk", async () => {
    await waitReady(llama)
    const c = await postJson(`${llama.url}/v1/completions`, { prompt: "a b", max_tokens: 2, stream: true })
    const data = sseData(c.text)
    expect(data.at(-1)).toBe("[DONE]")
    const last = JSON.parse(data.at(-2) ?? "{}")
    expect(last).toMatchObject({
      object: "text_completion",
      system_fingerprint: expect.any(String),
      // Two words echoed at max_tokens 2: the budget ends it before the end-of-sequence token would.
      choices: [{ text: "", finish_reason: "length" }],
      usage: { completion_tokens: 2, prompt_tokens_details: { cached_tokens: 0 } },
      timings: { predicted_n: 2 }
    })
    const chat = await postJson(`${llama.url}/v1/chat/completions`, {
      messages: [{ role: "user", content: "a b" }],
      max_tokens: 2,
      stream: true,
      stream_options: { include_usage: true }
    })
    const chunks = sseData(chat.text)
      .slice(0, -1)
      .map((d) => JSON.parse(d))
    expect(chunks[0].choices[0].delta).toEqual({ role: "assistant", content: null })
    expect(chunks.at(-1)).toMatchObject({ choices: [], usage: { completion_tokens: 2 }, timings: { predicted_n: 2 } })
  })

  it("a mid-stream error ends the stream without data: [DONE]", async () => {
    const s = await startSim({
      args: ["-m", simGguf("m.gguf"), "--metrics", "--sim-error-rate", "1", "--sim-error-kind", "midstream"]
    })
    try {
      const r = await postJson(`${s.url}/v1/completions`, { prompt: "a b c", stream: true })
      const data = sseData(r.text)
      expect(JSON.parse(data.at(-1) ?? "{}")).toEqual({
        error: { code: 500, message: expect.any(String), type: "server_error" }
      })
      expect(data).not.toContain("[DONE]")
    } finally {
      await s.stop()
    }
  })

  it("uses {error:{code,message,type}}", async () => {
    const r = await postJson(`${llama.url}/v1/completions`, { max_tokens: 2 })
    expect(r.status).toBe(400)
    expect(r.json).toEqual({ error: { code: 400, message: expect.any(String), type: "invalid_request_error" } })
  })

  // cpp-httplib's keep-alive (CPPHTTPLIB_KEEPALIVE_TIMEOUT_SECOND 5, CPPHTTPLIB_KEEPALIVE_MAX_COUNT 100): the
  // connection reuse the agent's client meets with llama-server
  it("keeps a connection 5 s idle and for 100 requests, the 100th answered with Connection: close", async () => {
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 })
    const get = (path = "/health") =>
      new Promise<{ headers: http.IncomingHttpHeaders; status: number; reused: boolean }>((resolve, reject) => {
        const req = http
          .get(`${llamaNoMetrics.url}${path}`, { agent }, (res) => {
            res.resume()
            res.on("end", () =>
              resolve({ headers: res.headers, status: res.statusCode ?? 0, reused: req.reusedSocket })
            )
          })
          .on("error", reject)
      })
    try {
      // the simulator's own requests count too, as node counts every request on the connection
      const answers = [await get("/sim/state")]
      for (let i = 1; i < 100; i++) answers.push(await get())
      expect(answers[1]?.headers["keep-alive"]).toMatch(/^timeout=5\b/)
      // cpp-httplib sends Keep-Alive with no Connection header, and `Connection: close` (no Keep-Alive) at the end
      expect(answers.slice(1).map((a) => [a.headers.connection, a.headers["keep-alive"]])).toEqual([
        ...Array(98).fill([undefined, "timeout=5, max=100"]),
        ["close", undefined]
      ])
      // and closes it: the 101st request goes on a new connection, answered (node's own limit would answer 503)
      expect(await get()).toMatchObject({ status: 200, reused: false })
    } finally {
      agent.destroy()
    }
  })
})

describe("mlx flavor", () => {
  it("requires Content-Length (411)", async () => {
    const status = await new Promise<number>((resolve, reject) => {
      const req = http.request(
        `${mlx.url}/v1/completions`,
        { method: "POST", headers: { "transfer-encoding": "chunked" } },
        (res) => {
          res.resume()
          resolve(res.statusCode ?? 0)
        }
      )
      req.on("error", reject)
      req.write('{"prompt":"a"}')
      req.end()
    })
    expect(status).toBe(411)
  })

  it("answers 404 {error: string} for a model other than the configured one", async () => {
    const r = await postJson(`${mlx.url}/v1/chat/completions`, {
      model: "org/other",
      messages: [{ role: "user", content: "a" }]
    })
    expect(r.status).toBe(404)
    expect(r.json).toEqual({ error: expect.any(String) })
    const ok = await postJson(`${mlx.url}/chat/completions`, {
      model: "mlx-community/tiny",
      messages: [{ role: "user", content: "a" }]
    })
    expect(ok.status).toBe(200)
  })

  it("lists the --model value and has no /metrics", async () => {
    expect((await getJson(`${mlx.url}/v1/models`)).json).toMatchObject({ data: [{ id: "mlx-community/tiny" }] })
    expect((await fetch(`${mlx.url}/metrics`)).status).toBe(404)
  })
})

describe("vLLM block size: the platform's choice unless --block-size is given", () => {
  const renderVllm = (port: number, kv: Record<string, unknown>) => {
    const r = decodeConfigObject(
      { engine: { kind: "vllm", url: `http://127.0.0.1:${port}` }, models: { m: { hf_repo: "org/m" } }, kv },
      undefined,
      { NODE_NAME: "n" }
    )
    if (Result.isFailure(r)) throw new Error(r.failure.message)
    return { config: r.success, plan: engineFor("vllm").render(r.success) }
  }
  const blockSizeOf = async (s: SimHandle) =>
    ((await getJson(`${s.url}/sim/state`)).json as { kvBlockSize: number }).kvBlockSize

  it("with KV events on, the rendered command makes the engine use [kv].block_size, whatever the platform picks", async () => {
    const [port, kvPort] = [await freePort(), await freePort()]
    const { config, plan } = renderVllm(port, { events: true, events_endpoint: `tcp://127.0.0.1:${kvPort}` })
    // A platform whose attention backend wants 64-token blocks (vLLM picks it when --block-size is absent).
    const sim = await startSim({ args: [...plan.argv.slice(1), "--sim-platform-block-size", "64"] })
    try {
      expect(await blockSizeOf(sim)).toBe(config.kv.block_size)
    } finally {
      await sim.stop()
    }
  })

  it("without --block-size the simulator takes the platform's size, as vLLM does", async () => {
    const sim = await startSim({ args: ["serve", "m", "--sim-platform-block-size", "64"] })
    try {
      expect(await blockSizeOf(sim)).toBe(64)
    } finally {
      await sim.stop()
    }
  })
})

describe("rendered commands that the engines refuse at start", () => {
  const render = (raw: Record<string, Record<string, unknown>>) => {
    const r = decodeConfigObject({ models: { m: { hf_repo: "org/m" } }, ...raw }, undefined, { NODE_NAME: "n" })
    if (Result.isFailure(r)) throw new Error(r.failure.message)
    const plan = engineFor(r.success.engine.kind).render(r.success)
    return { argv: plan.argv.slice(plan.kind === "sglang" ? 3 : 1), env: plan.env }
  }

  it("SGLang decode + hierarchical cache: refused unless the decode radix cache is enabled", () => {
    const { argv } = render({ engine: { kind: "sglang", kv_offload: "hicache" }, agent: { role: "decode" } })
    expect(parseArgs(argv, {}).disaggregationMode).toBe("decode")
    const without = argv.filter((a) => a !== "--disaggregation-decode-enable-radix-cache")
    expect(() => parseArgs(without, {})).toThrow(
      /enable-hierarchical-cache and disable-radix-cache are mutually exclusive/
    )
  })

  it("vLLM + KVBM: refused without a cache tier, started with [engine].kvbm_cpu_cache_gb", () => {
    const sized = render({ engine: { kv_offload: "kvbm", kvbm_cpu_cache_gb: 4, kvbm_disk_cache_gb: 8 } })
    expect(sized.env).toEqual({ DYN_KVBM_CPU_CACHE_GB: "4", DYN_KVBM_DISK_CACHE_GB: "8" })
    expect(parseArgs(sized.argv, sized.env).kvTransferConfig).toMatchObject({ kv_connector: "DynamoConnector" })
    const bare = render({ engine: { kv_offload: "kvbm" } })
    expect(() => parseArgs(bare.argv, bare.env)).toThrow(/At least one cache tier must be configured/)
    const viaEnv = render({ engine: { kv_offload: "kvbm", env: { DYN_KVBM_DISK_CACHE_GB: "8" } } })
    expect(parseArgs(viaEnv.argv, viaEnv.env).flavor).toBe("vllm")
  })
})

describe("SGLang readiness through the agent's probe", () => {
  it("binds its port only after the model loads (--sim-startup-delay), as vLLM: SGLang starts uvicorn after the load", async () => {
    const sim = await startSim({ args: ["--model-path", "org/m", "--sim-startup-delay", "1500ms"] })
    try {
      // the simulator's own log: up ("starting"), loaded, and listening no sooner than the delay later
      const at = (msg: string): number => {
        const line = sim.stderrLines.find((l) => l.includes(`"msg":"${msg}"`))
        if (line === undefined) throw new Error(`no "${msg}" line in:\n${sim.stderrLines.join("\n")}`)
        return Date.parse((JSON.parse(line) as { ts: string }).ts)
      }
      expect(at("listening") - at("starting")).toBeGreaterThanOrEqual(1_490)
      // no warm-up asked: healthy as soon as it listens
      await pollUntil(async () => ((await fetch(`${sim.url}/health`)).status === 200 ? true : undefined))
    } finally {
      await sim.stop()
    }
  })

  it("not ready while the server warms up (/health 503, though /v1/models already answers), ready after", async () => {
    const port = await freePort()
    const r = decodeConfigObject(
      { engine: { kind: "sglang", url: `http://127.0.0.1:${port}` }, models: { m: { hf_repo: "org/m" } } },
      undefined,
      { NODE_NAME: "n" }
    )
    if (Result.isFailure(r)) throw new Error(r.failure.message)
    const plan = engineFor("sglang").render(r.success)
    const sim = await startSim({ args: [...plan.argv.slice(3), "--sim-warmup", "3s"] })
    try {
      expect((await getJson(`${sim.url}/v1/models`)).status).toBe(200)
      expect(await Effect.runPromise(probeOnce(plan.probe, 2_000))).toEqual({
        ok: false,
        reason: "HTTP 503",
        phase: "loading"
      })
      await pollUntil(async () => ((await Effect.runPromise(probeOnce(plan.probe, 2_000))).ok ? true : undefined))
      expect(await Effect.runPromise(probeOnce(plan.liveness ?? plan.probe, 2_000))).toEqual({ ok: true })
    } finally {
      await sim.stop()
    }
  })
})
