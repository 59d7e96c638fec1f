#!/usr/bin/env node
// cgn-engine-sim: an engine-shaped process for tests and laptops (vLLM, SGLang, llama.cpp, mlx flavors).
// Parses the engine's own command line plus --sim-* knobs, then reproduces the engine's startup (vLLM and SGLang
// listen only once "loaded", SGLang then warming up; the others listen at once and report loading), serves the OpenAI API, and applies the
// fault switches. Logs JSON lines on stderr (its warnings and errors in the engine's own format, sim/leveledLine.ts); `{"msg":"listening"}` marks the HTTP server being up.
import { spawn } from "node:child_process"
import { readFileSync } from "node:fs"
import * as http from "node:http"
import { KEYLESS_FLAGS, loadApiKeys } from "../sim/apiKey.ts"
import { unknownFlagsRefusal } from "../sim/argRefusal.ts"
import { parseArgs } from "../sim/args.ts"
import { LLAMA_MAX_REQUESTS, makeContext } from "../sim/context.ts"
import { startVllmWatchdog } from "../sim/engineDeath.ts"
import { framed, keepAliveOptions } from "../sim/keepAlive.ts"
import { KvPublisher, kvEventsSettings } from "../sim/kvpublisher.ts"
import { leveledLine } from "../sim/leveledLine.ts"
import { llamaModelFileFault } from "../sim/modelFile.ts"
import { handler } from "../sim/server.ts"
import { ArgsError, type Flavor, type SimConfig } from "../sim/simConfig.ts"
import { llamaDeath, llamaLoadDeath, type StartDeath, type StartFailure, startDeath } from "../sim/startFailures.ts"
import { VERSION } from "../version.ts"

const USAGE = `cgn-engine-sim ${VERSION}: an engine-shaped process for tests and laptops (no GPU, no weights).

Usage: cgn-engine-sim [--flavor vllm|sglang|llama_cpp|mlx] ENGINE-ARGS... [--sim-KNOB VALUE]...

ENGINE-ARGS are the engine's own command line, as cgn-agent renders it (see \`cgn-agent render\`), e.g.
  cgn-engine-sim --flavor vllm serve Qwen/Qwen2.5-0.5B-Instruct --host 127.0.0.1 --port 8000
Knobs: --sim-mode echo|random, --sim-seed N, --sim-ttft DUR, --sim-itl DUR, --sim-max-seqs N,
  --sim-startup-delay DUR, --sim-warmup DUR (SGLang), --sim-block-size N, --sim-kv-blocks N,
  --sim-default-max-tokens N,
  --sim-error-rate X, --sim-error-kind KIND, --sim-crash-after DUR, --sim-crash-after-requests N,
  --sim-stall-after-tokens N, --sim-crash-at-start CAUSE, --sim-ignore-sigterm, --sim-fork-grandchild,
  --sim-hang-health, --sim-strict-args, --sim-sigterm-waits-streams, ...
  (src/sim/args.ts lists them all). Logs JSON lines on stderr; its warnings and errors in the engine's own format.
`

/** The engine the simulator stands in for, once its arguments are read: its warnings and errors in its own format. */
let flavor: Flavor | undefined

const log = (msg: string, fields: Record<string, unknown> = {}): void => {
  const { level, ...rest } = fields
  if (flavor !== undefined && (level === "warning" || level === "error")) {
    process.stderr.write(`${leveledLine(flavor, level, msg, rest, new Date(), performance.now() * 1000)}\n`)
    return
  }
  process.stderr.write(
    `${JSON.stringify({ ts: new Date().toISOString(), msg, ...fields }, (_k, v) => (typeof v === "bigint" ? v.toString() : v))}\n`
  )
}

const exit = (code: number, reason: string): never => {
  log("exit", { code, reason })
  process.exit(code)
}

// The grandchild reports on stdout once its SIGTERM disposition is set, so `grandchild pid=N` is only
// logged when a signal sent to the group can no longer race its startup.
const forkGrandchild = (cfg: SimConfig): Promise<number | null> => {
  const ignore = cfg.ignoreSigterm ? "process.on('SIGTERM',()=>{});" : ""
  const code = `${ignore}process.stdout.write('ready\\n');setInterval(()=>{},2147483647)`
  const child = spawn(process.execPath, ["-e", code], { stdio: ["ignore", "pipe", "ignore"], detached: false })
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer)
      child.stdout?.destroy()
      child.unref()
      const pid = child.pid ?? null
      log(`grandchild pid=${pid}`, { grandchildPid: pid })
      resolve(pid)
    }
    const timer = setTimeout(done, 5_000)
    child.stdout?.once("data", done)
  })
}

