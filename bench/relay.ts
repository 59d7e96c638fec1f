// Relay benchmark (`npm run bench`): the same simulator on the same machine, streamed directly over HTTP SSE
// and through the agent's gRPC server, at several concurrencies. Prints tokens/s, TTFT p50/p99, the agent's
// CPU per 1k relayed tokens and peak RSS, and the through-agent / direct ratios. A benchmark, not a test.
// The agent runs in its own process (this file re-executed with --agent) so its CPU and RSS are its own.
// Flags: --concurrency 1,64,256 --tokens 128 --rounds 4 --itl 5ms --profile DIR (writes the agent's --cpu-prof).
import { type ChildProcess, spawn } from "node:child_process"
import { fileURLToPath } from "node:url"
import { parseArgs } from "node:util"
import { Effect, Layer, ManagedRuntime } from "effect"
import { createChannel, createClient } from "nice-grpc"
import { Agent, request } from "undici"
import { AgentDefinition } from "../src/gen/cgn/agent/v1/agent.ts"
import { layerFromObject } from "../src/layers/Config.ts"
import { layerFromPlan } from "../src/layers/EngineClient.ts"
import { layerTest as engineLayerTest, testPlan } from "../src/layers/EngineProcessTest.ts"
import { layerWith as grpcLayerWith } from "../src/layers/GrpcServer.ts"
import { layerTest as nodeStatusLayerTest } from "../src/layers/NodeStatus.ts"
import { State } from "../src/services/EngineState.ts"
import { GrpcServer } from "../src/services/GrpcServer.ts"
import { startSim } from "../test/support/sim.ts"

const self = fileURLToPath(import.meta.url)

// ---------------------------------------------------------------------------------------------------------
// Agent process: the gRPC server with the live EngineClient, answering stats requests over IPC.

const runAgent = async (engineUrl: string): Promise<void> => {
  const port = Number(new URL(engineUrl).port)
  const plan = testPlan({ baseUrl: engineUrl, port, servedModel: "m", requestModel: "m" })
  const deps = Layer.mergeAll(
    layerFromObject({
      agent: { node_id: "bench", max_tokens_limit: 100_000, log_level: "warn" },
      engine: { kind: "vllm", url: engineUrl },
      models: { m: { hf_repo: "org/m" } }
    }),
    layerFromPlan(plan),
    engineLayerTest({ plan, initial: State.Ready({ since: Date.now(), run: 0 }) }),
    nodeStatusLayerTest({ state: "ready" })
  )
  const rt = ManagedRuntime.make(grpcLayerWith({ address: "127.0.0.1:0" }).pipe(Layer.provideMerge(deps)))
  const server = await rt.runPromise(Effect.map(GrpcServer, (s) => s))
  process.on("message", (m: { type: string }) => {
    if (m.type === "stats") {
      const cpu = process.cpuUsage()
      process.send?.({ type: "stats", cpuUs: cpu.user + cpu.system, maxRssKb: process.resourceUsage().maxRSS })
    } else if (m.type === "exit") {
      void rt.dispose().then(() => process.exit(0))
    }
  })
  process.send?.({ type: "ready", address: server.address })
}

// ---------------------------------------------------------------------------------------------------------
// Load generator

interface Sample {
  readonly ttftMs: number
  readonly tokens: number
}

interface PhaseResult {
  readonly tokens: number
  readonly wallMs: number
  readonly ttft: ReadonlyArray<number>
  readonly errors: number
}

const body = (tokens: number) =>
  JSON.stringify({
    model: "m",
    prompt: "bench",
    max_tokens: tokens,
    stream: true,
    stream_options: { include_usage: true }
  })

// The direct client is as cheap as the agent's own engine client: undici's raw body chunks, a byte scan.
const pool = new Agent({ connections: null, pipelining: 1 })
const TEXT = Buffer.from('"text":"')

/** One direct SSE stream: counts events whose `text` is non-empty. */
const direct = async (url: string, tokens: number): Promise<Sample> => {
  const started = performance.now()
  const res = await request(`${url}/v1/completions`, {
    method: "POST",
    dispatcher: pool,
    headers: { "content-type": "application/json", accept: "text/event-stream" },
    body: body(tokens)
  })
  if (res.statusCode !== 200) throw new Error(`direct: HTTP ${res.statusCode}`)
  let ttftMs = -1
  let count = 0
  for await (const chunk of res.body as AsyncIterable<Buffer>) {
    let i = chunk.indexOf(TEXT)
    while (i >= 0) {
      // A token is `"text":"<something>`; the final chunk has `"text":""`.
      if (chunk[i + TEXT.length] !== 0x22) {
        if (ttftMs < 0) ttftMs = performance.now() - started
        count++
      }
      i = chunk.indexOf(TEXT, i + TEXT.length)
    }
  }
  return { ttftMs, tokens: count }
}

type Client = ReturnType<typeof createClient<typeof AgentDefinition>>

const viaAgent = async (client: Client, tokens: number): Promise<Sample> => {
  const started = performance.now()
  let ttftMs = -1
  let count = 0
  for await (const r of client.generate({ prompt: "bench", sampling: { maxTokens: tokens } })) {
    if (r.delta !== undefined) {
      if (ttftMs < 0) ttftMs = performance.now() - started
      count += r.delta.tokens
    }
  }
  return { ttftMs, tokens: count }
}

