/**
 * Test harness: the agent as a child process, started the way users start it (`node dist/main.js run
 * --config F`), with its TOML in a temp dir. Keeps its stderr JSON lines, awaits readiness by polling
 * GET /readyz with a bound, and tracks every agent (and the engine pids its log names) so that
 * `killAllAgents()` in afterEach/afterAll leaves nothing running even when a test fails half-way.
 */
import { type ChildProcess, spawn } from "node:child_process"
import * as fs from "node:fs"
import * as fsp from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import { parse as parseToml, stringify as stringifyToml } from "smol-toml"
import { followLines } from "./lines.ts"
import { pollUntil } from "./poll.ts"
import { freePorts } from "./ports.ts"

export const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..")
export const agentEntry = path.join(repoRoot, "dist/main.js")
export const simDistEntry = path.join(repoRoot, "dist/programs/sim.js")

/** Throws a clear message when dist/ was not built (`npm test` builds before vitest). */
export const requireDist = (): void => {
  for (const f of [agentEntry, simDistEntry]) {
    if (!fs.existsSync(f)) throw new Error(`${path.relative(repoRoot, f)} is missing: run \`npm run build\` first`)
  }
}

export interface AgentExit {
  readonly code: number | null
  readonly signal: NodeJS.Signals | null
}

export interface StartAgentOptions {
  /** The config as a TOML string or as an object (written out as TOML). */
  readonly config: Record<string, unknown> | string
  readonly env?: Record<string, string>
  /** Extra command-line arguments after `run --config F` (e.g. `--log-level debug`). */
  readonly args?: ReadonlyArray<string>
  /** Poll /readyz until 200 (default true); false returns as soon as the process is spawned. */
  readonly awaitReady?: boolean
  /** Readiness bound, default 20 s. */
  readonly readyTimeoutMs?: number
  /**
   * A command that runs the agent's command line after it (it must exec it, so the pid is the agent's): e.g. a shell
   * that enters a cgroup first (support/memoryCgroup.ts `enter`).
   */
  readonly launcher?: ReadonlyArray<string>
}

export interface AgentHandle {
  readonly pid: number
  readonly dir: string
  readonly configPath: string
  /** `http://host:port` of [agent].listen_admin. */
  readonly adminUrl: string
  /** `host:port` of [agent].listen_grpc. */
  readonly grpcAddress: string
  /** Every stderr line so far. */
  readonly stderrLines: Array<string>
  /** Every stdout line so far (the agent writes none; the log-shape test checks that). */
  readonly stdoutLines: Array<string>
  /** The stderr lines that parse as JSON (the agent's log events). */
  readonly logs: () => Array<Record<string, unknown>>
  /** Resolves with the first stderr line (existing or future) matching `pred`; rejects after `timeoutMs`. */
  waitForLine(pred: (line: string) => boolean, timeoutMs?: number): Promise<string>
  /** Resolves with the exit of the agent process. */
  readonly exited: Promise<AgentExit>
  /** Sends `signal` (default SIGTERM) to the agent and waits for it to exit, SIGKILL after `timeoutMs`. */
  stop(signal?: NodeJS.Signals, timeoutMs?: number): Promise<AgentExit>
  /** The last stderr lines, for failure messages. */
  readonly tail: (n?: number) => string
}

interface Tracked {
  readonly proc: ChildProcess
  readonly exited: Promise<AgentExit>
  readonly enginePids: Set<number>
  readonly dir: string
}
const live = new Set<Tracked>()
process.once("exit", () => {
  for (const t of live) {
    t.proc.kill("SIGKILL")
    for (const pid of t.enginePids) killQuietly(pid, "SIGKILL")
  }
})

const killQuietly = (pid: number, signal: NodeJS.Signals): void => {
  try {
    process.kill(pid, signal)
  } catch {
    // already gone
  }
}

