// Engine behaviours of the simulator that the other simulator tests leave open (a mutation audit found each
// unguarded), one engine fact per case: mlx-lm's prefill step behind its keepalive comments, llama-server's
// first-chunk-before-ping, vLLM's P/D hand-off only on a length finish and without block ids no transfer, an
// injected mid-stream fault after the first token, SGLang's engine_type label, vLLM's seed bound, SGLang's
// default page size, and mlx-lm dropping a held stop prefix at the end of sequence.
import * as http from "node:http"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { VLLM_PREFILL_KV_TRANSFER_PARAMS } from "../../src/services/grpc/Handoff.ts"
import { parseArgs } from "../../src/sim/args.ts"
import { mlxKeepalives } from "../../src/sim/mlxChunks.ts"
import { freePort } from "../support/ports.ts"
import { getJson, pollUntil, postJson, type SimHandle, sseData, startNixlPair, startSim } from "../support/sim.ts"
import { simGguf } from "../support/simModel.ts"

const started: Array<SimHandle> = []
const start = async (...args: Parameters<typeof startSim>) => {
  const s = await startSim(...args)
  started.push(s)
  return s
}
afterAll(() => Promise.all(started.map((s) => s.stop())))

const state = async (s: SimHandle) =>
  (await getJson(`${s.url}/sim/state`)).json as {
    running: number
    kvHeld: number
    localPrefills: number
    kvFetchFailures: number
    engineId: string
  }
const ready = (s: SimHandle) =>
  pollUntil(async () => ((await getJson(`${s.url}/sim/state`)).json as { ready: boolean }).ready || undefined)

describe("pure engine defaults", () => {
  it("mlx-lm: `: keepalive N/M` after each prefill step of 2048 tokens (generate_step prefill_step_size)", () => {
    expect(mlxKeepalives({ promptTokens: 5000, cachedTokens: 0 })).toBe(
      ": keepalive 0/5000\n\n: keepalive 2048/5000\n\n: keepalive 4096/5000\n\n: keepalive 4999/5000\n\n"
    )
  })

  it("SGLang: --page-size defaults to 1 (server_args.py), the block size of its KV cache and events", () => {
    expect(parseArgs(["--model-path", "m"]).blockSize).toBe(1)
    expect(parseArgs(["--model-path", "m", "--page-size", "16"]).blockSize).toBe(16)
  })
})

describe("llama-server, a stream stalled before its first chunk", () => {
  it("gets no SSE ping: llama-server awaits the first result before its ping loop", async () => {
    const sim = await start({
      flavor: "llama_cpp",
      args: ["-m", simGguf("m.gguf"), "--sse-ping-interval", "0.05", "--sim-stall-after-tokens", "0"]
    })
    let text = ""
    const req = http.request(`${sim.url}/v1/completions`, { method: "POST" }, (res) => {
      res.setEncoding("utf8")
      res.on("data", (c: string) => {
        text += c
      })
    })
    req.on("error", () => {})
    req.end(JSON.stringify({ prompt: "a b c", stream: true }))
    try {
      await pollUntil(async () => ((await state(sim)).running === 1 ? true : undefined))
      // Absence needs a window: eight ping intervals, each of which would have written `:\n\n`.
      await new Promise((r) => setTimeout(r, 400))
      expect(text).not.toContain(":\n\n")
    } finally {
      req.destroy()
    }
    await pollUntil(async () => ((await state(sim)).running === 0 ? true : undefined))
  })
})

