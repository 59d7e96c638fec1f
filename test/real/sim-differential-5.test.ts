// Differential check of the llama_cpp simulator against the real llama-server, continued (sim-differential-4.test.ts
// has the slots' order): what /slots shows of a cancelled task, the task ids, which slot a task takes, and the timing
// of decode steps. A task cancelled by its stream's client leaves its slot's has_next_token true (server_slot::reset
// never clears it; its last token does, tools/server/server-context.cpp process_token). Every task of the server
// takes an id: a prompt's, its children's, each loop pass with a busy slot (a decode step), each GET /slots and
// /metrics. A task takes the idle slot whose tokens its prompt shares most of (more than --slot-prompt-similarity,
// 0.1), else the least recently used (get_available_slot); its children the lowest idle ones (get_free_slots). One
// decode step gives every busy slot a token, so a prompt's two completions take as long as one; a later task's
// prompt is evaluated once it holds its slot, so its first token comes that long after the one before it ended, its
// begin (`data: null`) as it took the slot.
// Timing is compared as a relation (2 shared cores): the simulator's TTFT and ITL knobs stand for the real times.
// Every answer's headers: cpp-httplib's `Server`, the echoed Origin, Keep-Alive without `Connection`, no Date; and
// /metrics without --metrics, a 501.
import * as http from "node:http"
import { describe, expect, it } from "vitest"
import { pollUntil } from "../support/poll.ts"
import { engineMetric, postOnOwnConnection as post, requestOnOwnConnection as request } from "./engine.ts"
import { eventWord, pairs, streamCompletion } from "./simPair.ts"

const diff = pairs("cgn-real-diff5-")

/** A real llama-server and the simulator (its knobs `knobs`) on the same command line; their base URLs. */
const pair = async (np: number, args: ReadonlyArray<string>, knobs: ReadonlyArray<string>) =>
  (await diff.pair({ np, args, knobs })).bases

type Slot = {
  id: number
  is_processing: boolean
  id_task?: number
  n_prompt_tokens?: number
  next_token?: Array<{ has_next_token: boolean; n_remain: number; n_decoded: number }>
}
const slots = async (base: string) => JSON.parse((await request(`${base}/slots`)).text) as Array<Slot>
/** The slot that ran the latest task. */
const latest = (ss: ReadonlyArray<Slot>) => ss.reduce((a, b) => ((b.id_task ?? -1) > (a.id_task ?? -1) ? b : a))
const completion = (base: string, body: Record<string, unknown>) => post(base, "/v1/completions", body)

/** A stream's events as they arrive, with their times (ms from the request): `null`, a choice (`0`, `0F`), `DONE`. */
const timed = async (base: string, body: Record<string, unknown>) => {
  const out: Array<{ e: string; t: number }> = []
  await streamCompletion(base, body, (event, t) => out.push({ e: eventWord(event.slice(6)), t }))
  return out
}