/** True while `pid` is a process that is not a zombie. */
export const processAlive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
  } catch {
    return false
  }
  try {
    // `pid (comm) S ...`: a zombie has exited; only its parent has not reaped it yet.
    const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8")
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z"
  } catch {
    return false
  }
}

const pidsInLine = (line: string): Array<number> => {
  const out: Array<number> = []
  for (const m of line.matchAll(/\\?"(?:pid|grandchildPid)\\?":(\d+)/g)) out.push(Number(m[1]))
  return out
}

/** SIGKILLs every agent still running and the engine pids their logs named, and removes their temp dirs. */
export const killAllAgents = async (): Promise<void> => {
  const all = [...live]
  live.clear()
  await Promise.all(
    all.map(async (t) => {
      if (t.proc.exitCode === null && t.proc.signalCode === null) t.proc.kill("SIGKILL")
      await t.exited
      for (const pid of t.enginePids) if (processAlive(pid)) killQuietly(pid, "SIGKILL")
      await fsp.rm(t.dir, { recursive: true, force: true })
    })
  )
}

const agentSection = (config: Record<string, unknown>): Record<string, unknown> => {
  const a = config.agent
  return typeof a === "object" && a !== null ? (a as Record<string, unknown>) : {}
}

/** Writes the config, spawns the agent and (by default) awaits /readyz. Kills it if it never gets ready. */
export const startAgent = async (options: StartAgentOptions): Promise<AgentHandle> => {
  requireDist()
  const dir = await fsp.mkdtemp(path.join(os.tmpdir(), "cgn-agent-e2e-"))
  const text = typeof options.config === "string" ? options.config : stringifyToml(options.config)
  const configPath = path.join(dir, "agent.toml")
  await fsp.writeFile(configPath, text)
  let parsed: Record<string, unknown> = {}
  try {
    parsed = parseToml(text) as Record<string, unknown>
  } catch {
    // a deliberately broken file; the agent reports it
  }
  const agent = agentSection(parsed)
  const grpcAddress = String(agent.listen_grpc ?? "0.0.0.0:7071")
  const adminUrl = `http://${String(agent.listen_admin ?? "127.0.0.1:9091")}`

  const argv = [process.execPath, agentEntry, "run", "--config", configPath, ...(options.args ?? [])]
  const [command, ...args] = [...(options.launcher ?? []), ...argv] as [string, ...Array<string>]
  const proc = spawn(command, args, {
    cwd: dir,
    env: { ...process.env, ...options.env },
    stdio: ["ignore", "pipe", "pipe"]
  })
  const pid = proc.pid ?? -1
  const exited = new Promise<AgentExit>((resolve) => {
    proc.once("exit", (code, signal) => resolve({ code, signal }))
  })
  const tracked: Tracked = { proc, exited, enginePids: new Set(), dir }
  live.add(tracked)

  const stdoutLines = followLines(proc.stdout).lines
  // The engine's own log lines are relayed with its pid (and a forked grandchild's): kill them on cleanup.
  const stderr = followLines(proc.stderr, (line) => {
    if (line.includes("EngineProcess")) for (const p of pidsInLine(line)) tracked.enginePids.add(p)
  })
  const stderrLines = stderr.lines
  const tail = (n = 40) => stderrLines.slice(-n).join("\n")

  const waitForLine = (pred: (line: string) => boolean, timeoutMs = 10_000): Promise<string> =>
    stderr.waitFor(pred, timeoutMs, "agent log line")

  const logs = () => {
    const out: Array<Record<string, unknown>> = []
    for (const l of stderrLines) {
      try {
        const v: unknown = JSON.parse(l)
        if (typeof v === "object" && v !== null) out.push(v as Record<string, unknown>)
      } catch {
        // not a JSON line
      }
    }
    return out
  }

  const stop = async (signal: NodeJS.Signals = "SIGTERM", timeoutMs = 15_000): Promise<AgentExit> => {
    if (proc.exitCode === null && proc.signalCode === null) proc.kill(signal)
    const timer = setTimeout(() => proc.kill("SIGKILL"), timeoutMs)
    const e = await exited
    clearTimeout(timer)
    return e
  }

  const handle: AgentHandle = {
    pid,
    dir,
    configPath,
    adminUrl,
    grpcAddress,
    stderrLines,
    stdoutLines,
    logs,
    waitForLine,
    exited,
    stop,
    tail
  }
  if (options.awaitReady === false) return handle

  const readyTimeoutMs = options.readyTimeoutMs ?? 20_000
  const deadline = Date.now() + readyTimeoutMs
  let exit: AgentExit | undefined
  void exited.then((e) => {
    exit = e
  })
  for (;;) {
    if (exit !== undefined) {
      throw new Error(`agent exited (${exit.code ?? exit.signal}) before it was ready; stderr:\n${tail()}`)
    }
    try {
      const res = await fetch(`${adminUrl}/readyz`, { signal: AbortSignal.timeout(1_000) })
      await res.text()
      if (res.status === 200) return handle
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) {
      await stop("SIGKILL")
      throw new Error(`agent not ready within ${readyTimeoutMs} ms; stderr:\n${tail()}`)
    }
    await new Promise((r) => setTimeout(r, 50))
  }
}

