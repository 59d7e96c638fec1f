// The simulator's progress counters move when the engines' do, and its wedge fault (POST /sim/faults
// {"wedged": true}) hangs the engine core as a hung real engine's: requests stay counted, counters stand still,
// aborts do not reach the core, /metrics answers what the core last published (llama-server's waits for its loop),
// and {"wedged": false} lets every request go on. What the agent's progress rule reads (EngineProgress.ts).
import * as http from "node:http"
import { afterEach, describe, expect, it } from "vitest"
import { loadSignals } from "../../src/services/engine/PromText.ts"
import { applyFaults, type Faults } from "../../src/sim/faults.ts"
import { getJson, pollUntil, postJson, type SimHandle, startSim } from "../support/sim.ts"
import { simGguf } from "../support/simModel.ts"

let sim: SimHandle | undefined
afterEach(() => sim?.stop())

const VLLM = {
  running: ["vllm:num_requests_running"],
  waiting: ["vllm:num_requests_waiting"],
  kvUsage: [],
  progress: ["vllm:prompt_tokens_total", "vllm:generation_tokens_total"]
}

const signals = async (url: string) => loadSignals(await (await fetch(`${url}/metrics`)).text(), VLLM)
const state = async (url: string) => (await getJson(`${url}/sim/state`)).json as Record<string, number>

