// The llama_cpp flavor's decode-step metrics, /slots and /props, and the /v1/models meta, as llama-server has them
// (ggml-org/llama.cpp tools/server/server-context.cpp: metrics_post_decode, get_slots, get_res_props,
// get_res_model_info, server_slot::to_json; server-task.cpp server_task_result_metrics::to_metrics).
// test/real/sim-differential.test.ts checks the same against the real server where a check is cheap.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { parsePromText } from "../../src/services/engine/PromText.ts"
import { modelsBody } from "../../src/sim/chunks.ts"
import { cppDouble } from "../../src/sim/metricPages.ts"
import { type Gauges, renderMetrics } from "../../src/sim/metrics.ts"
import { Stats } from "../../src/sim/stats.ts"
import { getJson, pollUntil, postJson, type SimHandle, startSim } from "../support/sim.ts"
import { simGguf } from "../support/simModel.ts"

/** A request as Stats.decoded names it: its own test of whether it ended. */
const request = () => {
  let ended = false
  const gone = () => ended
  const end = () => {
    ended = true
  }
  return { gone, end }
}

describe("Stats.decoded: llama-server's batched decode steps (pure)", () => {
  it("a lone request: one decode per token, the first one its prompt's; n_tokens_max its prompt and all but the last token", () => {
    const s = new Stats()
    const a = request()
    for (let i = 0; i < 10; i++) s.decoded(a.gone, 3, 1)
    expect([s.decodes, s.busySlots, s.tokensMax]).toEqual([10, 10, 12])
  })

  it("two requests running together: one decode for both slots' tokens, the last one's too though the other ended first", () => {
    const s = new Stats()
    const [a, b] = [request(), request()]
    for (let i = 0; i < 10; i++) {
      s.decoded(a.gone, 3, 1)
      if (i === 9) a.end()
      s.decoded(b.gone, 3, 1)
    }
    b.end()
    expect([s.decodes, s.busySlots / s.decodes]).toEqual([10, 2])
  })

  it("a request that comes while another runs joins its steps; one after the server was idle opens its own", () => {
    const s = new Stats()
    const [a, b] = [request(), request()]
    for (let i = 0; i < 4; i++) s.decoded(a.gone, 3, 1)
    for (let i = 0; i < 3; i++) {
      s.decoded(b.gone, 3, 1)
      s.decoded(a.gone, 3, 1)
    }
    a.end()
    s.decoded(b.gone, 3, 1)
    b.end()
    // a: 7 steps; b's 4 tokens in a's 4th to 7th
    expect(s.decodes).toBe(7)
    const c = request()
    s.decoded(c.gone, 3, 1)
    expect(s.decodes).toBe(8)
  })

  it("`n` sequences in turn: one decode for a token of each; one that ends first leaves its place", () => {
    const s = new Stats()
    const a = request()
    // sequence 1 makes 3 tokens, sequence 0 five (sequences.ts: one token each in turn, an end right after its last)
    for (let i = 0; i < 3; i++) {
      s.decoded(a.gone, 4, 2)
      s.decoded(a.gone, 4, 2)
    }
    // sequence 1 ended
    s.decoded(a.gone, 4, 1)
    s.decoded(a.gone, 4, 1)
    expect([s.decodes, s.busySlots, s.tokensMax]).toEqual([5, 8, 8])
    // the other way round: sequence 0 ends first, the same round's token of sequence 1 still in its step
    const t = new Stats()
    const b = request()
    for (let i = 0; i < 10; i++) {
      t.decoded(b.gone, 4, 2)
      t.decoded(b.gone, 4, i === 9 ? 1 : 2)
    }
    expect([t.decodes, t.tokensMax]).toEqual([10, 13])
  })

  it("n_tokens_max keeps the largest sequence seen", () => {
    const s = new Stats()
    const a = request()
    for (let i = 0; i < 20; i++) s.decoded(a.gone, 5, 1)
    a.end()
    const b = request()
    s.decoded(b.gone, 2, 1)
    expect(s.tokensMax).toBe(24)
  })
})

