// Differential check of the simulator: the same requests to `cgn-engine-sim --flavor llama_cpp` and to the
// real llama-server (built by `npm run real-engine:build`, the tiny model of test/support/ggufModel.ts),
// comparing what the agent relies on: status codes, body and error shapes, SSE framing (event fields,
// the [DONE] end, the usage chunk), health and metric names. Text differs (the simulator echoes), the
// wire does not.
import { type ChildProcess, spawn } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { parsePromText } from "../../src/services/engine/PromText.ts"
import { followLines } from "../support/lines.ts"
import { pollUntil } from "../support/poll.ts"
import { freePort } from "../support/ports.ts"
import { type SimHandle, startSim } from "../support/sim.ts"
import { type RealEngine, realEngine, SERVER_ARGS, tinyModel } from "./engine.ts"

let engine: RealEngine
let dir: string
let real: { url: string; proc: ChildProcess }
let sim: SimHandle

/** The command line the agent renders for llama.cpp (minus -ngl), shared by both servers. */
const serverArgs = (modelFile: string, port: number) => [
  "-m",
  modelFile,
  "-a",
  "tiny",
  "--host",
  "127.0.0.1",
  "--port",
  String(port),
  "-c",
  "1024",
  "--metrics",
  ...SERVER_ARGS,
  "-np",
  "2"
]

const startReal = async (modelFile: string) => {
  const port = await freePort()
  const proc = spawn(engine.server, serverArgs(modelFile, port), { stdio: ["ignore", "ignore", "pipe"] })
  // Killed if it never gets healthy (afterAll has no handle then) and, as a last resort, when this process exits.
  const kill = (): void => {
    proc.kill("SIGKILL")
  }
  process.once("exit", kill)
  followLines(proc.stderr)
  const url = `http://127.0.0.1:${port}`
  try {
    await pollUntil("llama-server /health 200", async () => (await fetch(`${url}/health`)).status === 200, 60_000)
  } catch (e) {
    kill()
    throw e
  }
  return { url, proc }
}

beforeAll(async () => {
  engine = realEngine()
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-real-diff-"))
  const model = tinyModel(engine, dir, "words")
  real = await startReal(model)
  // Random words up to max_tokens, as the tiny model does (echo would stop at the prompt's length).
  sim = await startSim({ flavor: "llama_cpp", args: [...serverArgs(model, await freePort()), "--sim-mode", "random"] })
}, 30 * 60_000)

afterAll(async () => {
  real?.proc.kill("SIGKILL")
  await sim?.stop()
  if (dir) fs.rmSync(dir, { recursive: true, force: true })
})

interface Answer {
  readonly status: number
  readonly contentType: string
  readonly text: string
}

const ask = async (base: string, p: string, body?: unknown, rawBody?: string): Promise<Answer> => {
  const payload = rawBody ?? (body === undefined ? undefined : JSON.stringify(body))
  const res = await fetch(
    `${base}${p}`,
    payload === undefined ? {} : { method: "POST", headers: { "content-type": "application/json" }, body: payload }
  )

  return {
    status: res.status,
    contentType: (res.headers.get("content-type") ?? "").split(";")[0]!,
    text: await res.text()
  }
}

/** Both servers' answers to one request. */
const both = async (p: string, body?: unknown, rawBody?: string) => {
  const [r, s] = await Promise.all([ask(real.url, p, body, rawBody), ask(sim.url, p, body, rawBody)])
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
    expect(await names(sim.url)).toEqual(await names(real.url))
  })
})
