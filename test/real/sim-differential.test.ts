// Differential check of the simulator: the same requests to `cgn-engine-sim --flavor llama_cpp` and to the
// real llama-server (built by `npm run real-engine:build`, the tiny model of test/support/ggufModel.ts),
// comparing what the agent and any OpenAI client rely on: status codes, content types, body and error shapes
// (key order included where llama-server's is fixed) and error texts, SSE framing (event fields, the [DONE]
// end, the usage chunk, `timings`), sampling fields and their limits, stop strings, `n`, routes, keep-alive,
// a client that goes away, health and metric names. Where they differ the simulator is wrong. What cannot
// match: the generated text (the tiny model's words against the simulator's), and with it the number of tokens
// before a stop string hits and chunk boundaries; the token count of a word the tiny model's tokenizer cuts in
// pieces (the simulator's words are a token each: a chat's template it counts as the real one does, the prompts here
// are of whole-token words); `timings` values and `cached_tokens` (the simulator takes no time and caches nothing);
// nlohmann's wording of a JSON syntax error other than an empty body.
import * as http from "node:http"
import * as net from "node:net"
import { Agent as UndiciAgent, type RequestInit as UndiciInit, fetch as undiciFetch } from "undici"
import { beforeAll, describe, expect, it } from "vitest"
import { parsePromText } from "../../src/services/engine/PromText.ts"
import { pollUntil } from "../support/poll.ts"
import { engineMetric } from "./engine.ts"
import { orderedShape, pairs } from "./simPair.ts"

const diff = pairs("cgn-real-diff-")
let real: string
let sim: string

beforeAll(async () => {
  // Random words up to max_tokens, as the tiny model does (echo would stop at the prompt's length); a token a
  // millisecond, so that a client can leave mid-stream (the real one makes about one a millisecond too).
  const p = await diff.pair({ args: ["--metrics"], knobs: ["--sim-mode", "random", "--sim-itl", "1ms"] })
  ;[real, sim] = p.bases
}, 30 * 60_000)

interface Answer {
  readonly status: number
  /** The media type alone. */
  readonly contentType: string
  readonly headers: Headers
  readonly text: string
}

/**
 * One request on a connection of its own: llama-server closes a streamed answer's connection after its last chunk
 * though its headers say keep-alive, and a request fetch's pool sent on it next failed "other side closed" (seen in
 * a full run; the agent asks for no keep-alive on such streams for the same reason).
 */
const ask = async (base: string, p: string, body?: unknown, rawBody?: string, init?: RequestInit): Promise<Answer> => {
  const payload = rawBody ?? (body === undefined ? undefined : JSON.stringify(body))
  const dispatcher = new UndiciAgent()
  try {
    const res = await undiciFetch(`${base}${p}`, {
      ...((init ??
        (payload === undefined
          ? {}
          : { method: "POST", headers: { "content-type": "application/json" }, body: payload })) as UndiciInit),
      dispatcher
    })
    return {
      status: res.status,
      contentType: (res.headers.get("content-type") ?? "").split(";")[0]!,
      headers: res.headers as unknown as Headers,
      text: await res.text()
    }
  } finally {
    await dispatcher.close()
  }
}

/** Both servers' answers to one request. */
const both = async (p: string, body?: unknown, rawBody?: string, init?: RequestInit) => {
  const [r, s] = await Promise.all([ask(real, p, body, rawBody, init), ask(sim, p, body, rawBody, init)])
  return { real: r, sim: s }
}

/** A JSON value's shape: keys (sorted) and value types, recursively; arrays by their first element. */
const shape = (v: unknown): unknown => {
  if (Array.isArray(v)) return v.length === 0 ? [] : [shape(v[0])]
  if (v === null) return "null"
  if (typeof v === "object") {
    return Object.fromEntries(
      Object.keys(v as object)
        .sort()
        .map((k) => [k, shape((v as Record<string, unknown>)[k])])
    )
  }
  return typeof v
}

/** The SSE events of a stream: each event's field names, and its data parsed (or the literal). */
const events = (text: string) =>
  text
    .split("\n\n")
    .filter((e) => e.trim() !== "")
    .map((e) => {
      const fields = e.split("\n").map((l) => l.slice(0, l.indexOf(":")))
      const data = e
        .split("\n")
        .filter((l) => l.startsWith("data: ") || l.startsWith("error: "))
        .map((l) => l.slice(l.indexOf(": ") + 2))
        .join("\n")
      let json: unknown = data
      try {
        json = JSON.parse(data)
      } catch {
        // [DONE]
      }
      return { fields, json }
    })

const AGENT_BODY = { stream: true, stream_options: { include_usage: true } }