/** A completion request left open (its answer never read to the end); `close()` abandons it. */
const open = (url: string, body: Record<string, unknown>) => {
  const req = http.request(`${url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" } })
  req.on("error", () => {})
  const answered = new Promise<string>((resolve) => {
    req.on("response", (res) => {
      let text = ""
      res.on("data", (d: Buffer) => {
        text += d.toString()
      })
      res.on("end", () => resolve(text))
    })
  })
  req.end(JSON.stringify({ prompt: "a b c d", ...body }))
  return { answered, close: () => req.destroy() }
}

describe("the simulator's progress counters", () => {
  it("vLLM: a prompt counts once prefilled (its first token), so a request stuck before it moves nothing", async () => {
    sim = await startSim({ args: ["serve", "m", "--sim-stall-after-tokens", "0"] })
    const stuck = open(sim.url, { max_tokens: 8 })
    await pollUntil(async () => ((await state(sim!.url)).running === 1 ? true : undefined))
    expect(await signals(sim.url)).toMatchObject({
      running: 1,
      progress: { "vllm:prompt_tokens_total": 0, "vllm:generation_tokens_total": 0 }
    })
    stuck.close()
    await postJson(`${sim.url}/sim/faults`, { stallAfterTokens: null })
    expect((await postJson(`${sim.url}/v1/completions`, { prompt: "a b c d", max_tokens: 3 })).status).toBe(200)
    expect((await signals(sim.url)).progress).toEqual({
      "vllm:prompt_tokens_total": 4,
      "vllm:generation_tokens_total": 3
    })
  })
})

describe("the wedge fault", () => {
  it("vLLM: requests stay counted, counters still, aborts unseen; unwedged, every request goes on", async () => {
    // a context that holds 100,000 tokens: vLLM refuses max_tokens past its max_model_len (contextLimit.ts)
    sim = await startSim({
      args: ["serve", "m", "--max-model-len", "200000", "--sim-itl", "5ms", "--sim-mode", "random"]
    })
    const url = sim.url
    const long = open(url, { max_tokens: 100_000, stream: true, ignore_eos: true })
    const abandoned = open(url, { max_tokens: 100_000, stream: true, ignore_eos: true })
    await pollUntil(async () => ((await signals(url)).progress?.["vllm:generation_tokens_total"] ?? 0) > 0 || undefined)
    expect((await postJson(`${url}/sim/faults`, { wedged: true })).status).toBe(200)
    const frozen = await (await fetch(`${url}/metrics`)).text()
    expect(loadSignals(frozen, VLLM).running).toBe(2)
    // a new request is taken and gets nothing; one abandoned stays counted: the core never saw the abort
    const late = open(url, { max_tokens: 2, ignore_eos: true })
    abandoned.close()
    // the late request's arrival and the abort both awaited: on a loaded machine either may come last
    await pollUntil(async () => {
      const st = await state(url)
      return st.aborted === 1 && st.running === 3 ? true : undefined
    })
    const s = await state(url)
    expect(s.running).toBe(3)
    expect(s.served).toBe(0)
    expect(await (await fetch(`${url}/metrics`)).text(), "what the core last published").toBe(frozen)
    expect((await getJson(`${url}/health`)).status, "the API server answers").toBe(200)

    expect((await postJson(`${url}/sim/faults`, { wedged: false })).status).toBe(200)
    expect(await late.answered).toContain('"completion_tokens":2')
    await pollUntil(async () => ((await state(url)).running === 1 ? true : undefined))
    const after = await signals(url)
    expect(after.progress?.["vllm:generation_tokens_total"]).toBeGreaterThan(
      loadSignals(frozen, VLLM).progress?.["vllm:generation_tokens_total"] ?? 0
    )
    long.close()
  })

  it("llama.cpp: /metrics is the server loop's, so it answers only once the loop runs again", async () => {
    sim = await startSim({ flavor: "llama_cpp", args: ["-m", simGguf("m.gguf"), "--metrics"] })
    const url = sim.url
    expect((await postJson(`${url}/sim/faults`, { wedged: true })).status).toBe(200)
    const scrape = fetch(`${url}/metrics`).then((r) => r.text())
    const early = await fetch(`${url}/metrics`, { signal: AbortSignal.timeout(300) }).then(
      () => "answered",
      (e: Error) => e.name
    )
    expect(early).toBe("TimeoutError")
    expect((await postJson(`${url}/sim/faults`, { wedged: false })).status).toBe(200)
    expect(await scrape).toContain("llamacpp:n_decode_total")
  })

  it("vLLM, two DP ranks: one rank hangs alone; a client pins a rank with X-data-parallel-rank", async () => {
    sim = await startSim({ args: ["serve", "m", "--data-parallel-size", "2", "--sim-mode", "random"] })
    const url = sim.url
    const pinned = (rank: string) =>
      postJson(`${url}/v1/completions`, { prompt: "a b", max_tokens: 2 }, { "X-data-parallel-rank": rank })
    // vLLM's range check, and a header that is not a number is no pin
    const out = await pinned("2")
    expect(out.status).toBe(400)
    expect(out.text).toContain("data_parallel_rank 2 is out of range [0, 2).")
    expect((await pinned("one")).status).toBe(200)
    expect((await postJson(`${url}/sim/faults`, { wedged_rank: 1.5 })).status).toBe(400)

    expect((await postJson(`${url}/sim/faults`, { wedged_rank: 1 })).status).toBe(200)
    const before = await (await fetch(`${url}/metrics`)).text()
    const hung = fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-data-parallel-rank": "1" },
      body: JSON.stringify({ prompt: "a b", max_tokens: 2 })
    }).then((r) => r.text())
    // rank 0 serves on
    expect((await pinned("0")).status).toBe(200)
    const early = await Promise.race([hung, new Promise((r) => setTimeout(() => r("no answer"), 300))])
    expect(early).toBe("no answer")
    // rank 1's series are what it last published: its gauges do not count the request it holds
    const rank1 = (page: string) => page.split("\n").filter((l) => l.startsWith("vllm:") && l.includes('engine="1"'))
    expect(rank1(await (await fetch(`${url}/metrics`)).text())).toEqual(rank1(before))
    const held = await state(url)
    expect((held.running ?? 0) + (held.waiting ?? 0)).toBe(1)

    expect((await postJson(`${url}/sim/faults`, { wedged_rank: null })).status).toBe(200)
    expect(await hung).toContain('"completion_tokens":2')
  })

  it("SGLang, two DP replicas: one hangs alone; a client names one with routed_dp_rank (or the header)", async () => {
    sim = await startSim({
      flavor: "sglang",
      args: ["--model-path", "m", "--dp-size", "2", "--enable-metrics", "--sim-mode", "random"]
    })
    const url = sim.url
    const ask = (body: Record<string, unknown>, headers: Record<string, string> = {}) =>
      postJson(`${url}/v1/completions`, { prompt: "a b", max_tokens: 2, ...body }, headers)
    // TokenizerManager's range check, and the header's own
    const out = await ask({ routed_dp_rank: 2 })
    expect(out.status).toBe(400)
    expect(out.text).toContain("routed_dp_rank=2 out of range [0, 2)")
    expect((await ask({}, { "X-Data-Parallel-Rank": "2" })).text).toContain("routed_dp_rank=2 out of range [0, 2)")
    const bad = await ask({ routed_dp_rank: 0 }, { "X-Data-Parallel-Rank": "one" })
    expect(bad.status).toBe(400)
    expect(bad.text).toContain("Invalid X-Data-Parallel-Rank header: must be an integer, got 'one'")

    expect((await postJson(`${url}/sim/faults`, { wedged_rank: 1 })).status).toBe(200)
    const before = await (await fetch(`${url}/metrics`)).text()
    const hang = (body: Record<string, unknown>, headers: Record<string, string> = {}) => {
      const answer = ask(body, headers).then((r) => r.text)
      return { answer, early: Promise.race([answer, new Promise((r) => setTimeout(() => r("no answer"), 300))]) }
    }
    const hung = [
      hang({ routed_dp_rank: 1 }),
      hang({ data_parallel_rank: 1 }), // the deprecated name
      hang({ routed_dp_rank: 0 }, { "X-Data-Parallel-Rank": "1" }) // the header wins
    ]
    // replica 0 serves on, named or not
    expect((await ask({ routed_dp_rank: 0 })).status).toBe(200)
    expect((await ask({}, { "X-Data-Parallel-Rank": "0" })).status).toBe(200)
    for (const h of hung) expect(await h.early).toBe("no answer")
    // replica 1's series (dp_rank="1") are what its scheduler last published
    const rank1 = (page: string) => page.split("\n").filter((l) => l.startsWith("sglang:") && l.includes('dp_rank="1"'))
    expect(rank1(before).length).toBeGreaterThan(0)
    expect(rank1(await (await fetch(`${url}/metrics`)).text())).toEqual(rank1(before))

    expect((await postJson(`${url}/sim/faults`, { wedged_rank: null })).status).toBe(200)
    for (const h of hung) expect(await h.answer).toContain('"completion_tokens":2')
  })

  it("SGLang: /health generates (a second at the least), so a wedged scheduler answers nothing, then 503 after SGLANG_HEALTH_CHECK_TIMEOUT", async () => {
    sim = await startSim({ flavor: "sglang", args: ["--model-path", "m"], env: { SGLANG_HEALTH_CHECK_TIMEOUT: "2" } })
    const timed = async (path: string) => {
      const t0 = performance.now()
      const r = await fetch(`${sim?.url}${path}`)
      return { status: r.status, ms: performance.now() - t0 }
    }
    for (const path of ["/health", "/health_generate"]) {
      const ok = await timed(path)
      expect(ok.status).toBe(200)
      expect(ok.ms).toBeGreaterThanOrEqual(900)
    }
    expect((await postJson(`${sim.url}/sim/faults`, { wedged: true })).status).toBe(200)
    const wedged = await timed("/health")
    expect(wedged.status).toBe(503)
    expect(wedged.ms).toBeGreaterThanOrEqual(1_900)
    expect((await postJson(`${sim.url}/sim/faults`, { wedged: false })).status).toBe(200)
    expect((await timed("/health")).status).toBe(200)
  })

  it("SGLang with SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false: /health is a bare 200, /health_generate still generates", async () => {
    sim = await startSim({
      flavor: "sglang",
      args: ["--model-path", "m"],
      env: { SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION: "False", SGLANG_HEALTH_CHECK_TIMEOUT: "1" }
    })
    expect((await postJson(`${sim.url}/sim/faults`, { wedged: true })).status).toBe(200)
    expect((await fetch(`${sim.url}/health`)).status).toBe(200)
    expect((await fetch(`${sim.url}/health_generate`)).status).toBe(503)
  })
})

describe("POST /sim/faults wedged_rank (the merge, src/sim/faults.ts)", () => {
  it("takes any rank, 0 included, or null; refuses what is no rank", () => {
    const faults: Faults = {
      stallAfterTokens: undefined,
      errorRate: 0,
      errorKind: "http500",
      hangHealth: false,
      engineDead: false,
      wedged: false,
      wedgedRank: undefined
    }
    expect(applyFaults(faults, { wedged_rank: 0 })).toEqual({ crashNow: false })
    expect(faults.wedgedRank).toBe(0)
    expect(applyFaults(faults, { wedged_rank: 3 })).toEqual({ crashNow: false })
    expect(faults.wedgedRank).toBe(3)
    expect(applyFaults(faults, { wedged_rank: null })).toEqual({ crashNow: false })
    expect(faults.wedgedRank).toBeUndefined()
    for (const bad of [-1, 1.5, "1"]) {
      expect(applyFaults(faults, { wedged_rank: bad }).error).toBe("wedged_rank: a rank number or null")
      expect(faults.wedgedRank).toBeUndefined()
    }
  })
})
