// The real llama-server for the real-engine suites: built (or found in the cache) by
// `scripts/real-engine-build.mjs`, a tiny model written at test time, an agent config that runs it, and a
// few readers of llama-server's own endpoints. Never skips: without the binary and no toolchain to build it,
// the build script's error fails the suite.
import { type ChildProcess, execFileSync, spawn } from "node:child_process"
import * as fs from "node:fs"
import * as path from "node:path"
import { Agent as UndiciAgent, type RequestInit as UndiciInit, fetch as undiciFetch } from "undici"
import { parsePromText } from "../../src/services/engine/PromText.ts"
import { repoRoot } from "../support/agent.ts"
import { type TinyVariant, writeTinyLlama } from "../support/ggufModel.ts"
import { pollUntil } from "../support/poll.ts"
import { freePorts } from "../support/ports.ts"

export interface RealEngine {
  /** The llama-server executable. */
  readonly server: string
  /** llama.cpp's vocab-only llama SentencePiece GGUF, the tokenizer the tiny model copies. */
  readonly vocab: string
}

/**
 * Runs the build script (a cached build returns in well under a second; `npm test` builds before vitest)
 * and takes the cache folder from its last stdout line.
 */
export const realEngine = (): RealEngine => {
  const out = execFileSync(process.execPath, [path.join(repoRoot, "scripts/real-engine-build.mjs")], {
    encoding: "utf8",
    stdio: ["ignore", "pipe", "inherit"],
    timeout: 30 * 60_000
  })
  const dir = out.trim().split("\n").pop() ?? ""
  const engine = { server: path.join(dir, "bin", "llama-server"), vocab: path.join(dir, "ggml-vocab-llama-spm.gguf") }
  for (const f of [engine.server, engine.vocab]) {
    if (!fs.existsSync(f)) throw new Error(`${f} is missing after \`npm run real-engine:build\``)
  }
  return engine
}

/** Writes the tiny model variant into `dir` and returns its path. */
export const tinyModel = (engine: RealEngine, dir: string, variant: TinyVariant): string => {
  const file = path.join(dir, `tiny-${variant}.gguf`)
  if (!fs.existsSync(file)) writeTinyLlama(engine.vocab, file, variant)
  return file
}

/** llama-server's knobs for the tests: one CPU thread (the machine is shared), no warm-up run. */
export const SERVER_ARGS: ReadonlyArray<string> = ["--threads", "1", "--threads-batch", "1", "--no-warmup"]

export interface LlamaAgentOptions {
  readonly engine: RealEngine
  readonly model: string
  /** `-c`: the context across all slots. */
  readonly contextSize?: number
  /** `-np`: llama-server's slots. */
  readonly slots?: number
  readonly etcd?: ReadonlyArray<string>
  readonly etcdPrefix?: string
  readonly nodeId?: string
  readonly agent?: Record<string, unknown>
  readonly engineSection?: Record<string, unknown>
}

export interface LlamaAgentConfig {
  readonly config: Record<string, unknown>
  readonly enginePort: number
  readonly engineUrl: string
}

/** An agent config that spawns the real llama-server (`kind = "llama_cpp"`) on ephemeral loopback ports. */
export const llamaAgentConfig = async (o: LlamaAgentOptions): Promise<LlamaAgentConfig> => {
  const [grpcPort, adminPort, enginePort] = (await freePorts(3)) as [number, number, number]
  const engineUrl = `http://127.0.0.1:${enginePort}`
  const config = {
    cluster: { name: "real", etcd: [...(o.etcd ?? [])], etcd_prefix: o.etcdPrefix ?? "/cgn" },
    agent: {
      listen_grpc: `127.0.0.1:${grpcPort}`,
      listen_admin: `127.0.0.1:${adminPort}`,
      node_id: o.nodeId ?? "real-1",
      state_dir: "state",
      log_level: "info",
      heartbeat: "300ms",
      lease_ttl: "3s",
      ...o.agent
    },
    engine: {
      kind: "llama_cpp",
      url: engineUrl,
      command: [o.engine.server],
      args: [...SERVER_ARGS, "-np", String(o.slots ?? 2)],
      startup_timeout: "60s",
      stop_grace: "10s",
      ...o.engineSection
    },
    models: { tiny: { path: o.model, max_model_len: o.contextSize ?? 2048 } }
  }
  return { config, enginePort, engineUrl }
}

/** The pids of llama-server processes listening on `port` (found by command line: only ours use it). */
export const serverPids = (port: number): Array<number> => {
  const out: Array<number> = []
  for (const entry of fs.readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue
    try {
      const argv = fs.readFileSync(`/proc/${entry}/cmdline`, "utf8").split("\0")
      const stat = fs.readFileSync(`/proc/${entry}/stat`, "utf8")
      const zombie = stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) === "Z"
      const p = argv.indexOf("--port")
      if (!zombie && argv[0]?.endsWith("llama-server") && p >= 0 && argv[p + 1] === String(port)) {
        out.push(Number(entry))
      }
    } catch {
      // gone meanwhile
    }
  }
  return out
}

/** One value of llama-server's /metrics (unlabelled series). */
export const engineMetric = async (engineUrl: string, name: string): Promise<number> => {
  const text = await (await fetch(`${engineUrl}/metrics`)).text()
  const s = parsePromText(text).find((x) => x.name === name)
  if (s === undefined) throw new Error(`${name} not in llama-server's /metrics`)
  return s.value
}

/**
 * One request on a connection of its own: llama-server closes a streamed answer's connection after its last chunk
 * though its headers say keep-alive, and the next request a shared pool sent on it failed (UND_ERR_SOCKET, seen in
 * loaded runs; the agent asks llama-server for no keep-alive on streams for the same reason).
 */
export const requestOnOwnConnection = async (url: string, init: UndiciInit = {}) => {
  const dispatcher = new UndiciAgent()
  try {
    const res = await undiciFetch(url, { ...init, dispatcher })
    return { status: res.status, text: await res.text() }
  } finally {
    await dispatcher.close()
  }
}

/** A JSON POST on a connection of its own (requestOnOwnConnection). */
export const postOnOwnConnection = (base: string, p: string, body: unknown) =>
  requestOnOwnConnection(`${base}${p}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body)
  })

/**
 * A llama-server of the test's own (as someone else's, for openai_compat), serving `model` as "tiny" on a free
 * loopback port with SERVER_ARGS and `extraArgs`; resolves once its /health answers 200. The caller kills it.
 */
export const startLlamaServer = async (
  engine: RealEngine,
  model: string,
  extraArgs: ReadonlyArray<string> = []
): Promise<{ readonly url: string; readonly process: ChildProcess }> => {
  const [port] = (await freePorts(1)) as [number]
  const url = `http://127.0.0.1:${port}`
  const args = ["-m", model, "-a", "tiny", "--host", "127.0.0.1", "--port", String(port), ...SERVER_ARGS, ...extraArgs]
  const child = spawn(engine.server, args, { stdio: "ignore" })
  await pollUntil(
    "llama-server up",
    async () =>
      (await fetch(`${url}/health`)
        .then((r) => r.status)
        .catch(() => 0)) === 200,
    60_000
  )
  return { url, process: child }
}
