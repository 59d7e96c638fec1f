// Relay benchmark (`npm run bench`): the same simulator on the same machine, streamed directly over HTTP SSE
// and through the agent's gRPC server, at several concurrencies. Prints tokens/s, TTFT p50/p99, the agent's
// CPU per relayed token and peak RSS, the through-agent / direct ratios, and the CPU the simulator and the load
// generator used (on a small machine they compete with the agent: a saturated machine is flagged).
// The agent runs in its own process (this file re-executed with --agent) so its CPU and RSS are its own.
// Flags: --concurrency 1,64,256 --tokens 128 --rounds 4 --itl 5ms,0ms (one table per setting)
//        --direct scan|parse (default both: two direct baselines, a ratio against each)
//        --profile DIR (writes the agent's --cpu-prof, one file per setting).
import { type ChildProcess, spawn } from "node:child_process"
import { readFileSync } from "node:fs"
import { availableParallelism } from "node:os"
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
// CPU accounting (Linux /proc; zeros elsewhere)

/** CPU seconds of a whole process (all threads), from /proc/PID/stat (10 ms ticks). */
const procCpuS = (pid: number): number => {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8")
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ")
    return (Number(f[11]) + Number(f[12])) / 100
  } catch {
    return 0
  }
}

/** CPU microseconds of this process's main thread (schedstat is in ns). */
const mainThreadUs = (): number => {
  try {
    return Number(readFileSync(`/proc/self/task/${process.pid}/schedstat`, "utf8").split(" ")[0]) / 1000
  } catch {
    return 0
  }
}

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
      const stats: AgentStats = {
        type: "stats",
        cpuUs: cpu.user + cpu.system,
        mainUs: mainThreadUs(),
        maxRssKb: process.resourceUsage().maxRSS
      }
      process.send?.(stats)
    } else if (m.type === "exit") {
      void rt.dispose().then(() => process.exit(0))
    }
  })
  process.send?.({ type: "ready", address: server.address })
}

interface AgentStats {
  readonly type: "stats"
  /** All threads (main, V8 GC and compiler workers, libuv). */
  readonly cpuUs: number
  readonly mainUs: number
  readonly maxRssKb: number
}

// ---------------------------------------------------------------------------------------------------------
// Load generator

interface Sample {
  readonly ttftMs: number
  readonly tokens: number
  /** Messages (SSE events with text, or gRPC deltas) that carried them. */
  readonly messages: number
  /** The agent's own TTFT (call start to first engine text), from the final message. */
  readonly agentTtftMs?: number
}

interface PhaseResult {
  readonly tokens: number
  readonly messages: number
  readonly wallMs: number
  readonly ttft: ReadonlyArray<number>
  readonly agentTtft: ReadonlyArray<number>
  readonly errors: number
  /** CPU seconds of the simulator and of this process (the load generator) during the phase. */
  readonly simCpuS: number
  readonly loadCpuS: number
}

const body = (tokens: number) =>
  JSON.stringify({
    model: "m",
    prompt: "bench",
    max_tokens: tokens,
    stream: true,
    stream_options: { include_usage: true }
  })

// Two direct baselines. `scan`: undici's raw body chunks and a byte scan, cheaper than any real client (it never
// looks at the text). `parse`: what a router reading the engine itself must do — split SSE events, JSON.parse each
// `data:` line, take `choices[0].text` (or `delta.content`) and keep it.
const pool = new Agent({ connections: null, pipelining: 1 })
const TEXT = Buffer.from('"text":"')

type Baseline = "scan" | "parse"

const open = async (url: string, tokens: number) => {
  const res = await request(`${url}/v1/completions`, {
    method: "POST",
    dispatcher: pool,
    headers: { "content-type": "application/json", accept: "text/event-stream" },
    body: body(tokens)
  })
  if (res.statusCode !== 200) throw new Error(`direct: HTTP ${res.statusCode}`)
  return res.body as AsyncIterable<Buffer>
}