describe("/slots of a cancelled task: the simulator against the real server", () => {
  it("a stream its client left: the slot idle with has_next_token still true, until the slot's next task ends", async () => {
    for (const base of await pair(1, [], ["--sim-mode", "random", "--sim-itl", "2ms"])) {
      const ac = new AbortController()
      const res = await fetch(`${base}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ prompt: "the quick", max_tokens: 500, stream: true }),
        signal: ac.signal
      })
      const reader = (res.body as ReadableStream<Uint8Array>).getReader()
      await reader.read()
      ac.abort()
      // the server sees the client gone at its next write (a bounded poll: there is no event to await)
      const idle = async () => ((await slots(base))[0]?.is_processing === false ? await slots(base) : undefined)
      const cancelled = (await pollUntil(`${base} the slot idle`, idle, 10_000, 10))[0]
      const next = cancelled?.next_token?.[0]
      expect([base, next?.has_next_token, next?.n_remain, next?.n_decoded]).toEqual([base, true, -1, 0])
      expect((await completion(base, { prompt: "a b", max_tokens: 2 })).status).toBe(200)
      expect([base, (await slots(base))[0]?.next_token?.[0]?.has_next_token]).toEqual([base, false])
    }
  })
})

describe("task ids and slot choice: the simulator against the real server", () => {
  it("ids count tasks, decode steps, /slots and /metrics; not /health, /props, /v1/models nor /tokenize", async () => {
    for (const base of await pair(1, ["--metrics"], ["--sim-mode", "random"])) {
      expect((await completion(base, { prompt: "a b", max_tokens: 3 })).status).toBe(200)
      const first = (await slots(base))[0]?.id_task
      await request(`${base}/metrics`)
      for (const p of ["/health", "/props", "/v1/models"]) await request(`${base}${p}`)
      await post(base, "/tokenize", { content: "a b" })
      expect((await completion(base, { prompt: "a b", max_tokens: 2 })).status).toBe(200)
      // 0: the first task; 1-3 its steps; 4: /slots; 5: /metrics; 6: the second task
      expect([base, first, (await slots(base))[0]?.id_task]).toEqual([base, 0, 6])
    }
  })

  it("a task takes the idle slot whose tokens its prompt shares enough of, else the least recently used", async () => {
    for (const base of await pair(2, [], ["--sim-mode", "random"])) {
      const taken: Array<number | undefined> = []
      const words = Array.from({ length: 30 }, (_, i) => `w${i}`).join(" ")
      // a fresh server's last slot (LRU); "a b" again shares its BOS, a, b (> 0.1): the same slot, though LRU
      // would pick the other; 31 tokens sharing the BOS only (1/31): the least recently used
      for (const prompt of ["a b", "a b", words, "a b"]) {
        expect((await completion(base, { prompt, max_tokens: 2 })).status).toBe(200)
        taken.push(latest(await slots(base)).id)
      }
      // a prompt's two completions: the parent in the similar slot, its child in the other; a child keeps no tokens
      expect((await completion(base, { prompt: "a b", max_tokens: 2, n: 2 })).status).toBe(200)
      const after = await slots(base)
      const child = latest(after)
      expect([base, taken, child.id, child.n_prompt_tokens, after[1]?.id_task]).toEqual([
        base,
        [1, 1, 0, 1],
        0,
        0,
        (child.id_task ?? 0) - 1
      ])
    }
  })
})

describe("decode steps: the simulator against the real server", () => {
  it("a prompt's two completions take one decode step a token, as one completion does, not two", async () => {
    // counted in decode steps (llama-server batches a token of every busy slot into one), not timed: a shared
    // machine's pauses made a ratio of times fail now and then
    for (const base of await pair(2, ["--metrics"], ["--sim-mode", "random"])) {
      const steps = async (body: Record<string, unknown>) => {
        const before = await engineMetric(base, "llamacpp:n_decode_total")
        expect((await completion(base, body)).status).toBe(200)
        return (await engineMetric(base, "llamacpp:n_decode_total")) - before
      }
      const body = { prompt: "a b", max_tokens: 40, ignore_eos: true }
      const one = await steps(body)
      expect([base, one, await steps({ ...body, n: 2 })]).toEqual([base, 40, 40])
    }
  })

  it("-np 1: a later task's first token comes a prompt's evaluation after the one before it ended", async () => {
    for (const base of await pair(1, [], ["--sim-mode", "random", "--sim-itl", "1ms", "--sim-ttft", "150ms"])) {
      // two long prompts that share only their BOS, so that nothing of the second is cached
      const es = await timed(base, { prompt: ["x y ".repeat(400), "u v ".repeat(400)], max_tokens: 12 })
      const at = (e: string) => es.find((x) => x.e === e)?.t ?? 0
      const gaps = es.filter((x) => x.e === "0").map((x, i, a) => x.t - (a[i - 1]?.t ?? x.t))
      const itl = gaps.slice(1).sort((a, b) => a - b)[Math.floor((gaps.length - 1) / 2)] ?? 0
      const wait = at("1") - at("0F")
      expect([base, wait > 5 * itl && wait > 10]).toEqual([base, true])
      // its begin, `data: null`, as it takes the slot, before its prompt is evaluated: in the first half of the wait
      expect([base, at("null") - at("0F") < at("1") - at("null")]).toEqual([base, true])
    }
  })
})

/** The headers whose value is fixed (not a length or a time). */
const FIXED = [
  "server",
  "access-control-allow-origin",
  "connection",
  "keep-alive",
  "content-type",
  "transfer-encoding",
  "x-accel-buffering",
  "accept-ranges"
]

/** An answer's status, header names (sorted), the fixed ones' values, /metrics' start header, and body. */
interface Answer {
  readonly status: number | undefined
  readonly names: Array<string>
  readonly fixed: Array<unknown>
  readonly start: string | undefined
  readonly text: string
}

/** One request on a connection of its own. */
const answer = (base: string, method: string, p: string, headers: Record<string, string>, body?: string) =>
  new Promise<Answer>((resolve, reject) => {
    const req = http.request(`${base}${p}`, { method, agent: false, headers }, (res) => {
      let text = ""
      res.setEncoding("utf8")
      res.on("data", (c: string) => {
        text += c
      })
      res.on("end", () => {
        const names = res.rawHeaders.filter((_, i) => i % 2 === 0).map((n) => n.toLowerCase())
        const fixed = FIXED.map((n) => [n, res.headers[n] ?? null])
        const start = res.headers["process-start-time-unix"] as string | undefined
        resolve({ status: res.statusCode, names: names.sort(), fixed, start, text })
      })
    })
    req.on("error", reject)
    req.end(body)
  })

describe("headers: the simulator against the real server", () => {
  it("each answer's header names and fixed values: JSON, errors, a stream, /health, HEAD, OPTIONS, /metrics", async () => {
    const C = "/v1/completions"
    const [json, origin] = [{ "content-type": "application/json" }, { origin: "http://x" }]
    const cases: Array<[string, string, Record<string, string>, string?]> = [
      ["GET", "/health", {}],
      ["GET", "/health", origin],
      ["GET", "/health", { connection: "close" }],
      ["HEAD", "/health", {}],
      ["OPTIONS", C, origin],
      ["GET", "/metrics", {}],
      ["GET", "/metrics", origin],
      ["GET", "/nothing", {}],
      ["POST", C, json, JSON.stringify({ prompt: "a b", max_tokens: 2 })],
      ["POST", C, json, JSON.stringify({ prompt: "a b", n: 3 })],
      ["POST", C, { ...json, ...origin }, JSON.stringify({ prompt: "a b", max_tokens: 2, stream: true })]
    ]
    for (const metrics of [[], ["--metrics"]]) {
      const [real, sim] = await pair(2, metrics, ["--sim-mode", "random"])
      for (const [method, p, headers, body] of cases) {
        const [r, s] = [await answer(real, method, p, headers, body), await answer(sim, method, p, headers, body)]
        const seen = (a: Answer) => [metrics, method, p, headers, a.status, a.names, a.fixed]
        expect(seen(s)).toEqual(seen(r))
        if (p !== "/metrics") continue
        expect([metrics, r.status]).toEqual([metrics, metrics.length === 0 ? 501 : 200])
        // without --metrics: llama-server's 501, byte for byte; with it, Process-Start-Time-Unix: the monotonic
        // clock at start in µs (not a Unix time), the two started within the same minute
        if (r.status === 501) expect(s.text).toBe(r.text)
        else expect(Math.abs(Number(r.start) - Number(s.start)) < 60e6).toBe(true)
      }
      const health = await answer(real, "GET", "/health", origin)
      expect(health.fixed.slice(0, 2)).toEqual([
        ["server", "llama.cpp"],
        ["access-control-allow-origin", "http://x"]
      ])
    }
  })
})
