// Relay benchmark (`npm run bench`): the same simulator on the same machine, streamed by the same load generator
// three ways in one run: directly over HTTP SSE, through nginx as a plain SSE reverse proxy (what a user could put
// in front of an engine instead of the agent), and through the agent's gRPC server (gRPC in, SSE out to the
// engine). Per concurrency level it prints tokens/s, the ratios against direct, TTFT p50 and what nginx and the
// agent add to it, CPU per relayed token and peak RSS of nginx and of the agent, and the cores the simulator and
// the load generator used (they share one core: a saturated core is flagged). Per ITL setting it also prints the
// per-call CPU cost (1-token requests, sequential and concurrent), apart from the per-token cost.
// Pinning (taskset): the agent and nginx on CPU 0, the simulator and the load generator on CPU 1 (`--pin 0,1`;
// `--pin none` to leave scheduling to the kernel). The agent is the built daemon as users run it (`dist/main.js
// run`, `npm run bench` builds it first) with engine.kind "openai_compat" proxying the simulator, standalone (no
// etcd) and with every layer of the product: its CPU and RSS are the product's. nginx runs as one process
// (master_process off), see bench/nginx.ts.
// Flags: --concurrency 1,64,256 --tokens 128 --rounds 4 --itl 5ms,0ms (one table per setting)
//        --min-samples 32 (a level runs at least this many requests per path, more rounds at few streams: the
//        TTFT p50 of 1 stream x 4 rounds was 4 samples, whose median moved by a millisecond run to run)
//        --blocks 3 (a level's rounds are split into blocks; in each block direct, nginx and the agent run in
//        turn, the order rotated per block, so a slow spell of the VM falls on all three paths alike; the table
//        pools the blocks and shows the spread of what nginx and the agent add to direct's TTFT p50 between them)
//        --direct scan|parse (the client of the direct and nginx phases; default scan)
//        --grpc-client lean|nice (the agent phase's client: bench/grpc-client.ts over node:http2, default, or
//        nice-grpc over grpc-js, which costs the shared load-generator core more per call)
//        --calls 200 (1-token requests per per-call measurement)
//        --warmup-calls 3000 (1-token requests per path at each level before measuring, so V8 has optimized the
//        agent's per-call path, as in a daemon in service; 0: only the short warm-up, as before the eighth session)
//        --profile DIR (writes the agent's --cpu-prof, one file per setting)
//        --agent-node-flags="..." (Node/V8 flags for the agent process; default: the image's, from the Dockerfile)
//        --agent-env="NAME=VALUE ..." (variables set for the agent process alone; default: the image's, from the
//        Dockerfile's ENTRYPOINT, e.g. MALLOC_ARENA_MAX=1; "" for none)
//        --agent-root DIR (run another checkout's built agent, DIR/dist/main.js, to compare two versions;
//        `floor`: bench/floor.ts in the agent's place, the least a Node gRPC->SSE relay does).
//        --help (this list; a bad flag exits 2 with the flag and the reason)
import { type ChildProcess, execFileSync, type SpawnOptions, spawn } from "node:child_process"
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { cpus, tmpdir } from "node:os"
import * as path from "node:path"
import { parseArgs } from "node:util"
import { createChannel, createClient } from "nice-grpc"
import { Agent, request } from "undici"
import { AgentDefinition, GenerateRequest, type GenerateResponse } from "../src/gen/cgn/agent/v1/agent.ts"
import { parseDuration } from "../src/sim/commandLine.ts"
import { repoRoot, requireDist } from "../test/support/agent.ts"
import { pollUntil } from "../test/support/poll.ts"
import { freePorts } from "../test/support/ports.ts"
import { startSim } from "../test/support/sim.ts"
import { imageAgentEnv, imageNodeFlags, relayArgv } from "./agentArgv.ts"
import { type LeanClient, leanClient } from "./grpc-client.ts"
import { checkNginx, type NginxHandle, startNginx } from "./nginx.ts"

/** `NAME=VALUE ...` words as an environment; a word without `=` is a usage error. */
const envWords = (flag: string, words: string): Record<string, string> =>
  Object.fromEntries(
    words
      .split(" ")
      .filter((w) => w !== "")
      .map((w) => {
        const at = w.indexOf("=")
        if (at < 1) throw new UsageError(`--${flag}: expected NAME=VALUE words; got ${JSON.stringify(w)}`)
        return [w.slice(0, at), w.slice(at + 1)]
      })
  )