/** One direct SSE stream, byte scan: counts events whose `text` is non-empty. */
const directScan = async (url: string, tokens: number): Promise<Sample> => {
  const started = performance.now()
  const stream = await open(url, tokens)
  let ttftMs = -1
  let count = 0
  for await (const chunk of stream) {
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
  return { ttftMs, tokens: count, messages: count }
}

interface CompletionChunk {
  readonly choices?: ReadonlyArray<{ readonly text?: string; readonly delta?: { readonly content?: string } }>
}

/** One direct SSE stream, parsed: SSE lines (`\n` or `\r\n`), `JSON.parse` per `data:` line, text accumulated. */
const directParse = async (url: string, tokens: number): Promise<Sample> => {
  const started = performance.now()
  const stream = await open(url, tokens)
  const decoder = new TextDecoder()
  let ttftMs = -1
  let count = 0
  let pending = ""
  let text = ""
  const line = (l: string) => {
    if (!l.startsWith("data:")) return
    const data = l.charCodeAt(5) === 0x20 ? l.slice(6) : l.slice(5)
    if (data === "[DONE]") return
    const choice = (JSON.parse(data) as CompletionChunk).choices?.[0]
    const t = choice?.text ?? choice?.delta?.content
    if (t === undefined || t === "") return
    if (ttftMs < 0) ttftMs = performance.now() - started
    text += t
    count++
  }
  for await (const chunk of stream) {
    pending += decoder.decode(chunk, { stream: true })
    let start = 0
    let nl = pending.indexOf("\n")
    while (nl >= 0) {
      line(pending.slice(start, pending.charCodeAt(nl - 1) === 0x0d ? nl - 1 : nl))
      start = nl + 1
      nl = pending.indexOf("\n", start)
    }
    pending = pending.slice(start)
  }
  if (count > 0 && text.length === 0) throw new Error("direct: no text")
  return { ttftMs, tokens: count, messages: count }
}

const directFor = (b: Baseline) => (b === "scan" ? directScan : directParse)

type Client = ReturnType<typeof createClient<typeof AgentDefinition>>

const viaAgent = async (client: Client, tokens: number): Promise<Sample> => {
  const started = performance.now()
  let ttftMs = -1
  let count = 0
  let messages = 0
  let agentTtftMs = Number.NaN
  for await (const r of client.generate({ prompt: "bench", sampling: { maxTokens: tokens } })) {
    if (r.delta !== undefined) {
      if (ttftMs < 0) ttftMs = performance.now() - started
      count += r.delta.tokens
      messages++
    } else if (r.final?.timings !== undefined) agentTtftMs = r.final.timings.timeToFirstTokenMs
  }
  return { ttftMs, tokens: count, messages, agentTtftMs }
}

const phase = async (
  simPid: number,
  concurrency: number,
  rounds: number,
  one: () => Promise<Sample>
): Promise<PhaseResult> => {
  const ttft: Array<number> = []
  const agentTtft: Array<number> = []
  let tokens = 0
  let messages = 0
  let errors = 0
  const sim0 = procCpuS(simPid)
  const load0 = process.cpuUsage()
  const started = performance.now()
  const worker = async () => {
    for (let r = 0; r < rounds; r++) {
      try {
        const s = await one()
        ttft.push(s.ttftMs)
        if (s.agentTtftMs !== undefined) agentTtft.push(s.agentTtftMs)
        tokens += s.tokens
        messages += s.messages
      } catch {
        errors++
      }
    }
  }
  await Promise.all(Array.from({ length: concurrency }, worker))
  const wallMs = performance.now() - started
  const load = process.cpuUsage(load0)
  return {
    tokens,
    messages,
    wallMs,
    ttft,
    agentTtft,
    errors,
    simCpuS: procCpuS(simPid) - sim0,
    loadCpuS: (load.user + load.system) / 1e6
  }
}

const pct = (xs: ReadonlyArray<number>, p: number): number => {
  const s = [...xs].sort((a, b) => a - b)
  return s.length === 0 ? Number.NaN : (s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] ?? Number.NaN)
}

const ask = (agent: ChildProcess): Promise<AgentStats> =>
  new Promise((resolve) => {
    const on = (m: AgentStats) => {
      if (m.type !== "stats") return
      agent.off("message", on)
      resolve(m)
    }
    agent.on("message", on)
    agent.send({ type: "stats" })
  })

const f = (n: number, d = 1) => (Number.isFinite(n) ? n.toFixed(d) : "-")