describe("the llama_cpp simulator against the real llama-server", () => {
  it("/health when loaded: same status and body", async () => {
    const r = await both("/health")
    expect(r.sim.status).toBe(r.real.status)
    expect(JSON.parse(r.sim.text)).toEqual(JSON.parse(r.real.text))
  })

  it("/v1/models: same status, the served name as data[0].id, the same top-level shape", async () => {
    const r = await both("/v1/models")
    expect(r.sim.status).toBe(r.real.status)
    const [real1, sim1] = [JSON.parse(r.real.text), JSON.parse(r.sim.text)]
    expect(sim1.data[0].id).toBe(real1.data[0].id)
    expect(Object.keys(sim1).sort()).toEqual(Object.keys(real1).sort())
    expect(Object.keys(sim1.data[0]).sort()).toEqual(Object.keys(real1.data[0]).sort())
  })

  for (const endpoint of ["/v1/completions", "/v1/chat/completions"] as const) {
    it(`${endpoint} streamed as the agent asks: same SSE framing, chunk shapes, finish and usage`, async () => {
      const input =
        endpoint === "/v1/completions"
          ? { prompt: "the quick brown fox" }
          : { messages: [{ role: "user", content: "hi there" }] }
      const r = await both(endpoint, { model: "tiny", ...input, max_tokens: 5, ...AGENT_BODY })
      expect(r.sim.status).toBe(r.real.status)
      expect(r.sim.contentType).toBe(r.real.contentType)
      const [re, se] = [events(r.real.text), events(r.sim.text)]
      const fields = (es: typeof re) => [...new Set(es.map((e) => e.fields.join(",")))]
      expect(fields(se)).toEqual(fields(re))
      expect(se.at(-1)?.json).toBe("[DONE]")
      expect(re.at(-1)?.json).toBe("[DONE]")
      const chunks = (es: typeof re) => es.slice(0, -1).map((e) => e.json as Record<string, unknown>)
      const [rc, sc] = [chunks(re), chunks(se)]
      // The first chunk, the last, and every kind of chunk between have the same shape.
      expect(shape(sc[0])).toEqual(shape(rc[0]))
      expect(shape(sc.at(-1))).toEqual(shape(rc.at(-1)))
      const middle = (cs: typeof rc) => [...new Set(cs.slice(1, -1).map((c) => JSON.stringify(shape(c))))].sort()
      expect(middle(sc)).toEqual(middle(rc))
      const finish = (cs: typeof rc) =>
        cs
          .flatMap((c) => (c.choices as Array<{ finish_reason: unknown }>).map((x) => x.finish_reason))
          .filter((x) => x !== null)
      expect(finish(sc)).toEqual(finish(rc))
      const usage = (cs: typeof rc) =>
        cs.find((c) => c.usage !== undefined && c.usage !== null)?.usage as Record<string, number>
      expect(usage(sc)?.completion_tokens).toBe(usage(rc)?.completion_tokens)
    })
  }

  it("a prompt longer than a slot's context: same status, error shape and type", async () => {
    const long = Array.from({ length: 700 }, () => "hello").join(" ")
    const r = await both("/v1/completions", { model: "tiny", prompt: long, max_tokens: 4, ...AGENT_BODY })
    expect(r.sim.status).toBe(r.real.status)
    const [real1, sim1] = [JSON.parse(r.real.text), JSON.parse(r.sim.text)]
    expect(shape(sim1)).toEqual(shape(real1))
    expect(sim1.error.type).toBe(real1.error.type)
    expect(sim1.error.code).toBe(real1.error.code)
    expect(sim1.error.message).toMatch(/exceeds the available context size/)
  })

  it("malformed requests: same status and error shape", async () => {
    const cases: Array<[string, unknown, string | undefined]> = [
      ["/v1/completions", undefined, "{not json"],
      ["/v1/chat/completions", { model: "tiny", stream: true }, undefined],
      ["/v1/completions", { model: "tiny", stream: true }, undefined],
      ["/v1/nothing-here", undefined, undefined]
    ]
    for (const [p, body, raw] of cases) {
      const r = await both(p, body, raw)
      expect([p, r.sim.status]).toEqual([p, r.real.status])
      expect([p, shape(JSON.parse(r.sim.text))]).toEqual([p, shape(JSON.parse(r.real.text))])
    }
  })

  it("/metrics: the same llamacpp: series names", async () => {
    const names = async (base: string) =>
      [...new Set(parsePromText(await (await fetch(`${base}/metrics`)).text()).map((x) => x.name))].sort()
    expect(await names(sim)).toEqual(await names(real))
  })

  it("/metrics: the same page line for line, values aside, each value written as llama-server writes a double", async () => {
    const page = async (base: string) => (await (await fetch(`${base}/metrics`)).text()).split("\n")
    const masked = (lines: ReadonlyArray<string>) =>
      lines.map((l) => (l.startsWith("#") ? l : l.replace(/ \S+$/, " V")))
    const [simPage, realPage] = [await page(sim), await page(real)]
    expect(masked(simPage)).toEqual(masked(realPage))
    // C++'s ostream default (tools/server handle_metrics writes a double): `0`, `3`, `1.5`, `1.23457e+06`, never `3.0`
    for (const [base, lines] of [
      [sim, simPage],
      [real, realPage]
    ] as const) {
      const values = lines.filter((l) => l !== "" && !l.startsWith("#")).map((l) => l.slice(l.lastIndexOf(" ") + 1))
      expect([base, values.filter((v) => !/^-?\d+(\.\d*[1-9])?(e[+-]\d{2})?$/.test(v))]).toEqual([base, []])
    }
  })

  it("/metrics: the token counters move when the real ones do (the agent's stall rule reads them as progress)", async () => {
    const counters = async (base: string) => {
      const samples = parsePromText(await (await fetch(`${base}/metrics`)).text())
      const v = (n: string) => samples.find((s) => s.name === n)?.value ?? Number.NaN
      return {
        prompt: v("llamacpp:prompt_tokens_total"),
        predicted: v("llamacpp:tokens_predicted_total"),
        decodes: v("llamacpp:n_decode_total")
      }
    }
    for (const base of [real, sim]) {
      const before = await counters(base)
      const res = await fetch(`${base}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ prompt: "the quick", max_tokens: 500, stream: true })
      })
      const reader = res.body!.getReader()
      let text = ""
      while ((text.match(/^data: /gm)?.length ?? 0) < 10) text += new TextDecoder().decode((await reader.read()).value)
      // mid-generation: the prompt and each decode counted, the predicted tokens not before the request ends
      // (tools/server/server-context.cpp server_metrics: on_prompt_eval, on_decoded, on_prediction)
      const during = await counters(base)
      expect(during.prompt - before.prompt, base).toBeGreaterThan(0)
      expect(during.decodes - before.decodes, base).toBeGreaterThan(0)
      expect(during.predicted - before.predicted, base).toBe(0)
      while (!(await reader.read()).done);
      const after = await pollUntil(`${base}: the predicted tokens counted`, async () => {
        const c = await counters(base)
        return c.predicted > before.predicted ? c : undefined
      })
      expect(after.predicted - before.predicted, base).toBe(500)
    }
  })

  it("/metrics: one n_decode per batched llama_decode(), n_tokens_max kept, n_busy_slots_per_decode an average", async () => {
    const page = async (base: string) => (await fetch(`${base}/metrics`)).text()
    const families = ["n_decode_total", "n_tokens_max", "n_busy_slots_per_decode"].map((f) => `llamacpp:${f}`)
    const heads = (text: string) =>
      text.split("\n").filter((l) => families.some((f) => l.startsWith(`# `) && l.includes(`${f} `)))
    const [realPage, simPage] = [await page(real), await page(sim)]
    expect(heads(simPage)).toEqual(heads(realPage))
    for (const base of [real, sim]) {
      const v = async (n: string) => engineMetric(base, `llamacpp:${n}`)
      // two sequences of 10 tokens, one in each slot: both decoded in one batch (real: 10, 11 when one starts late)
      const before = await v("n_decode_total")
      const r = await fetch(`${base}${C}`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ prompt: "the quick brown", max_tokens: 10, ignore_eos: true, n: 2 })
      })
      expect(r.status, base).toBe(200)
      await r.text()
      const decodes = (await v("n_decode_total")) - before
      expect(decodes, base).toBeGreaterThanOrEqual(10)
      expect(decodes, base).toBeLessThanOrEqual(12)
      // 4 tokens with the BOS and 9 decoded: the longest sequence seen is at least 13, and stays once idle
      const max = await v("n_tokens_max")
      expect(max, base).toBeGreaterThanOrEqual(13)
      // the average since the start, over decodes of one or two busy slots; the same while idle
      const busy = await v("n_busy_slots_per_decode")
      expect(busy, base).toBeGreaterThan(1)
      expect(busy, base).toBeLessThanOrEqual(2)
      // Read again, no request between: the same (a read resets neither, as llama-server resets its bucketed ones on
      // each /metrics). Nothing else could move them while idle, so a wait before the read would add nothing; a
      // /metrics is a task of the server loop, queued after whatever the finished request left.
      expect([await v("n_tokens_max"), await v("n_busy_slots_per_decode")], base).toEqual([max, busy])
    }
  })

  it("/props, /slots and /v1/models meta: a slot's context (-c over -np), in the same key order", async () => {
    const get = async <A>(base: string, p: string) => (await (await fetch(`${base}${p}`)).json()) as A
    type Props = { default_generation_settings: { n_ctx: number }; total_slots: number }
    const [rp, sp] = [await get<Props>(real, "/props"), await get<Props>(sim, "/props")]
    expect(Object.keys(sp)).toEqual(Object.keys(rp))
    expect(sp.default_generation_settings.n_ctx).toBe(512)
    expect(rp.default_generation_settings.n_ctx).toBe(512)
    expect(sp.total_slots).toBe(rp.total_slots)
    // a slot's leading keys and values (the real one adds its last task's after them); which is busy may differ
    type Slots = Array<Record<string, unknown>>
    const head = (slots: Slots) =>
      slots.map((x) =>
        Object.entries(x)
          .slice(0, 4)
          .map(([k, v]) => (k === "is_processing" ? k : [k, v]))
      )
    expect(head(await get<Slots>(sim, "/slots"))).toEqual(head(await get<Slots>(real, "/slots")))
    type Models = { data: Array<{ meta: Record<string, unknown> }> }
    const meta = async (base: string) => (await get<Models>(base, "/v1/models")).data[0]?.meta
    const [rm, sm] = [await meta(real), await meta(sim)]
    expect(typeof sm?.vocab_type).toBe(typeof rm?.vocab_type)
  })

  it("/slots?fail_on_no_slot: 503 with the same body while every slot is busy, the list once one is idle", async () => {
    for (const base of [real, sim]) {
      const q = async (v: string) => {
        const res = await fetch(`${base}/slots?fail_on_no_slot=${v}`)
        const text = await res.text()
        return [res.status, Array.isArray(JSON.parse(text)) ? "list" : text]
      }
      expect(await q("1"), base).toEqual([200, "list"])
      const ac = new AbortController()
      const streams = [0, 1].map(() =>
        fetch(`${base}${C}`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ prompt: "the quick", max_tokens: -1, ignore_eos: true, stream: true }),
          signal: ac.signal
        })
          .then((res) => res.body?.getReader().read())
          .catch(() => undefined)
      )
      try {
        await pollUntil(`${base}: both slots busy`, async () => {
          const slots = (await (await fetch(`${base}/slots`)).json()) as Array<{ is_processing: boolean }>
          return slots.every((x) => x.is_processing) || undefined
        })
        const full = '{"error":{"code":503,"message":"no slot available","type":"unavailable_error"}}'
        expect([await q("1"), await q("0"), await q("")], base).toEqual([
          [503, full],
          [503, full],
          [200, "list"]
        ])
      } finally {
        ac.abort()
        await Promise.all(streams)
      }
      await pollUntil(`${base}: a slot idle again`, async () => ((await q("1"))[0] === 200 ? true : undefined))
    }
  })
})