/** Resolves once the agent's /readyz answers 200 (bounded: the agent is up in well under a minute). */
const pollReady = (url: string): Promise<void> =>
  pollUntil(`agent ready at ${url}`, async () => (await fetch(url)).status === 200, 60_000).then(() => undefined)

// ---------------------------------------------------------------------------------------------------------
// CPU accounting (Linux /proc; zeros elsewhere)

/** CPU microseconds of a whole process (all threads): the sum of /proc/PID/task/TID/schedstat (ns run time), which
 * is exact where /proc/PID/stat's utime+stime counts 10 ms ticks (too coarse for nginx at one stream). */
const procCpuUs = (pid: number): number => {
  try {
    let ns = 0
    for (const tid of readdirSync(`/proc/${pid}/task`)) {
      try {
        ns += Number(readFileSync(`/proc/${pid}/task/${tid}/schedstat`, "utf8").split(" ")[0])
      } catch {
        // thread gone
      }
    }
    return ns / 1000
  } catch {
    return 0
  }
}

/** CPU microseconds of a process's main thread (schedstat is in ns). */
const procMainUs = (pid: number): number => {
  try {
    return Number(readFileSync(`/proc/${pid}/task/${pid}/schedstat`, "utf8").split(" ")[0]) / 1000
  } catch {
    return 0
  }
}

/** Peak RSS (VmHWM) of a process in KiB. */
const peakRssKb = (pid: number): number => {
  try {
    const m = /VmHWM:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))
    return m === null ? Number.NaN : Number(m[1])
  } catch {
    return Number.NaN
  }
}

/** Resets a process's peak RSS to its current RSS (Linux clear_refs "5"), so VmHWM is the peak of one row.
 * False where that is not allowed: the figure is then the process's lifetime peak. */
const resetPeakRss = (pid: number): boolean => {
  try {
    writeFileSync(`/proc/${pid}/clear_refs`, "5")
    return true
  } catch {
    return false
  }
}

/** Pins a running process, all its threads, to one CPU. */
const pin = (pid: number, cpu: number): void => {
  execFileSync("taskset", ["-a", "-p", "-c", String(cpu), String(pid)], { stdio: "ignore" })
}

// ---------------------------------------------------------------------------------------------------------
// Agent process: the gRPC server with the live EngineClient (its CPU and RSS are read from /proc by the bench).

/** The agent's config: the simulator proxied as an OpenAI-compatible server, ephemeral ports, no etcd. */
const agentConfig = (engineUrl: string, grpcPort: number, adminPort: number): string => `
[agent]
listen_grpc = "127.0.0.1:${grpcPort}"
listen_admin = "127.0.0.1:${adminPort}"
node_id = "bench"
max_tokens_limit = 100000
max_inflight = 4096
log_level = "warn"
state_dir = ${JSON.stringify(path.join(tmpdir(), "cgn-bench-state"))}

[engine]
kind = "openai_compat"
url = "${engineUrl}"

[models.m]
hf_repo = "org/m"
served_name = "m"
`

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
  /** CPU microseconds of the relay under test (nginx or the agent; 0 for direct) during the phase. */
  readonly relayCpuUs: number
  /** The same, the relay's main thread only. */
  readonly relayMainUs: number
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

/** One Generate's sample from its responses, in order: TTFT at the first delta, the agent's own from the final. */
const generateSample = () => {
  const started = performance.now()
  let ttftMs = -1
  let count = 0
  let messages = 0
  let agentTtftMs = Number.NaN
  return {
    take: (r: GenerateResponse): void => {
      if (r.delta !== undefined) {
        if (ttftMs < 0) ttftMs = performance.now() - started
        count += r.delta.tokens
        messages++
      } else if (r.final?.timings !== undefined) agentTtftMs = r.final.timings.timeToFirstTokenMs
    },
    sample: (): Sample => ({ ttftMs, tokens: count, messages, agentTtftMs })
  }
}