// --sim-crash-at-start: the engine's own last lines, each on the stream the engine prints it on, then the engine's
// own end (sim/startFailures.ts). Writes to pipes are synchronous on Linux, so nothing is lost to the exit.
const crashAtStart = async (cfg: SimConfig, cause: StartFailure): Promise<void> => {
  await new Promise((resolve) => setTimeout(resolve, cfg.startupDelayMs))
  log("crash at start", { cause })
  const now = new Date()
  die(
    startDeath(cfg.flavor, cause, {
      model: cfg.model,
      maxModelLen: cfg.maxModelLen,
      pid: process.pid,
      now,
      fit: cfg.llamaFit
    })
  )
}

/** The engine's last lines, each on its stream, then its own end. */
const die = (death: StartDeath): void => {
  for (const l of death.lines) (l.stream === "stdout" ? process.stdout : process.stderr).write(`${l.text}\n`)
  if ("signal" in death.exit) process.kill(process.pid, death.exit.signal)
  else process.exit(death.exit.code)
}

const main = async (): Promise<void> => {
  // As the engines' own CLIs (argparse): --help and --version answer and exit, whatever else is given.
  const argv = process.argv.slice(2)
  if (argv.includes("--help") || argv.includes("-h")) {
    process.stdout.write(USAGE)
    return
  }
  if (argv.includes("--version")) {
    process.stdout.write(`${VERSION}\n`)
    return
  }
  let cfg: SimConfig
  try {
    cfg = parseArgs(process.argv.slice(2), process.env)
  } catch (err) {
    if (err instanceof ArgsError) {
      log("bad arguments", { error: err.message })
      process.exit(2)
    }
    throw err
  }
  flavor = cfg.flavor
  log("starting", {
    flavor: cfg.flavor,
    model: cfg.model,
    servedName: cfg.servedName,
    pid: process.pid,
    maxSeqs: cfg.maxSeqs,
    mode: cfg.mode
  })
  // a flag the engine does not know in any version (mlx-lm's --api-key) is refused even without --sim-strict-args
  const keyless = KEYLESS_FLAGS[cfg.flavor]
  const refused = cfg.strictArgs ? cfg.unmodelled : cfg.unmodelled.filter((f) => keyless.has(f))
  if (refused.length > 0) return die(unknownFlagsRefusal(cfg.flavor, refused))
  if (cfg.unmodelled.length > 0) log("unmodelled flags (accepted, ignored)", { flags: cfg.unmodelled })
  // the engines read their key files while parsing their command line, before anything else
  const keys = loadApiKeys(cfg.apiKeySources, (file) => {
    try {
      return readFileSync(file, "utf8")
    } catch {
      return undefined
    }
  })
  if ("exit" in keys) return die(keys)
  cfg = { ...cfg, apiKeys: keys }
  if (cfg.crashAtStart !== undefined) return crashAtStart(cfg, cfg.crashAtStart)

  const ctx = makeContext(cfg, log, (reason) => exit(1, reason), process.env)
  if (cfg.forkGrandchild) ctx.grandchildPid = await forkGrandchild(cfg)

  const hung = new Set<http.ServerResponse>()
  const llama = cfg.flavor === "llama_cpp"
  // each engine's idle-connection timeout and connection headers (sim/keepAlive.ts)
  const server = http.createServer(keepAliveOptions(cfg.flavor, process.env), framed(cfg.flavor, handler(ctx, hung)))
  server.maxHeadersCount = 200
  if (llama) server.maxRequestsPerSocket = LLAMA_MAX_REQUESTS

  // Signals as the engines take them: the first SIGTERM/SIGINT starts a graceful shutdown, which takes a moment
  // (workers joined, memory freed: --sim-shutdown-delay); a second one during it means "exit now". llama-server:
  // tools/server/server.cpp `signal_handler` (is_terminating) prints "Received second interrupt, terminating
  // immediately." and exits 1; uvicorn (vLLM, SGLang) `Server.handle_exit` sets `force_exit` likewise. A
  // supervisor that signals twice therefore shows up as exit code 1 and that line.
  let shuttingDown = false
  const shutdown = (signal: NodeJS.Signals) => {
    if (signal === "SIGTERM" && cfg.ignoreSigterm) return log("ignoring SIGTERM")
    // llama-server sets its handler only once its model has loaded (tools/server/server.cpp: load_model, then
    // sigaction): a signal during the load ends it by that signal's default action
    if (llama && !ctx.loaded) {
      process.off("SIGTERM", onSigterm)
      process.off("SIGINT", onSigint)
      process.kill(process.pid, signal)
      return
    }
    if (shuttingDown) {
      log("Received second interrupt, terminating immediately.", { signal })
      process.exit(1)
    }
    shuttingDown = true
    log("shutting down", { signal })
    ctx.publisher?.close()
    ctx.sideChannel?.close()
    ctx.bootstrap?.close()
    const down = () => {
      log("shut down", { signal })
      process.exit(0)
    }
    // its shutdown_handler ends the task loop, then clean_up (tools/server/server.cpp) logs this and stops the listener
    if (llama) process.stderr.write("I srv    operator(): operator(): cleaning up before exit...\n")
    if (cfg.sigtermWaitsStreams) {
      // llama-server's shutdown waiting on a busy slot (ggml-org/llama.cpp#18237), its flavor's default: measured on
      // the real server (node-llama-cpp 3.21.1's llama.cpp, test/real/sim-differential-12.test.ts) the listener
      // closes, the streams in flight get nothing more (its task loop stopped), and the process exits 0 once their
      // clients have left, or after 30 s. The real one races: in some runs the listener stays open too and only a
      // second signal ends it (exit 1), in some the streams' connections are cut and it exits 0 at once; the
      // simulator takes the common way
      ctx.core.wedge(undefined)
      server.close(() => setTimeout(down, cfg.shutdownDelayMs))
      setTimeout(down, 30_000).unref()
      return
    }
    server.close()
    server.closeAllConnections()
    setTimeout(down, cfg.shutdownDelayMs)
  }
  const onSigterm = () => shutdown("SIGTERM")
  const onSigint = () => shutdown("SIGINT")
  process.on("SIGTERM", onSigterm)
  process.on("SIGINT", onSigint)
  if (cfg.crashAfterMs !== undefined) setTimeout(() => exit(1, `crash after ${cfg.crashAfterMs} ms`), cfg.crashAfterMs)

  if (ctx.sideChannel !== undefined) {
    await ctx.sideChannel.start(ctx.sideChannelHost, ctx.sideChannelPort)
    log("kv side channel", { host: ctx.sideChannelHost, port: ctx.sideChannelPort, engineId: ctx.engineId })
  }
  if (ctx.bootstrap !== undefined) {
    await ctx.bootstrap.start(cfg.host, cfg.bootstrapPort)
    log("bootstrap server", { host: cfg.host, port: cfg.bootstrapPort })
  }

  const load = async () => {
    const settings = kvEventsSettings(cfg.flavor, cfg.kvEventsConfig)
    if (settings !== undefined) {
      const pub = new KvPublisher({
        settings,
        flavor: cfg.flavor,
        legacy: cfg.kvLegacyArrays,
        replay3Frames: cfg.kvReplay3Frames,
        dp: cfg.dataParallel,
        stopAfter: cfg.kvStopAfter,
        skipSeq: cfg.kvSkipSeq,
        log
      })
      await pub.start()
      ctx.publisher = pub
      // SGLang's radix cache resets itself at start, which records an AllBlocksCleared its first publish sends
      // (python/sglang/srt/mem_cache/radix_cache.py RadixCache.__init__ -> reset): its seq 0. vLLM queues one
      // only on a prefix-cache reset (vllm/v1/core/block_pool.py reset_prefix_cache): its seq 0 is the first
      // request's BlockStored.
      if (cfg.flavor === "sglang") pub.publishAll([ctx.kv.clear()])
    }
    ctx.loaded = true
    log("model loaded", { flavor: cfg.flavor })
  }
  const listen = () =>
    new Promise<void>((resolve, reject) => {
      server.once("error", reject)
      server.listen(cfg.port, cfg.host, () => {
        server.off("error", reject)
        const addr = server.address()
        log("listening", {
          port: typeof addr === "object" && addr !== null ? addr.port : cfg.port,
          host: cfg.host,
          flavor: cfg.flavor,
          pid: process.pid
        })
        resolve()
      })
    })
  const delay = () => new Promise<void>((r) => setTimeout(r, cfg.startupDelayMs))

  if (cfg.flavor === "vllm") {
    await delay()
    await load()
    await listen()
    startVllmWatchdog(ctx, server, process.env, exit)
  } else if (cfg.flavor === "sglang") {
    // The model loads before the HTTP server starts; then /health is 503 while the warm-up request runs, and the
    // API takes requests, which wait for it (python/sglang/srt/entrypoints/http_server.py launch_server)
    await delay()
    const warming = new Promise<void>((r) => setTimeout(r, cfg.warmupMs)).then(load)
    ctx.whenLoaded = warming
    await listen()
    await warming
  } else {
    const loading = delay().then(load)
    ctx.whenLoaded = loading
    await listen().catch((e: unknown) => {
      if (!llama) throw e
      // cpp-httplib's bind failed, whatever the cause (tools/server/server-http.cpp start; server.cpp clean_up)
      return die(
        llamaDeath([
          `E srv         start: couldn't bind HTTP server socket, hostname: ${cfg.host}, port: ${cfg.port}`,
          "I srv    operator(): operator(): cleaning up before exit...",
          "E srv  llama_server: exiting due to HTTP server error"
        ])
      )
    })
    // llama-server listens, then loads the -m file: one it cannot load ends it (modelFile.ts)
    const fault = llama && cfg.llamaModelFile !== undefined ? llamaModelFileFault(cfg.llamaModelFile) : undefined
    if (fault !== undefined) return die(llamaLoadDeath(cfg.model, fault, cfg.llamaFit))
    await loading
  }
}

main().catch((err: unknown) => exit(1, `fatal: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`))