type Chunk = Record<string, unknown>
type Choice = Record<string, unknown>

const C = "/v1/completions"
const H = "/v1/chat/completions"
const input = (endpoint: string) =>
  endpoint === C ? { prompt: "the quick" } : { messages: [{ role: "user", content: "hi there" }] }
/** 500 words: 501 tokens with the BOS, leaving 11 of a slot's 512 (-c 1024 over -np 2). */
const LONG = Array.from({ length: 500 }, () => "hello").join(" ")

const chunksOf = (a: Answer): Array<Chunk> => events(a.text).map((e) => e.json as Chunk)
const choices = (c: Chunk): Array<Choice> => (c.choices ?? []) as Array<Choice>
const json = (a: Answer) => JSON.parse(a.text) as Record<string, unknown> & { choices: Array<Choice>; usage: Usage }
interface Usage {
  readonly completion_tokens: number
  readonly prompt_tokens: number
}
/** A stream's text, per choice index (completions' `text`, chat's `delta.content`). */
const streamText = (cs: ReadonlyArray<Chunk>): Map<number, string> => {
  const out = new Map<number, string>()
  for (const ch of cs.flatMap(choices)) {
    const piece = (ch.text ?? (ch.delta as { content?: string } | undefined)?.content ?? "") as string
    out.set(ch.index as number, (out.get(ch.index as number) ?? "") + piece)
  }
  return out
}