const GAUGES: Gauges = { running: 0, waiting: 0, kvUsage: 0, usedTokens: 0, maxTotalTokens: 4096, maxSeqs: 2 }
const page = (stats: Stats, gauges: Gauges = GAUGES) =>
  renderMetrics("llama_cpp", { model: "tiny", disaggregationMode: undefined }, [{ stats, gauges }]) ?? ""
const value = (text: string, name: string) => parsePromText(text).find((x) => x.name === name)?.value

describe("the llamacpp: page's decode families (pure)", () => {
  it("n_decode_total, n_tokens_max and n_busy_slots_per_decode come from the decode steps, with llama-server's HELP", () => {
    const s = new Stats()
    const [a, b] = [request(), request()]
    for (let i = 0; i < 4; i++) {
      s.decoded(a.gone, 3, 1)
      s.decoded(b.gone, 3, 1)
    }
    s.generationTokens = 8
    // the requests ended: nothing running, no KV in use; the counters and the average stay
    const text = page(s)
    expect(value(text, "llamacpp:n_decode_total")).toBe(4)
    expect(value(text, "llamacpp:n_tokens_max")).toBe(6)
    expect(value(text, "llamacpp:n_busy_slots_per_decode")).toBe(2)
    expect(text).toContain(
      "# HELP llamacpp:n_decode_total Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding\n"
    )
    expect(text).toContain("# HELP llamacpp:n_tokens_max Largest observed sequence length (prompt + generation)\n")
    // nothing decoded yet: 0, not a division by 0
    expect(
      value(page(new Stats(), { ...GAUGES, running: 2, usedTokens: 64 }), "llamacpp:n_busy_slots_per_decode")
    ).toBe(0)
    expect(value(page(new Stats(), { ...GAUGES, running: 2, usedTokens: 64 }), "llamacpp:n_tokens_max")).toBe(0)
  })
})

describe("/v1/models meta (pure)", () => {
  it("n_ctx is a slot's context, n_ctx_train the whole; vocab_type a boolean, as the bundled llama-server writes it", () => {
    const body = modelsBody("llama_cpp", "tiny", "tiny.gguf", 1024, 0, 512) as { data: Array<{ meta: unknown }> }
    expect(body.data[0]?.meta).toMatchObject({ vocab_type: true, n_ctx: 512, n_ctx_train: 1024 })
    const one = modelsBody("llama_cpp", "tiny", "tiny.gguf", 1024, 0) as { data: Array<{ meta: unknown }> }
    expect(one.data[0]?.meta).toMatchObject({ n_ctx: 1024 })
  })
})

const LLAMA_ARGS = ["-m", simGguf("tiny.gguf"), "-a", "tiny", "-c", "1024", "-np", "2", "--metrics"]