describe("vLLM P/D over the side channel", () => {
  let p: SimHandle
  let d: SimHandle
  let pSide: number
  beforeAll(async () => {
    ;({ p, d, pSide } = await startNixlPair(["--sim-block-size", "2"]))
    started.push(p, d)
  })
  const prefillParams = VLLM_PREFILL_KV_TRANSFER_PARAMS

  it("a prefill leg ending before its length (end of sequence, stop string) hands nothing off and holds no block", async () => {
    // NixlConnector.request_finished: only a FINISHED_LENGTH_CAPPED request keeps its blocks and returns params.
    for (const extra of [{ max_tokens: 8 }, { max_tokens: 8, stop: [" gamma"] }]) {
      const r = await postJson(`${p.url}/v1/completions`, {
        model: "m",
        prompt: "alpha beta gamma delta",
        ...extra,
        kv_transfer_params: prefillParams
      })
      expect(r.status).toBe(200)
      const body = r.json as { choices: Array<{ finish_reason: string }>; kv_transfer_params: unknown }
      expect([body.choices[0]?.finish_reason, body.kv_transfer_params]).toEqual(["stop", null])
      expect((await state(p)).kvHeld).toBe(0)
    }
  })

  it("a decode leg whose otherwise complete params have no block ids computes locally, fetching nothing", async () => {
    // update_state_after_alloc: params without remote_block_ids are "invalid KVTransferParams", no KV transfer.
    const before = await state(d)
    const r = await postJson(`${d.url}/v1/completions`, {
      model: "m",
      prompt: "alpha beta gamma delta",
      max_tokens: 2,
      kv_transfer_params: {
        do_remote_prefill: true,
        do_remote_decode: false,
        remote_block_ids: [],
        remote_engine_id: (await state(p)).engineId,
        remote_request_id: "cmpl-none",
        remote_host: "127.0.0.1",
        remote_port: pSide,
        tp_size: 1
      }
    })
    expect(r.status).toBe(200)
    const after = await state(d)
    expect([after.localPrefills - before.localPrefills, after.kvFetchFailures - before.kvFetchFailures]).toEqual([1, 0])
  })

  it("refuses no seed within torch.long: 2^63-1 and -2^63 are answered", async () => {
    // vLLM: `seed: int | None = Field(None, ge=_LONG_INFO.min, le=_LONG_INFO.max)`; raw text, JSON.parse rounds it.
    for (const seed of ["9223372036854775807", "-9223372036854775808"]) {
      const res = await fetch(`${p.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: `{"model":"m","prompt":"a","max_tokens":1,"seed":${seed}}`
      })
      expect([seed, res.status]).toEqual([seed, 200])
      await res.text()
    }
  })
})

describe("an injected mid-stream fault", () => {
  it("comes after the first token: a token chunk, then the error event and [DONE]", async () => {
    const s = await start({ args: ["serve", "m", "--sim-error-rate", "1", "--sim-error-kind", "midstream"] })
    const r = await postJson(`${s.url}/v1/completions`, { prompt: "a b c", max_tokens: 3, stream: true })
    expect(r.status).toBe(200)
    const data = sseData(r.text)
    expect(data).toHaveLength(3)
    expect(JSON.parse(data[0] ?? "{}")).toMatchObject({ choices: [{ text: "a" }] })
    expect(JSON.parse(data[1] ?? "{}")).toMatchObject({ error: { code: 500 } })
    expect(data[2]).toBe("[DONE]")
  })
})

describe("SGLang metrics of a P/D engine", () => {
  it("label engine_type with --disaggregation-mode", async () => {
    const s = await start({
      args: [
        "--model-path",
        "m",
        "--enable-metrics",
        "--disaggregation-mode",
        "prefill",
        "--disaggregation-bootstrap-port",
        String(await freePort())
      ]
    })
    await ready(s)
    const page = await (await fetch(`${s.url}/metrics`)).text()
    const labelled = page.split("\n").filter((l) => l.startsWith("sglang:") && l.includes("engine_type="))
    expect(labelled.length).toBeGreaterThan(0)
    expect(labelled.filter((l) => !l.includes('engine_type="prefill"'))).toEqual([])
  })
})

describe("mlx-lm, a stream whose last token begins a stop string", () => {
  it("drops the held token at the end of sequence (its stop condition clears the segment)", async () => {
    const s = await start({ flavor: "mlx", args: ["--model", "mlx-community/tiny"] })
    await ready(s)
    const r = await postJson(`${s.url}/v1/completions`, {
      prompt: "one two three",
      max_tokens: 50,
      stop: [" three four"],
      stream: true
    })
    expect(r.status).toBe(200)
    const chunks = sseData(r.text)
      .filter((d) => d !== "[DONE]")
      .map((d) => (JSON.parse(d) as { choices: Array<{ text: string; finish_reason: string | null }> }).choices[0])
    expect(chunks.map((c) => [c?.text, c?.finish_reason])).toEqual([
      ["one", null],
      [" two", null],
      ["", "stop"]
    ])
  })
})