/** One Generate through the lean client (bench/grpc-client.ts). */
const viaAgentLean = async (client: LeanClient, tokens: number): Promise<Sample> => {
  const s = generateSample()
  await client.generate(GenerateRequest.fromPartial({ prompt: "bench", sampling: { maxTokens: tokens } }), s.take)
  return s.sample()
}

/** One Generate through nice-grpc (`--grpc-client nice`). */
const viaAgent = async (client: Client, tokens: number): Promise<Sample> => {
  const s = generateSample()
  for await (const r of client.generate({ prompt: "bench", sampling: { maxTokens: tokens } })) s.take(r)
  return s.sample()
}

const phase = async (
  simPid: number,
  relayPid: number | undefined,
  concurrency: number,
  rounds: number,
  one: () => Promise<Sample>
): Promise<PhaseResult> => {
  const ttft: Array<number> = []
  const agentTtft: Array<number> = []
  let tokens = 0
  let messages = 0
  let errors = 0
  const sim0 = procCpuUs(simPid)
  const relay0 = relayPid === undefined ? 0 : procCpuUs(relayPid)
  const relayMain0 = relayPid === undefined ? 0 : procMainUs(relayPid)
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
    simCpuS: (procCpuUs(simPid) - sim0) / 1e6,
    relayCpuUs: relayPid === undefined ? 0 : procCpuUs(relayPid) - relay0,
    relayMainUs: relayPid === undefined ? 0 : procMainUs(relayPid) - relayMain0,
    loadCpuS: (load.user + load.system) / 1e6
  }
}

/** The order the paths run in a level's first block; each later block starts one path further on. */
const pathOrder = ["direct", "nginx", "agent"] as const

/** One path's phases of a level (one per block) as one: samples pooled, CPU, wall time and counts summed. */
const mergePhases = (ps: ReadonlyArray<PhaseResult>): PhaseResult => {
  const sum = (
    k: "tokens" | "messages" | "wallMs" | "errors" | "simCpuS" | "relayCpuUs" | "relayMainUs" | "loadCpuS"
  ) => ps.reduce((acc, p) => acc + p[k], 0)
  return {
    tokens: sum("tokens"),
    messages: sum("messages"),
    wallMs: sum("wallMs"),
    ttft: ps.flatMap((p) => p.ttft),
    agentTtft: ps.flatMap((p) => p.agentTtft),
    errors: sum("errors"),
    simCpuS: sum("simCpuS"),
    relayCpuUs: sum("relayCpuUs"),
    relayMainUs: sum("relayMainUs"),
    loadCpuS: sum("loadCpuS")
  }
}

const pct = (xs: ReadonlyArray<number>, p: number): number => {
  const s = [...xs].sort((a, b) => a - b)
  return s.length === 0 ? Number.NaN : (s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] ?? Number.NaN)
}

const f = (n: number, d = 1) => (Number.isFinite(n) ? n.toFixed(d) : "-")

interface Pins {
  /** The agent and nginx. */
  readonly relay: number
  /** The simulator and the load generator. */
  readonly engine: number
}

interface Options {
  readonly levels: ReadonlyArray<number>
  readonly tokens: number
  readonly rounds: number
  /** Blocks per level: the paths take turns this many times (rotated order), each with its share of the rounds. */
  readonly blocks: number
  readonly minSamples: number
  readonly calls: number
  /** 1-token calls per path at each level before measuring (V8 optimizes the per-call path after thousands). */
  readonly warmupCalls: number
  readonly baseline: Baseline
  readonly grpcClient: "lean" | "nice"
  readonly pins: Pins | undefined
  readonly profileDir: string | undefined
  /** Node flags for the agent process (e.g. V8 heap settings to try). */
  readonly agentNodeFlags: ReadonlyArray<string>
  /** Variables added to the agent process's environment (e.g. glibc allocator settings to try). */
  readonly agentEnv: Readonly<Record<string, string>>
  /** The checkout whose built agent (dist/main.js) runs, another tree's to compare two versions, or "floor". */
  readonly agentRoot: string
}

/**
 * Resolves once the process used under 1% of a core over a quarter second (its compiler and GC threads done with
 * the warm-up's work), or after 10 s: a bound, reported by the idle figure printed next.
 */