describe("/slots and /props over HTTP", () => {
  let sim: SimHandle
  beforeAll(async () => {
    sim = await startSim({ flavor: "llama_cpp", args: [...LLAMA_ARGS, "--sim-mode", "random", "--sim-itl", "10ms"] })
  }, 30_000)
  afterAll(async () => {
    await sim?.stop()
  })

  it("report a slot's context (-c over -np) in llama-server's key order", async () => {
    const props = (await getJson(`${sim.url}/props`)).json as Record<string, unknown>
    // the whole key list is checked against the real server (test/real/sim-differential*.test.ts)
    expect(Object.keys(props).slice(0, 2)).toEqual(["default_generation_settings", "total_slots"])
    expect(props).toMatchObject({ default_generation_settings: { n_ctx: 512 }, total_slots: 2 })
    expect((await getJson(`${sim.url}/slots`)).text).toBe(
      '[{"id":0,"n_ctx":512,"speculative":false,"is_processing":false},' +
        '{"id":1,"n_ctx":512,"speculative":false,"is_processing":false}]'
    )
  })

  it("?fail_on_no_slot (any non-empty value) answers 503 while every slot is busy, 200 with one idle", async () => {
    const q = (v: string) => getJson(`${sim.url}/slots?fail_on_no_slot=${v}`)
    expect((await q("1")).status).toBe(200)
    const ac = new AbortController()
    const streams = [0, 1].map(() =>
      fetch(`${sim.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ prompt: "the quick", max_tokens: 5000, ignore_eos: true, stream: true }),
        signal: ac.signal
      }).catch(() => undefined)
    )
    try {
      await pollUntil(async () => {
        const slots = (await getJson(`${sim.url}/slots`)).json as Array<{ is_processing: boolean }>
        return slots.every((x) => x.is_processing) || undefined
      })
      for (const v of ["1", "0", "true"]) {
        const r = await q(v)
        expect([v, r.status, r.text]).toEqual([
          v,
          503,
          '{"error":{"code":503,"message":"no slot available","type":"unavailable_error"}}'
        ])
      }
      // no value, or no such parameter: the list
      expect((await q("")).status).toBe(200)
      expect((await getJson(`${sim.url}/slots`)).status).toBe(200)
    } finally {
      ac.abort()
      await Promise.all(streams)
    }
    await pollUntil(async () => ((await q("1")).status === 200 ? true : undefined))
  })
})

/** The llamacpp: series of a /metrics page by their short names. */
const metrics = async (url: string) => {
  const text = await (await fetch(`${url}/metrics`)).text()
  const v = (n: string) => value(text, `llamacpp:${n}`) ?? Number.NaN
  return { decodes: v("n_decode_total"), max: v("n_tokens_max"), busy: v("n_busy_slots_per_decode") }
}

// Through generate.ts, which tells Stats.decoded of each token it makes.
describe("decode metrics over HTTP", () => {
  let sim: SimHandle
  beforeAll(async () => {
    sim = await startSim({ flavor: "llama_cpp", args: [...LLAMA_ARGS, "--sim-mode", "random", "--sim-itl", "1ms"] })
  }, 30_000)
  afterAll(async () => {
    await sim?.stop()
  })

  it("as the real llama-server counts them (measured): a lone request, `n` 2, then idle", async () => {
    const complete = (body: Record<string, unknown>) =>
      postJson(`${sim.url}/v1/completions`, { max_tokens: 10, ignore_eos: true, ...body })
    // "the quick": 3 tokens with the BOS; 10 decodes, the longest sequence 3 + 9
    expect((await complete({ prompt: "the quick" })).status).toBe(200)
    expect(await metrics(sim.url)).toEqual({ decodes: 10, max: 12, busy: 1 })
    // two sequences of 10 in two slots: 10 more decodes of two busy slots each; 4 + 9
    expect((await complete({ prompt: "the quick brown", n: 2 })).status).toBe(200)
    expect(await metrics(sim.url)).toEqual({ decodes: 20, max: 13, busy: 1.5 })
    // a shorter request: the largest sequence stays; idle, the average stays
    expect((await complete({ prompt: "a", max_tokens: 2 })).status).toBe(200)
    await new Promise((r) => setTimeout(r, 50))
    const after = await metrics(sim.url)
    // written as llama-server writes a double: six significant digits
    expect(after).toEqual({ decodes: 22, max: 13, busy: 1.45455 })
  })
})

describe("cppDouble", () => {
  it("writes a double as a C++ ostream does by default (what g++'s std::cout printed for each)", () => {
    const values = [0, 1, 12, 0.5, 1.5, 1234567, 123456, 0.0001, 0.00001, 32 / 22, 2.5e-7, 999999.5, -3]
    expect(values.map(cppDouble)).toEqual([
      ...["0", "1", "12", "0.5", "1.5", "1.23457e+06", "123456", "0.0001", "1e-05", "1.45455", "2.5e-07", "1e+06"],
      "-3"
    ])
  })
})