const phase = async (concurrency: number, rounds: number, one: () => Promise<Sample>): Promise<PhaseResult> => {
  const ttft: Array<number> = []
  let tokens = 0
  let errors = 0
  const started = performance.now()
  const worker = async () => {
    for (let r = 0; r < rounds; r++) {
      try {
        const s = await one()
        ttft.push(s.ttftMs)
        tokens += s.tokens
      } catch {
        errors++
      }
    }
  }
  await Promise.all(Array.from({ length: concurrency }, worker))
  return { tokens, wallMs: performance.now() - started, ttft, errors }
}

const pct = (xs: ReadonlyArray<number>, p: number): number => {
  const s = [...xs].sort((a, b) => a - b)
  return s.length === 0 ? Number.NaN : (s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] ?? Number.NaN)
}

const ask = (agent: ChildProcess): Promise<{ cpuUs: number; maxRssKb: number }> =>
  new Promise((resolve) => {
    const on = (m: { type: string; cpuUs: number; maxRssKb: number }) => {
      if (m.type !== "stats") return
      agent.off("message", on)
      resolve(m)
    }
    agent.on("message", on)
    agent.send({ type: "stats" })
  })

const runBench = async (): Promise<void> => {
  const { values } = parseArgs({
    options: {
      concurrency: { type: "string", default: "1,64,256" },
      tokens: { type: "string", default: "128" },
      rounds: { type: "string", default: "4" },
      itl: { type: "string", default: "5ms" },
      profile: { type: "string" }
    }
  })
  const levels = values.concurrency.split(",").map(Number)
  const tokens = Number(values.tokens)
  const rounds = Number(values.rounds)
  const sim = await startSim({
    flavor: "vllm",
    args: [
      "serve",
      "org/m",
      "--served-model-name",
      "m",
      "--sim-mode",
      "random",
      "--sim-itl",
      values.itl,
      "--sim-ttft",
      "0ms",
      "--sim-max-seqs",
      String(Math.max(...levels) * 2)
    ]
  })
  const profile = values.profile === undefined ? [] : ["--cpu-prof", `--cpu-prof-dir=${values.profile}`]
  const agent = spawn(process.execPath, [...profile, self, "--agent", sim.url], {
    stdio: ["ignore", "inherit", "inherit", "ipc"]
  })
  try {
    const address = await new Promise<string>((resolve, reject) => {
      agent.once("exit", (code) => reject(new Error(`agent exited (${code})`)))
      agent.on("message", (m: { type: string; address: string }) => {
        if (m.type === "ready") resolve(m.address)
      })
    })
    const channel = createChannel(address, undefined, { "grpc.max_concurrent_streams": 1024 })
    const client = createClient(AgentDefinition, channel)
    // Warm both paths (JIT, connections).
    await phase(8, 4, () => direct(sim.url, tokens))
    await phase(8, 4, () => viaAgent(client, tokens))

    const rows: Array<Record<string, string>> = []
    const f = (n: number, d = 1) => (Number.isFinite(n) ? n.toFixed(d) : "-")
    for (const c of levels) {
      const d = await phase(c, rounds, () => direct(sim.url, tokens))
      const before = await ask(agent)
      const a = await phase(c, rounds, () => viaAgent(client, tokens))
      const after = await ask(agent)
      const dRate = (d.tokens * 1000) / d.wallMs
      const aRate = (a.tokens * 1000) / a.wallMs
      const cpuPer1k = (after.cpuUs - before.cpuUs) / 1e6 / (a.tokens / 1000)
      rows.push({
        streams: String(c),
        "direct tok/s": f(dRate, 0),
        "agent tok/s": f(aRate, 0),
        ratio: f(aRate / dRate, 3),
        "direct TTFT p50/p99 ms": `${f(pct(d.ttft, 50), 2)} / ${f(pct(d.ttft, 99), 2)}`,
        "agent TTFT p50/p99 ms": `${f(pct(a.ttft, 50), 2)} / ${f(pct(a.ttft, 99), 2)}`,
        "added TTFT p50 ms": f(pct(a.ttft, 50) - pct(d.ttft, 50), 2),
        "agent CPU s/1k tok": f(cpuPer1k, 4),
        "agent CPU us/tok": f(cpuPer1k * 1000, 2),
        "agent peak RSS MiB": f(after.maxRssKb / 1024, 0),
        errors: `${d.errors}/${a.errors}`
      })
    }
    channel.close()
    await pool.close()
    const keys = Object.keys(rows[0] ?? {})
    console.log(`relay benchmark: ${tokens} tokens/request, ${rounds} requests per stream, sim ITL ${values.itl}`)
    console.log(`| ${keys.join(" | ")} |`)
    console.log(`|${keys.map(() => "---").join("|")}|`)
    for (const r of rows) console.log(`| ${keys.map((k) => r[k]).join(" | ")} |`)
  } finally {
    agent.send({ type: "exit" })
    await new Promise<void>((resolve) => {
      if (agent.exitCode !== null) resolve()
      else agent.once("exit", () => resolve())
    })
    await sim.stop()
  }
}

if (process.argv[2] === "--agent") await runAgent(process.argv[3] ?? "")
else await runBench()