describe("llama-server's OpenAI API as clients meet it: the simulator against the real server", () => {
  for (const endpoint of [C, H]) {
    it(`${endpoint} not streamed: the whole body key for key, in llama-server's order; id, object, model, usage`, async () => {
      const r = await both(endpoint, { model: "tiny", ...input(endpoint), max_tokens: 3 })
      expect([r.sim.status, r.real.status]).toEqual([200, 200])
      expect(r.sim.headers.get("content-type")).toBe(r.real.headers.get("content-type"))
      const [rj, sj] = [json(r.real), json(r.sim)]
      expect(orderedShape(sj)).toEqual(orderedShape(rj))
      for (const j of [rj, sj]) expect(j.id).toMatch(/^chatcmpl-[A-Za-z0-9]{32}$/)
      for (const k of ["object", "model", "system_fingerprint"] as const) expect(typeof sj[k]).toBe(typeof rj[k])
      expect([sj.object, sj.model]).toEqual([rj.object, rj.model])
      expect(sj.choices[0]?.finish_reason).toBe(rj.choices[0]?.finish_reason)
      expect(sj.usage.completion_tokens).toBe(rj.usage.completion_tokens)
      // "the quick" is 2 tokens and the BOS for both; a chat's is its template's rendering: 30 for "hi there"
      expect(sj.usage.prompt_tokens).toBe(rj.usage.prompt_tokens)
    })

    for (const includeUsage of [false, true]) {
      it(`${endpoint} streamed ${includeUsage ? "with" : "without"} stream_options.include_usage: the same chunk sequence`, async () => {
        const so = includeUsage ? { stream_options: { include_usage: true } } : {}
        const r = await both(endpoint, { model: "tiny", ...input(endpoint), max_tokens: 3, stream: true, ...so })
        expect(r.sim.headers.get("content-type")).toBe(r.real.headers.get("content-type"))
        expect(r.real.headers.get("content-type")).toBe("text/event-stream")
        // Each chunk's shape (keys in order), one after the other: where the usage and `timings` come, and
        // (completions) that the usage comes asked for or not.
        const kinds = (a: Answer) => chunksOf(a).map((c) => JSON.stringify(orderedShape(c)))
        expect(kinds(r.sim)).toEqual(kinds(r.real))
        const usage = (a: Answer) => chunksOf(a).filter((c) => c.usage !== undefined).length
        expect(usage(r.real)).toBe(endpoint === C || includeUsage ? 1 : 0)
      })
    }
  }

  it("max_tokens: 0 makes one token, 1.5 and true read as 1, -1 or none run to the end of the slot's context; n_predict wins", async () => {
    const cases: Array<Record<string, unknown>> = [
      { prompt: "the quick", max_tokens: 0 },
      { prompt: "the quick", max_tokens: 1.5 },
      { prompt: "the quick", max_tokens: true },
      { prompt: LONG, max_tokens: -1 },
      { prompt: LONG },
      { prompt: LONG, max_tokens: 100 },
      { prompt: "the quick", n_predict: 2, max_tokens: 5 },
      { prompt: "the quick", max_completion_tokens: 2, max_tokens: 5 }
    ]
    for (const body of cases) {
      const r = await both(C, { model: "tiny", ...body })
      const [rj, sj] = [json(r.real), json(r.sim)]
      const got = (j: typeof rj) => [j.choices[0]?.finish_reason, j.usage.completion_tokens, j.usage.prompt_tokens]
      expect([{ ...body, prompt: "" }, got(sj)]).toEqual([{ ...body, prompt: "" }, got(rj)])
    }
  })

  it("n: a choice per completion, indexed, each with its own end in a stream; several prompts times n", async () => {
    for (const endpoint of [C, H]) {
      const whole = await both(endpoint, { ...input(endpoint), max_tokens: 2, n: 2 })
      const idx = (a: Answer) => json(a).choices.map((c) => c.index)
      expect(idx(whole.sim)).toEqual(idx(whole.real))
      expect(orderedShape(json(whole.sim))).toEqual(orderedShape(json(whole.real)))
      const body = { ...input(endpoint), max_tokens: 2, n: 2, stream: true, stream_options: { include_usage: true } }
      const streamed = await both(endpoint, body)
      // Per index: its chunk kinds in order (how the choices interleave is the servers' scheduling).
      const perIndex = (a: Answer) => {
        const cs = chunksOf(a).slice(0, -1)
        const byIndex = (i: number) =>
          cs.filter((c) => choices(c)[0]?.index === i).map((c) => JSON.stringify(orderedShape(c)))
        return [byIndex(0), byIndex(1), cs.filter((c) => choices(c).length === 0).length]
      }
      expect(perIndex(streamed.sim)).toEqual(perIndex(streamed.real))
    }
    const multi = await both(C, { prompt: ["the quick", "brown fox"], max_tokens: 2, n: 2 })
    expect(json(multi.sim).choices.map((c) => c.index)).toEqual(json(multi.real).choices.map((c) => c.index))
    expect(json(multi.real).choices).toHaveLength(4)
  })

  it("the sampling fields the agent sends, at their edges: taken alike (llama-server clamps numbers, never refuses one)", async () => {
    const edges: Array<Record<string, unknown>> = [
      { temperature: 0, top_p: 1, top_k: -1, presence_penalty: -2, frequency_penalty: 2, repetition_penalty: 1e-6 },
      { temperature: 2, top_p: 1e-7, top_k: 1, presence_penalty: 2, frequency_penalty: -2, repetition_penalty: 1e6 },
      { temperature: -1, top_p: 0, top_k: 0, seed: 0 },
      { seed: 4294967295, stop: ["zzzz"] }
    ]
    for (const e of edges) {
      const r = await both(C, { model: "tiny", prompt: "the quick", max_tokens: 2, ...e })
      expect([e, r.sim.status]).toEqual([e, r.real.status])
      expect([e, orderedShape(json(r.sim))]).toEqual([e, orderedShape(json(r.real))])
    }
    // The agent writes a uint64 seed digit for digit; llama-server reads it as a uint32 and takes it.
    const raw = '{"model":"tiny","prompt":"the quick","max_tokens":2,"seed":18446744073709551615}'
    const big = await both(C, undefined, raw)
    expect([big.sim.status, big.real.status]).toEqual([200, 200])
  })

  for (const endpoint of [C, H]) {
    for (const stream of [false, true]) {
      it(`stop strings on ${endpoint}${stream ? ", streamed" : ""}: finish "stop", the text ends before the stop, timings on the stopped chunk`, async () => {
        // " " ends the real model's first token (every one starts with a space) and the simulator's second;
        // the vowels hit within a token or two on both.
        for (const stop of [" ", ["a", "e", "i", "o", "u"]]) {
          const so = stream ? { stream: true, stream_options: { include_usage: true } } : {}
          const r = await both(endpoint, { ...input(endpoint), max_tokens: 40, stop, ...so })
          const stops = typeof stop === "string" ? [stop] : stop
          for (const a of [r.real, r.sim]) {
            expect(a.status).toBe(200)
            if (!stream) {
              const c = json(a).choices[0] as Choice
              expect(c.finish_reason).toBe("stop")
              const text = (endpoint === C ? c.text : (c.message as { content: string }).content) as string
              for (const w of stops) expect(text).not.toContain(w)
              continue
            }
            const cs = chunksOf(a).slice(0, -1)
            const finishAt = cs.findIndex((c) => choices(c)[0]?.finish_reason !== null && choices(c).length > 0)
            expect(choices(cs[finishAt] as Chunk)[0]?.finish_reason).toBe("stop")
            // The chunk of the token that stopped (the last before the finish) carries the timings, as does the
            // last one. A chat stream sends no chunk for a token whose text the stop cut to nothing (no diff),
            // unless it opens the choice: which token stops there is the model's text.
            if (endpoint === C) expect(cs[finishAt - 1]?.timings).toBeDefined()
            expect(cs.at(-1)?.timings).toBeDefined()
            for (const w of stops) expect(streamText(cs).get(0)).not.toContain(w)
          }
          if (stream) {
            const tail = (a: Answer) =>
              chunksOf(a)
                .slice(-3)
                .map((c) => JSON.stringify(orderedShape(c)))
            expect(tail(r.sim)).toEqual(tail(r.real))
          } else expect(orderedShape(json(r.sim))).toEqual(orderedShape(json(r.real)))
        }
      })
    }
  }

  it("a chat ending with the assistant's message is continued: its text leads the answer, uncounted, never a stop", async () => {
    const messages = [
      { role: "user", content: "a" },
      { role: "assistant", content: "Sure qzxv" }
    ]
    // "qzxv" is in the prefill only (neither model makes it in two tokens): no stop there.
    const whole = await both(H, { messages, max_tokens: 2, stop: ["qzxv"] })
    const streamed = await both(H, { messages, max_tokens: 2, stop: ["qzxv"], ...AGENT_BODY })
    for (const a of [whole.real, whole.sim]) {
      const c = json(a).choices[0] as Choice
      expect((c.message as { content: string }).content).toMatch(/^Sure qzxv/)
      expect(c.finish_reason).toBe("length")
      expect(json(a).usage).toMatchObject({ completion_tokens: 2 })
    }
    for (const a of [streamed.real, streamed.sim]) {
      const cs = chunksOf(a).slice(0, -1)
      expect(streamText(cs).get(0)).toMatch(/^Sure qzxv/)
      // The prefill goes out with the first token, in one delta (whose own text a partial stop match may hold back).
      const first = cs.map((c) => choices(c)[0]?.delta as { content?: string } | undefined).find((d) => d?.content)
      expect(first?.content).toMatch(/^Sure qzxv/)
    }
  })

  it("refusals: the same status, error body word for word, content type, and the connection closed after it", async () => {
    const cases: Array<[string, string]> = [
      [C, ""],
      [H, ""],
      [C, "[1,2]"],
      [C, "null"],
      [H, '"x"'],
      [C, "{}"],
      [C, '{"prompt":5}'],
      [C, '{"prompt":[]}'],
      [H, "{}"],
      [H, '{"messages":"hi"}'],
      [H, '{"messages":[{"role":"user"}]}'],
      [H, '{"messages":[{"content":"hi"}]}'],
      [H, '{"messages":[{"role":5,"content":"hi"}]}'],
      [H, '{"messages":[{"role":"user","content":5}]}'],
      [H, '{"messages":[{"role":"user","content":[{"type":"text"}]}]}'],
      [
        H,
        '{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AA"}}]}]}'
      ],
      [
        H,
        '{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"assistant","content":"c"}]}'
      ],
      [C, '{"prompt":"a","stream":"yes"}'],
      [C, '{"prompt":"a","max_tokens":"3"}'],
      [C, '{"prompt":"a","max_tokens":-5}'],
      [C, '{"prompt":"a","n":3}'],
      [H, '{"messages":[{"role":"user","content":"a"}],"n":0}'],
      [C, '{"prompt":"a","temperature":{}}'],
      [C, '{"prompt":"a","top_k":"5"}'],
      [C, '{"prompt":"a","seed":"42"}'],
      [C, '{"prompt":"a","stop":["x",1]}'],
      [C, '{"prompt":"a","stream":true,"stream_options":{"include_usage":"yes"}}'],
      [H, '{"messages":[{"role":"user","content":"a"}],"ignore_eos":1}']
    ]
    for (const [p, raw] of cases) {
      const r = await both(p, undefined, raw)
      const seen = (a: Answer) => [p, raw, a.status, a.text, a.headers.get("content-type"), a.headers.get("connection")]
      expect(seen(r.sim)).toEqual(seen(r.real))
      expect(r.real.headers.get("connection")).toBe("close")
    }
    // A syntax error: nlohmann's words for where it failed are not matched, its prefix and the status are.
    const bad = await both(C, undefined, "{not json")
    for (const a of [bad.real, bad.sim]) {
      expect(a.status).toBe(500)
      expect(JSON.parse(a.text).error).toMatchObject({ code: 500, type: "server_error" })
      expect(JSON.parse(a.text).error.message).toMatch(/^\[json\.exception\.parse_error\.101\] parse error/)
    }
  })

  it("taken alike: any content type, unknown fields, unknown roles, no messages, a system message alone, any model name", async () => {
    const text = { method: "POST", body: JSON.stringify({ prompt: "the quick", max_tokens: 2 }) }
    const cases: Array<[string, RequestInit | Record<string, unknown>]> = [
      [C, { ...text, headers: { "content-type": "text/plain" } }],
      [C, text],
      [C, { prompt: "the quick", max_tokens: 2, foo: 1, user: "u", logit_bias: {}, best_of: 1 }],
      [
        H,
        { messages: [{ role: "wizard", content: "hi" }], max_tokens: 2, tools: [], response_format: { type: "text" } }
      ],
      [H, { messages: [], max_tokens: 2 }],
      [H, { messages: [{ role: "system", content: "be brief" }], max_tokens: 2 }],
      [H, { messages: [{ role: "user", content: [{ type: "text", text: "hi" }] }], max_tokens: 2 }],
      [H, { model: "gpt-4o", messages: [{ role: "user", content: null }], max_tokens: 2 }],
      [C, { model: 5, prompt: [1, 2, 3], max_tokens: 2 }]
    ]
    for (const [p, b] of cases) {
      const init = "method" in b ? (b as RequestInit) : undefined
      const r = await both(p, init === undefined ? b : undefined, undefined, init)
      expect([p, b, r.sim.status]).toEqual([p, b, r.real.status])
      expect([p, b, orderedShape(json(r.sim))]).toEqual([p, b, orderedShape(json(r.real))])
      expect(json(r.sim).model).toBe("tiny")
      expect(json(r.real).model).toBe("tiny")
    }
  })

  it("routes: 404 for unknown paths and methods (byte for byte), chat without /v1, /models, HEAD, OPTIONS", async () => {
    const notFound: Array<[string, string]> = [
      ["GET", "/v1/nothing"],
      ["POST", "/v1/nothing"],
      ["GET", C],
      ["GET", H],
      ["PUT", H],
      ["DELETE", C],
      ["POST", "/v1/models"],
      ["POST", "/health"]
    ]
    for (const [method, p] of notFound) {
      const r = await both(p, undefined, undefined, { method, ...(method === "GET" ? {} : { body: "{}" }) })
      const seen = (a: Answer) => [method, p, a.status, a.text, a.headers.get("content-type")]
      expect(seen(r.sim)).toEqual(seen(r.real))
    }
    const chat = await both("/chat/completions", { messages: [{ role: "user", content: "hi" }], max_tokens: 2 })
    expect(orderedShape(json(chat.sim))).toEqual(orderedShape(json(chat.real)))
    const models = await both("/models")
    expect([models.sim.status, Object.keys(JSON.parse(models.sim.text))]).toEqual([
      models.real.status,
      Object.keys(JSON.parse(models.real.text))
    ])
    const head = await both("/health", undefined, undefined, { method: "HEAD" })
    const headSeen = (a: Answer) => [a.status, a.text, a.headers.get("content-length"), a.headers.get("content-type")]
    expect(headSeen(head.sim)).toEqual(headSeen(head.real))
    const options = await both(H, undefined, undefined, { method: "OPTIONS" })
    const cors = (a: Answer) => [
      a.status,
      ...[...a.headers.keys()].filter((k) => k.startsWith("access-control-")).sort()
    ]
    expect(cors(options.sim)).toEqual(cors(options.real))
    expect(options.sim.headers.get("access-control-allow-methods")).toBe(
      options.real.headers.get("access-control-allow-methods")
    )
  })

  it("keep-alive: requests share a connection (5 s, 100 requests), an error answer closes it", async () => {
    const run = async (base: string) => {
      const agent = new http.Agent({ keepAlive: true, maxSockets: 1 })
      const send = (p: string, body?: string) =>
        new Promise<Array<unknown>>((resolve, reject) => {
          const req = http.request(
            `${base}${p}`,
            { agent, method: body === undefined ? "GET" : "POST", headers: { "content-type": "application/json" } },
            (res) => {
              res.resume()
              res.on("end", () => resolve([p, res.statusCode, req.reusedSocket, res.headers["keep-alive"] ?? null]))
            }
          )
          req.on("error", reject)
          req.end(body)
        })
      try {
        return [
          await send("/health"),
          await send(C, JSON.stringify({ prompt: "the quick", max_tokens: 2 })),
          await send("/v1/nothing"),
          await send("/health")
        ]
      } finally {
        agent.destroy()
      }
    }
    const [r, s] = [await run(real), await run(sim)]
    expect(s).toEqual(r)
    expect(r.map((x) => x[2])).toEqual([false, true, true, false])
  })

  it("a streamed answer's connection is closed after its last chunk, though its headers say keep-alive", async () => {
    // One raw keep-alive request; what follows the terminating chunk: the server's end of the connection, or nothing
    // within 2 s (kept alive).
    const run = (base: string) =>
      new Promise<Array<unknown>>((resolve, reject) => {
        const url = new URL(base)
        const socket = net.connect(Number(url.port), url.hostname)
        const body = JSON.stringify({ prompt: "the quick", max_tokens: 2, stream: true })
        let received = ""
        let timer: NodeJS.Timeout | undefined
        const done = (closed: boolean) => {
          clearTimeout(timer)
          socket.destroy()
          const keepAlive = /\r\nkeep-alive: ([^\r]*)/i.exec(received)?.[1] ?? null
          resolve([received.endsWith("0\r\n\r\n"), keepAlive, closed])
        }
        socket.on("error", reject)
        socket.on("data", (d: Buffer) => {
          received += d.toString("latin1")
          if (received.endsWith("0\r\n\r\n") && timer === undefined) timer = setTimeout(() => done(false), 2_000)
        })
        socket.on("end", () => done(true))
        socket.write(
          `POST ${C} HTTP/1.1\r\nhost: ${url.host}\r\nconnection: keep-alive\r\ncontent-type: application/json\r\n` +
            `content-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`
        )
      })
    const [r, s] = [await run(real), await run(sim)]
    expect(s).toEqual(r)
    expect(r).toEqual([true, "timeout=5, max=100", true])
  })

  it("a client that leaves a whole (non-streamed) answer: the server generates it to the end for nobody, its slot busy meanwhile", async () => {
    for (const base of [real, sim]) {
      const before = await engineMetric(base, "llamacpp:tokens_predicted_total")
      const ac = new AbortController()
      const asked = fetch(`${base}${C}`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ prompt: "the quick", max_tokens: 200 }),
        signal: ac.signal
      }).catch(() => undefined)
      await pollUntil(
        `${base}: the request running`,
        async () => (await engineMetric(base, "llamacpp:requests_processing")) === 1
      )
      ac.abort()
      await asked
      // All 200 tokens are made and counted, then the slot is free.
      await pollUntil(`${base}: the whole answer made`, async () =>
        (await engineMetric(base, "llamacpp:tokens_predicted_total")) - before === 200 ? true : undefined
      )
      expect(await engineMetric(base, "llamacpp:requests_processing")).toBe(0)
    }
  })

  it("a client that leaves mid-stream frees its slot at once: /slots idle, requests_processing 0, generation cut short", async () => {
    for (const base of [real, sim]) {
      const before = await engineMetric(base, "llamacpp:tokens_predicted_total")
      const ac = new AbortController()
      const res = await fetch(`${base}${C}`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ prompt: "the quick", max_tokens: -1, stream: true }),
        signal: ac.signal
      })
      await res.body?.getReader().read()
      ac.abort()
      await pollUntil(`${base}: every slot idle`, async () => {
        const slots = (await (await fetch(`${base}/slots`)).json()) as Array<{ id: number; is_processing: boolean }>
        return slots.length === 2 && slots.every((x) => x.is_processing === false)
      })
      expect(await engineMetric(base, "llamacpp:requests_processing")).toBe(0)
      // Left alone it would make 509 tokens (the slot's 512 less the prompt); both stop within a few.
      expect((await engineMetric(base, "llamacpp:tokens_predicted_total")) - before).toBeLessThan(100)
    }
  })
})