export interface SimAgentOptions {
  /** etcd endpoints; empty: standalone. */
  readonly etcd?: ReadonlyArray<string>
  readonly etcdPrefix?: string
  /** Merged over the [cluster] section (etcd TLS files, credentials). */
  readonly cluster?: Record<string, unknown>
  readonly nodeId?: string
  /** Extra simulator knobs (`--sim-itl`, ...). */
  readonly simArgs?: ReadonlyArray<string>
  /** Merged over the [agent] section. */
  readonly agent?: Record<string, unknown>
  /** Merged over the [engine] section. */
  readonly engine?: Record<string, unknown>
}

export interface SimAgentConfig {
  readonly config: Record<string, unknown>
  readonly grpcPort: number
  readonly adminPort: number
  readonly enginePort: number
  readonly engineUrl: string
}

/**
 * A config that runs the built simulator (vLLM flavor) as the engine on ephemeral loopback ports, with a
 * temp state dir (relative to the agent's working directory, its temp dir), model `m`.
 */
export const simAgentConfig = async (o: SimAgentOptions = {}): Promise<SimAgentConfig> => {
  const [grpcPort, adminPort, enginePort] = (await freePorts(3)) as [number, number, number]
  const engineUrl = `http://127.0.0.1:${enginePort}`
  const config = {
    cluster: {
      name: "e2e",
      etcd: [...(o.etcd ?? [])],
      etcd_prefix: o.etcdPrefix ?? "/cgn",
      ...o.cluster
    },
    agent: {
      listen_grpc: `127.0.0.1:${grpcPort}`,
      listen_admin: `127.0.0.1:${adminPort}`,
      node_id: o.nodeId ?? "e2e-1",
      state_dir: "state",
      log_level: "info",
      ...o.agent
    },
    engine: {
      kind: "vllm",
      url: engineUrl,
      command: [process.execPath, simDistEntry, "--flavor", "vllm"],
      args: [...(o.simArgs ?? [])],
      startup_timeout: "20s",
      stop_grace: "2s",
      ...o.engine
    },
    models: { m: { hf_repo: "org/m" } }
  }
  return { config, grpcPort, adminPort, enginePort, engineUrl }
}

/** Polls (bounded, 45 s) until the agent's /readyz answers 503 "engine failing"; resolves with that text. */
export const awaitEngineFailing = (agent: Pick<AgentHandle, "adminUrl">): Promise<string> =>
  pollUntil(
    "/readyz says the engine is failing",
    async () => {
      const res = await fetch(`${agent.adminUrl}/readyz`)
      const text = await res.text()
      return res.status === 503 && text.includes("engine failing") ? text : undefined
    },
    45_000,
    200
  )
