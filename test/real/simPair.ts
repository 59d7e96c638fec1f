// What the differential suites (sim-differential*.test.ts) share: a real llama-server and the llama_cpp simulator
// started on the same command line, the temp dir and model they run, their cleanup, and a completion stream read
// event by event as it arrives.
import { type ChildProcess, spawn } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Agent as UndiciAgent, fetch as undiciFetch } from "undici"
import { afterAll, beforeAll } from "vitest"
import type { TinyVariant } from "../support/ggufModel.ts"
import { followLines } from "../support/lines.ts"
import { pollUntil } from "../support/poll.ts"
import { freePort } from "../support/ports.ts"
import { type SimHandle, startSim } from "../support/sim.ts"
import { postOnOwnConnection, type RealEngine, realEngine, SERVER_ARGS, tinyModel } from "./engine.ts"

export interface PairOptions {
  /** The model file; the tiny "words" model by default. */
  readonly model?: string
  /** `-c`, the context across all slots: 1024 by default, null for none (llama-server's default). */
  readonly ctx?: number | null
  /** `-np`, the slots: 2 by default, null for none (llama-server's default). */
  readonly np?: number | null
  /** More engine args, after the rest (`--metrics`, or a case's own -c and -np). */
  readonly args?: ReadonlyArray<string>
  /** The simulator's --sim-* knobs: random words (echo would stop at the prompt's length) by default. */
  readonly knobs?: ReadonlyArray<string>
  /** Environment added for both servers (LLAMA_API_KEY). */
  readonly env?: Record<string, string>
}

/** A real llama-server and the simulator on the same command line: their base URLs, and both, the real one first. */
export interface Pair {
  readonly real: string
  readonly sim: string
  readonly bases: readonly [string, string]
}

export interface Pairs {
  /** Built (or found in the cache) before the file's tests; read it from a hook or a test. */
  readonly engine: RealEngine
  /** The temp dir of this file's models, removed after its tests. */
  readonly dir: string
  /** The tiny model variant, written into `dir` once. */
  model(variant?: TinyVariant): string
  /** Starts a pair; both are killed after the file's tests, and the real one when this process exits. */
  pair(options?: PairOptions): Promise<Pair>
}

/** The command line the agent renders for llama.cpp (minus -ngl), shared by both servers. */
const serverArgs = (model: string, port: number, o: PairOptions) => [
  ...["-m", model, "-a", "tiny", "--host", "127.0.0.1", "--port", String(port)],
  ...SERVER_ARGS,
  ...(o.ctx === null ? [] : ["-c", String(o.ctx ?? 1024)]),
  ...(o.np === null ? [] : ["-np", String(o.np ?? 2)]),
  ...(o.args ?? [])
]

/**
 * The pairs of one test file: registers the hooks that build the engine and make the temp dir (`prefix`) before its
 * tests, and that kill every pair and remove the dir after them.
 */
export const pairs = (prefix: string): Pairs => {
  let engine: RealEngine | undefined
  let dir: string | undefined
  const procs: Array<ChildProcess> = []
  const sims: Array<SimHandle> = []
  const ready = () => {
    if (engine === undefined || dir === undefined) throw new Error("pairs: used before its beforeAll ran")
    return { engine, dir }
  }

  const killServers = () => {
    for (const p of procs) p.kill("SIGKILL")
  }
  beforeAll(() => {
    engine = realEngine()
    dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix))
    // One listener for the file's servers, removed with them: the worker runs other files after this one.
    process.once("exit", killServers)
  }, 30 * 60_000)

  afterAll(async () => {
    process.off("exit", killServers)
    killServers()
    await Promise.all(sims.map((s) => s.stop()))
    if (dir) fs.rmSync(dir, { recursive: true, force: true })
  })

  const model = (variant: TinyVariant = "words") => tinyModel(ready().engine, ready().dir, variant)

  const pair = async (o: PairOptions = {}): Promise<Pair> => {
    const file = o.model ?? model()
    const port = await freePort()
    const proc = spawn(ready().engine.server, serverArgs(file, port, o), {
      stdio: ["ignore", "ignore", "pipe"],
      env: { ...process.env, ...o.env }
    })
    procs.push(proc)
    followLines(proc.stderr)
    const real = `http://127.0.0.1:${port}`
    const knobs = o.knobs ?? ["--sim-mode", "random"]
    const simArgs = [...serverArgs(file, await freePort(), o), ...knobs]
    const sim = await startSim({ flavor: "llama_cpp", args: simArgs, ...(o.env ? { env: o.env } : {}) })
    sims.push(sim)
    await pollUntil("llama-server /health 200", async () => (await fetch(`${real}/health`)).status === 200, 60_000)
    return { real, sim: sim.url, bases: [real, sim.url] }
  }

  return {
    get engine() {
      return ready().engine
    },
    get dir() {
      return ready().dir
    },
    model,
    pair
  }
}

/** One event of a completion stream as a word: `null`, `DONE`, a choice's index, or its index and F (its finish). */
export const eventWord = (data: string): string => {
  if (data === "null" || data === "[DONE]") return data === "null" ? "null" : "DONE"
  const c = (JSON.parse(data) as { choices: Array<{ index: number; finish_reason: unknown }> }).choices[0]
  return `${c?.index}${c?.finish_reason === null ? "" : "F"}`
}

/**
 * Streams a completion on a connection of its own (llama-server closes a stream's connection after its end), handing
 * each SSE event (its text, without the blank line that ends it) to `seen` as it arrives, with the ms since the
 * request; resolves once the stream ends.
 */
export const streamCompletion = async (
  base: string,
  body: Record<string, unknown>,
  seen: (event: string, ms: number) => void
): Promise<void> => {
  const dispatcher = new UndiciAgent()
  const t0 = performance.now()
  try {
    const res = await undiciFetch(`${base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ ...body, stream: true }),
      dispatcher
    })
    const decoder = new TextDecoder()
    let buf = ""
    for await (const chunk of res.body ?? []) {
      buf += decoder.decode(chunk as Uint8Array, { stream: true })
      for (let i = buf.indexOf("\n\n"); i >= 0; i = buf.indexOf("\n\n")) {
        const event = buf.slice(0, i)
        buf = buf.slice(i + 2)
        seen(event, performance.now() - t0)
      }
    }
  } finally {
    await dispatcher.close()
  }
}

/** A JSON value's shape with the keys in the server's order (llama-server writes ordered JSON); arrays by their first element. */
export const orderedShape = (v: unknown): unknown => {
  if (Array.isArray(v)) return v.length === 0 ? [] : [orderedShape(v[0])]
  if (v === null) return "null"
  if (typeof v === "object") return Object.entries(v as object).map(([k, x]) => [k, orderedShape(x)])
  return typeof v
}

/** Both servers' answers to one body: statuses always, the text too where the real one refuses. */
export const answersOf = async (pair: Pair, p: string, body: Record<string, unknown>): Promise<Array<unknown>> => {
  const [r, s] = [await postOnOwnConnection(pair.real, p, body), await postOnOwnConnection(pair.sim, p, body)]
  return r.status === 200 ? [r.status, s.status] : [r.status, r.text, s.status, s.text]
}

/** `answersOf`'s shape had the simulator answered as the real server did. */
export const sameAnswers = (answers: Array<unknown>): Array<unknown> =>
  answers.length === 2 ? [answers[0], answers[0]] : [answers[0], answers[1], answers[0], answers[1]]