/** One simulator setting: a fresh simulator and agent, every concurrency level, one table. */
const runSetting = async (
  itl: string,
  levels: ReadonlyArray<number>,
  tokens: number,
  rounds: number,
  baselines: ReadonlyArray<Baseline>,
  profileDir: string | undefined
): Promise<void> => {
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
      itl,
      "--sim-ttft",
      "0ms",
      "--sim-max-seqs",
      String(Math.max(...levels) * 2)
    ]
  })
  const profile = profileDir === undefined ? [] : ["--cpu-prof", `--cpu-prof-dir=${profileDir}`]
  const agent = spawn(process.execPath, [...profile, self, "--agent", sim.url], {
    stdio: ["ignore", "inherit", "inherit", "ipc"]
  })
  const cores = availableParallelism()
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
    for (const b of baselines) await phase(sim.pid, 8, 4, () => directFor(b)(sim.url, tokens))
    await phase(sim.pid, 8, 4, () => viaAgent(client, tokens))
    // The agent's own background CPU (timers, health fibers) over one idle second, to read the rows against.
    const idle0 = await ask(agent)
    await new Promise((r) => setTimeout(r, 1000))
    const idle1 = await ask(agent)

    const rows: Array<Record<string, string>> = []
    for (const c of levels) {
      const ds: Array<readonly [Baseline, PhaseResult]> = []
      for (const b of baselines) ds.push([b, await phase(sim.pid, c, rounds, () => directFor(b)(sim.url, tokens))])
      const before = await ask(agent)
      const a = await phase(sim.pid, c, rounds, () => viaAgent(client, tokens))
      const after = await ask(agent)
      const rate = (p: PhaseResult) => (p.tokens * 1000) / p.wallMs
      const aRate = (a.tokens * 1000) / a.wallMs
      const agentCpuS = (after.cpuUs - before.cpuUs) / 1e6
      const busy = (cpuS: number, wallMs: number) => cpuS / (wallMs / 1000)
      const total = busy(agentCpuS + a.simCpuS + a.loadCpuS, a.wallMs)
      // The first baseline (scan when both run) is the reference for added TTFT.
      const [b0, d] = ds[0] ?? (["scan", a] as const)
      const row: Record<string, string> = { streams: String(c) }
      for (const [b, p] of ds) row[`direct ${b} tok/s`] = f(rate(p), 0)
      row["agent tok/s"] = f(aRate, 0)
      for (const [b, p] of ds) row[`ratio vs ${b}`] = f(aRate / rate(p), 3)
      for (const [b, p] of ds)
        row[`direct ${b} TTFT p50/p99 ms`] = `${f(pct(p.ttft, 50), 2)} / ${f(pct(p.ttft, 99), 2)}`
      const directCores = ds
        .map(([b, p]) => `${b}: ${f(busy(p.simCpuS, p.wallMs), 2)}/${f(busy(p.loadCpuS, p.wallMs), 2)}`)
        .join("; ")
      rows.push({
        ...row,
        "agent TTFT p50/p99 ms": `${f(pct(a.ttft, 50), 2)} / ${f(pct(a.ttft, 99), 2)}`,
        [`added TTFT p50 ms vs ${b0} (agent's own)`]: `${f(pct(a.ttft, 50) - pct(d.ttft, 50), 2)} (${f(pct(a.agentTtft, 50), 2)})`,
        "agent CPU µs/tok (main thread)": `${f((agentCpuS * 1e6) / a.tokens, 1)} (${f((after.mainUs - before.mainUs) / a.tokens, 1)})`,
        "tok/gRPC msg": f(a.tokens / Math.max(1, a.messages), 2),
        "cores used agent/sim/loadgen (direct: sim/loadgen)": `${f(busy(agentCpuS, a.wallMs), 2)}/${f(busy(a.simCpuS, a.wallMs), 2)}/${f(busy(a.loadCpuS, a.wallMs), 2)} (${directCores})${total > 0.9 * cores ? " saturated" : ""}`,
        "agent peak RSS MiB": f(after.maxRssKb / 1024, 0),
        [`errors ${[...ds.map(([b]) => b), "agent"].join("/")}`]: [...ds.map(([, p]) => p.errors), a.errors].join("/")
      })
    }
    channel.close()
    const keys = Object.keys(rows[0] ?? {})
    console.log(
      `\nrelay benchmark: sim ITL ${itl}, ${tokens} tokens/request, ${rounds} requests per stream, ${cores} cores; agent idle ${f((idle1.cpuUs - idle0.cpuUs) / 1000, 1)} ms CPU/s`
    )
    console.log(`| ${keys.join(" | ")} |`)
    console.log(`|${keys.map(() => "---").join("|")}|`)
    for (const r of rows) console.log(`| ${keys.map((k) => r[k]).join(" | ")} |`)
  } finally {
    // send() throws once the agent has died, which would leave the simulator (own process group) running.
    try {
      if (agent.exitCode === null) {
        agent.send({ type: "exit" })
        await new Promise<void>((resolve) => {
          if (agent.exitCode !== null) resolve()
          else agent.once("exit", () => resolve())
        })
      }
    } finally {
      await sim.stop()
    }
  }
}

const runBench = async (): Promise<void> => {
  const { values } = parseArgs({
    options: {
      concurrency: { type: "string", default: "1,64,256" },
      tokens: { type: "string", default: "128" },
      rounds: { type: "string", default: "4" },
      itl: { type: "string", default: "5ms,0ms" },
      direct: { type: "string", default: "scan,parse" },
      profile: { type: "string" }
    }
  })
  const levels = values.concurrency.split(",").map(Number)
  const baselines = values.direct.split(",").map((b): Baseline => {
    if (b === "scan" || b === "parse") return b
    throw new Error(`--direct: expected scan, parse or scan,parse; got ${b}`)
  })
  for (const itl of values.itl.split(","))
    await runSetting(itl, levels, Number(values.tokens), Number(values.rounds), baselines, values.profile)
  await pool.close()
}

if (process.argv[2] === "--agent") await runAgent(process.argv[3] ?? "")
else await runBench()