const settled = async (pid: number): Promise<void> => {
  for (let i = 0; i < 40; i++) {
    const c0 = procCpuUs(pid)
    await new Promise((r) => setTimeout(r, 250))
    if (procCpuUs(pid) - c0 < 2_500) return
  }
}

/** Requests per stream at `streams`: `--rounds`, or more where that gives fewer than `--min-samples` in all. */
const roundsAt = (streams: number, o: Options): number => Math.max(o.rounds, Math.ceil(o.minSamples / streams))

const rate = (p: PhaseResult) => (p.tokens * 1000) / p.wallMs
const cores = (cpuS: number, wallMs: number) => cpuS / (wallMs / 1000)
/** Cores used on the simulator + load generator CPU during a phase, flagged when that CPU was saturated. */
const engineSide = (p: PhaseResult, pinned: boolean) => {
  const c = cores(p.simCpuS + p.loadCpuS, p.wallMs)
  return `${f(c, 2)}${pinned && c > 0.9 ? "!" : ""}`
}

/** One simulator setting: a fresh simulator, nginx and agent, every concurrency level, one table. */
const runSetting = async (itl: string, o: Options): Promise<void> => {
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
      String(Math.max(...o.levels, 256) * 2)
    ]
  })
  let nginx: NginxHandle | undefined
  let agent: ChildProcess | undefined
  let configDir: string | undefined
  try {
    if (o.pins !== undefined) pin(sim.pid, o.pins.engine)
    nginx = await startNginx(sim.url, o.pins?.relay)
    const profile = o.profileDir === undefined ? [] : ["--cpu-prof", `--cpu-prof-dir=${o.profileDir}`]
    const [grpcPort, adminPort] = await freePorts(2)
    configDir = mkdtempSync(path.join(tmpdir(), "cgn-bench-"))
    const configPath = path.join(configDir, "agent.toml")
    writeFileSync(configPath, agentConfig(sim.url, grpcPort!, adminPort!))
    const agentArgs = [
      ...profile,
      ...o.agentNodeFlags,
      ...relayArgv({
        root: o.agentRoot,
        config: configPath,
        grpcPort: grpcPort!,
        adminPort: adminPort!,
        engineUrl: sim.url
      })
    ]
    // taskset execs node: the child's pid is the agent's.
    const spawnOptions: SpawnOptions = {
      stdio: ["ignore", "inherit", "inherit"],
      env: { ...process.env, ...o.agentEnv }
    }
    const a =
      o.pins === undefined
        ? spawn(process.execPath, agentArgs, spawnOptions)
        : spawn("taskset", ["-c", String(o.pins.relay), process.execPath, ...agentArgs], spawnOptions)
    agent = a
    const agentPid = a.pid ?? -1
    const exited = new Promise<never>((_, reject) =>
      a.once("exit", (code) => reject(new Error(`agent exited (${code})`)))
    )
    await Promise.race([exited, pollReady(`http://127.0.0.1:${adminPort}/readyz`)])
    const address = `127.0.0.1:${grpcPort}`
    const channel = createChannel(address, undefined, { "grpc.max_concurrent_streams": 1024 })
    const client = createClient(AgentDefinition, channel)
    const lean = leanClient(address)
    const direct = directFor(o.baseline)
    const ng = nginx
    const paths = {
      direct: (n: number) => direct(sim.url, n),
      nginx: (n: number) => direct(ng.url, n),
      agent: (n: number) => (o.grpcClient === "lean" ? viaAgentLean(lean, n) : viaAgent(client, n))
    }
    // Warm all paths (JIT, and connections up to the highest level: the direct client and nginx open one engine
    // connection per stream, and a row's first round would otherwise pay their TCP set-up in its TTFT).
    const widest = Math.max(8, ...o.levels)
    for (const one of Object.values(paths)) {
      await phase(sim.pid, undefined, 8, 4, () => one(o.tokens))
      await phase(sim.pid, undefined, widest, 1, () => one(o.tokens))
    }
    // The per-call path to V8's steady state: `--warmup-calls` 1-token calls per path at every measured level
    // (their patterns differ: calls in series reached code that bursts had not), then a bounded wait for the
    // agent's compiler threads to finish what that queued. A daemon in service runs optimized code; right after a
    // short warm-up the rows measured V8 still compiling on the agent's core (docs/bench.md, eighth session).
    for (const c of o.levels)
      for (const one of Object.values(paths))
        await phase(sim.pid, undefined, c, Math.ceil(o.warmupCalls / c), () => one(1))
    await settled(agentPid)
    // The agent's own background CPU (timers, health fibers) over one idle second, to read the rows against.
    const idle0 = procCpuUs(agentPid)
    await new Promise((r) => setTimeout(r, 1000))
    const idleAgentUs = procCpuUs(agentPid) - idle0

    const pinned = o.pins !== undefined
    const rows: Array<Record<string, string>> = []
    const relayPids = { direct: undefined, nginx: ng.pid, agent: agentPid }
    for (const c of o.levels) {
      // The three paths take turns in `--blocks` blocks, the order rotated per block, so a slow spell of the VM
      // falls on all three alike instead of on whichever path ran then; the block's rounds are its share.
      const rounds = Math.ceil(roundsAt(c, o) / o.blocks)
      const runs = {
        direct: [] as Array<PhaseResult>,
        nginx: [] as Array<PhaseResult>,
        agent: [] as Array<PhaseResult>
      }
      const peakKb = { nginx: 0, agent: 0 }
      let peakReset = true
      for (let b = 0; b < o.blocks; b++) {
        for (let i = 0; i < 3; i++) {
          const which = pathOrder[(b + i) % 3]!
          const pid = relayPids[which]
          if (pid !== undefined) peakReset = resetPeakRss(pid) && peakReset
          runs[which].push(await phase(sim.pid, pid, c, rounds, () => paths[which](o.tokens)))
          if (which !== "direct") peakKb[which] = Math.max(peakKb[which], peakRssKb(relayPids[which]))
        }
      }
      const d = mergePhases(runs.direct)
      const n = mergePhases(runs.nginx)
      const ag = mergePhases(runs.agent)
      const nRss = peakKb.nginx
      const aRss = peakKb.agent
      const p50 = (x: PhaseResult) => pct(x.ttft, 50)
      // What each relay adds to direct's TTFT p50 within each block: the spread says how far the pooled figure
      // can be trusted on this VM.
      const addedPerBlock = (x: ReadonlyArray<PhaseResult>) => {
        const added = x.map((p, i) => p50(p) - p50(runs.direct[i]!))
        return `${f(Math.min(...added), 1)}..${f(Math.max(...added), 1)}`
      }
      rows.push({
        streams: String(c),
        "direct tok/s": f(rate(d), 0),
        "nginx / agent tok/s": `${f(rate(n), 0)} / ${f(rate(ag), 0)}`,
        "vs direct nginx / agent": `${f(rate(n) / rate(d), 3)} / ${f(rate(ag) / rate(d), 3)}`,
        "TTFT p50 ms direct / nginx / agent": `${f(p50(d), 2)} / ${f(p50(n), 2)} / ${f(p50(ag), 2)}`,
        "added TTFT p50 ms nginx / agent (agent's own)": `${f(p50(n) - p50(d), 2)} / ${f(p50(ag) - p50(d), 2)} (${f(pct(ag.agentTtft, 50), 2)})`,
        "added TTFT p50 ms per block nginx / agent": `${addedPerBlock(runs.nginx)} / ${addedPerBlock(runs.agent)}`,
        "agent TTFT p99 ms": f(pct(ag.ttft, 99), 1),
        "CPU µs/tok nginx / agent (agent main)": `${f(n.relayCpuUs / n.tokens, 1)} / ${f(ag.relayCpuUs / ag.tokens, 1)} (${f(ag.relayMainUs / ag.tokens, 1)})`,
        "cores nginx / agent": `${f(cores(n.relayCpuUs / 1e6, n.wallMs), 2)} / ${f(cores(ag.relayCpuUs / 1e6, ag.wallMs), 2)}`,
        [`peak RSS MiB nginx / agent${peakReset ? "" : " (lifetime)"}`]: `${f(nRss / 1024, 1)} / ${f(aRss / 1024, 0)}`,
        "sim+loadgen cores direct/nginx/agent": `${engineSide(d, pinned)}/${engineSide(n, pinned)}/${engineSide(ag, pinned)}`,
        "tok/gRPC msg": f(ag.tokens / Math.max(1, ag.messages), 2),
        "errors d/n/a": `${d.errors}/${n.errors}/${ag.errors}`
      })
    }
    // Per-call cost: 1-token requests, one after another and all started together.
    const perCall = async (path: "nginx" | "agent", pid: number) => {
      const seq = await phase(sim.pid, pid, 1, o.calls, () => paths[path](1))
      const conc = await phase(sim.pid, pid, o.calls, 1, () => paths[path](1))
      const calls = (x: PhaseResult) => x.ttft.length
      return {
        seq: seq.relayCpuUs / calls(seq),
        seqMain: seq.relayMainUs / calls(seq),
        seqWallMs: seq.wallMs / calls(seq),
        conc: conc.relayCpuUs / calls(conc),
        concMain: conc.relayMainUs / calls(conc),
        errors: seq.errors + conc.errors,
        concMs: conc.wallMs
      }
    }
    const pcN = await perCall("nginx", ng.pid)
    const pcA = await perCall("agent", agentPid)
    channel.close()
    lean.close()
    const keys = Object.keys(rows[0] ?? {})
    const agentEnvShown = Object.entries(o.agentEnv)
      .map(([k, v]) => `${k}=${v} `)
      .join("")
    console.log(
      `\nrelay benchmark (agent: ${agentEnvShown}${o.agentRoot === "floor" ? "bench/floor.ts" : path.join(o.agentRoot, "dist/main.js")} ${o.agentNodeFlags.join(" ")}): sim ITL ${itl}, ${o.tokens} tokens/request, ${o.rounds} requests per stream (at least ${o.minSamples} per row) over ${o.blocks} blocks (paths in turn, rotated; rounds per block rounded up), ${o.warmupCalls} warm-up calls per path and level, direct client ${o.baseline}, gRPC client ${o.grpcClient}, ${cpus().length} cores, ` +
        `${pinned ? `agent+nginx on CPU ${o.pins?.relay}, sim+loadgen on CPU ${o.pins?.engine}` : "not pinned"}; agent idle ${f(idleAgentUs / 1000, 1)} ms CPU/s` +
        `${pinned ? "; ! = the sim+loadgen CPU was saturated" : ""}`
    )
    console.log(`| ${keys.join(" | ")} |`)
    console.log(`|${keys.map(() => "---").join("|")}|`)
    for (const r of rows) console.log(`| ${keys.map((k) => r[k]).join(" | ")} |`)
    console.log(
      `per call (1-token requests, ${o.calls} sequential / ${o.calls} started together): ` +
        `agent ${f(pcA.seq, 0)} / ${f(pcA.conc, 0)} µs CPU per call (main thread ${f(pcA.seqMain, 0)} / ${f(pcA.concMain, 0)}), ` +
        `nginx ${f(pcN.seq, 0)} / ${f(pcN.conc, 0)} µs; sequential calls took ${f(pcA.seqWallMs, 2)} ms each via agent, ${f(pcN.seqWallMs, 2)} via nginx; ` +
        `${o.calls} together took ${f(pcA.concMs, 0)} ms via agent, ${f(pcN.concMs, 0)} ms via nginx; errors ${pcN.errors}/${pcA.errors}`
    )
  } finally {
    // The agent drains on SIGTERM (no streams are left) and exits.
    try {
      if (agent !== undefined && agent.exitCode === null) {
        const a = agent
        a.kill("SIGTERM")
        await new Promise<void>((resolve) => {
          if (a.exitCode !== null) resolve()
          else a.once("exit", () => resolve())
        })
      }
    } finally {
      try {
        await nginx?.stop()
      } finally {
        await sim.stop()
        if (configDir !== undefined) rmSync(configDir, { recursive: true, force: true })
      }
    }
  }
}

/** A bad flag: reported in one line with exit 2, as the daemon reports a bad config. */
class UsageError extends Error {}

/** The flags part of this file's header comment: `--help` prints it, so it cannot drift from the code. */
const usage = (): string => {
  const lines = readFileSync(new URL(import.meta.url), "utf8").split("\n")
  const from = lines.findIndex((l) => l.startsWith("// Flags:"))
  const to = lines.findIndex((l) => l.startsWith("import "))
  return ["usage: npm run bench -- [flags]  (or node bench/relay.ts [flags])", ...lines.slice(from, to)]
    .map((l) => l.replace(/^\/\/ ?/, ""))
    .join("\n")
}

const wholeNumber = (flag: string, value: string, min: number): number => {
  const n = Number(value)
  if (value.trim() === "" || !Number.isInteger(n) || n < min)
    throw new UsageError(`--${flag}: expected a whole number >= ${min}; got ${JSON.stringify(value)}`)
  return n
}

const runBench = async (): Promise<void> => {
  let values: ReturnType<typeof parseFlags>["values"]
  try {
    values = parseFlags().values
  } catch (e) {
    throw new UsageError(e instanceof Error ? e.message : String(e))
  }
  if (values.help === true) {
    console.log(usage())
    return
  }
  requireDist()
  const b = values.direct
  if (b !== "scan" && b !== "parse") throw new UsageError(`--direct: expected scan or parse; got ${b}`)
  const grpcClient = values["grpc-client"]
  if (grpcClient !== "lean" && grpcClient !== "nice")
    throw new UsageError(`--grpc-client: expected lean or nice; got ${grpcClient}`)
  let pins: Pins | undefined
  if (values.pin !== "none") {
    const [relay, engine] = values.pin.split(",").map(Number)
    if (relay === undefined || engine === undefined || !Number.isInteger(relay) || !Number.isInteger(engine))
      throw new UsageError(`--pin: expected RELAY_CPU,ENGINE_CPU (e.g. 0,1) or none; got ${values.pin}`)
    pins = { relay, engine }
  }
  const levels = values.concurrency.split(",").map((c) => wholeNumber("concurrency", c, 1))
  const itls = values.itl.split(",")
  for (const itl of itls) {
    try {
      parseDuration(itl)
    } catch (e) {
      throw new UsageError(`--itl: ${e instanceof Error ? e.message : String(e)} (e.g. 5ms,0ms)`)
    }
  }
  const o: Options = {
    levels,
    tokens: wholeNumber("tokens", values.tokens, 1),
    rounds: wholeNumber("rounds", values.rounds, 1),
    blocks: wholeNumber("blocks", values.blocks, 1),
    minSamples: wholeNumber("min-samples", values["min-samples"], 1),
    calls: wholeNumber("calls", values.calls, 1),
    warmupCalls: wholeNumber("warmup-calls", values["warmup-calls"], 0),
    baseline: b,
    grpcClient,
    pins,
    profileDir: values.profile,
    agentNodeFlags: values["agent-node-flags"].split(" ").filter((f) => f !== ""),
    agentEnv: envWords("agent-env", values["agent-env"]),
    agentRoot: values["agent-root"] === "floor" ? "floor" : path.resolve(values["agent-root"])
  }
  console.log(checkNginx())
  // The load generator (this process, all its threads) shares the engine-side CPU with the simulator.
  if (pins !== undefined) pin(process.pid, pins.engine)
  for (const itl of itls) await runSetting(itl, o)
  await pool.close()
}

const parseFlags = () =>
  parseArgs({
    options: {
      help: { type: "boolean", short: "h" },
      concurrency: { type: "string", default: "1,64,256" },
      tokens: { type: "string", default: "128" },
      rounds: { type: "string", default: "4" },
      blocks: { type: "string", default: "3" },
      "min-samples": { type: "string", default: "32" },
      itl: { type: "string", default: "5ms,0ms" },
      direct: { type: "string", default: "scan" },
      "grpc-client": { type: "string", default: "lean" },
      calls: { type: "string", default: "200" },
      "warmup-calls": { type: "string", default: "3000" },
      pin: { type: "string", default: "0,1" },
      profile: { type: "string" },
      "agent-node-flags": { type: "string", default: imageNodeFlags().join(" ") },
      "agent-env": {
        type: "string",
        default: Object.entries(imageAgentEnv())
          .map(([k, v]) => `${k}=${v}`)
          .join(" ")
      },
      "agent-root": { type: "string", default: repoRoot }
    }
  })

try {
  await runBench()
} catch (e) {
  if (!(e instanceof UsageError)) throw e
  console.error(`bench/relay.ts: ${e.message} (--help lists the flags)`)
  process.exit(2)
}
