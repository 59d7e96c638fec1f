// What the environment or a bad input did to the built agent before each fix: an 'error' event nobody listened
// to (Node throws it: an uncaught exception, and the agent installs no handler for those on purpose), and a
// spawn failure Node throws instead of emitting it as 'error'.
// - its log pipe closed: the EPIPE of a log line written after that ended the agent (uncaught, exit 1);
// - its log reader stalled without closing: every line waited in the agent's memory, without bound;
// - an engine argument too long for exec (E2BIG): the supervisor's loop died, the engine "spawning" for good.
// Requires dist/ (`npm run build`; `npm test` builds first).
import { type ChildProcess, spawn } from "node:child_process"
import * as fsp from "node:fs/promises"
import * as net from "node:net"
import * as os from "node:os"
import * as path from "node:path"
import { stringify as stringifyToml } from "smol-toml"
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import {
  agentEntry,
  awaitEngineFailing,
  killAllAgents,
  processAlive,
  requireDist,
  simAgentConfig,
  simDistEntry,
  startAgent
} from "../support/agent.ts"
import { agentClient, generate } from "../support/generate.ts"
import { followLines } from "../support/lines.ts"
import { pollUntil } from "../support/poll.ts"

beforeAll(() => requireDist())

interface Spawned {
  readonly proc: ChildProcess
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>
  readonly dir: string
  readonly enginePids: Set<number>
}
const spawned: Array<Spawned> = []

afterAll(() => killAllAgents())
afterEach(async () => {
  await killAllAgents()
  for (const s of spawned.splice(0)) {
    if (s.proc.exitCode === null && s.proc.signalCode === null) s.proc.kill("SIGKILL")
    await s.exited
    // The guard stops the engine when the agent dies; these are only what a failed test could leave.
    for (const pid of s.enginePids) {
      try {
        if (processAlive(pid)) process.kill(pid, "SIGKILL")
      } catch {
        // gone meanwhile
      }
    }
    await fsp.rm(s.dir, { recursive: true, force: true })
  }
})

/**
 * The built agent on `config`, its stderr piped to this test and nothing else (stdout ignored), registered for
 * cleanup. Nothing reads the pipe until the test does.
 */
const spawnPipedAgent = async (config: Record<string, unknown>): Promise<Spawned> => {
  const dir = await fsp.mkdtemp(path.join(os.tmpdir(), "cgn-crash-"))
  const configPath = path.join(dir, "agent.toml")
  await fsp.writeFile(configPath, stringifyToml(config))
  const proc = spawn(process.execPath, [agentEntry, "run", "--config", configPath], {
    cwd: dir,
    stdio: ["ignore", "ignore", "pipe"]
  })
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    proc.once("exit", (code, signal) => resolve({ code, signal }))
  )
  const s: Spawned = { proc, exited, dir, enginePids: new Set() }
  spawned.push(s)
  return s
}

/** Sends HTTP/1.1 to the gRPC port (a bad HTTP/2 preface: the agent logs the connection's error at debug). */
const badHttp2Client = (port: number): Promise<void> =>
  new Promise((resolve) => {
    const socket = net.connect(port, "127.0.0.1", () => socket.write("GET / HTTP/1.1\r\nHost: agent\r\n\r\n"))
    socket.on("error", () => {})
    socket.resume()
    socket.once("close", () => resolve())
  })

describe("the agent's log pipe closes (the log collector gone)", () => {
  it("keeps serving, and still drains to exit 0: its log writes fail with EPIPE, which must not end it", async () => {
    // debug: a connection that breaks HTTP/2 is logged at debug, a write to the closed pipe while serving.
    const { config, grpcPort, adminPort } = await simAgentConfig({ agent: { log_level: "debug" } })
    const s = await spawnPipedAgent(config)
    const { proc, exited } = s
    const log = followLines(proc.stderr, (line) => {
      for (const m of line.matchAll(/"pid":(\d+)/g)) s.enginePids.add(Number(m[1]))
    })
    const readyz = async () => (await fetch(`http://127.0.0.1:${adminPort}/readyz`)).status
    await pollUntil("the agent ready", async () => (await readyz()) === 200, 45_000)
    expect(log.lines.length).toBeGreaterThan(0)
    // Every step below fails at once, saying so, if the agent dies meanwhile.
    const died = exited.then((e) => {
      throw new Error(`the agent died after its log pipe closed: ${JSON.stringify(e)}`)
    })
    died.catch(() => {})
    const alive = <A>(step: Promise<A>): Promise<A> => Promise.race([step, died])

    // The read end closed: every later write of the agent to stderr fails with EPIPE.
    proc.stderr?.destroy()
    await alive(badHttp2Client(grpcPort))
    const { client, channel } = agentClient(`127.0.0.1:${grpcPort}`)
    try {
      for (let i = 0; i < 3; i++) {
        const r = await alive(generate(client, { prompt: "a b c", sampling: { maxTokens: 4 } }).done)
        expect(r.error).toBeUndefined()
      }
    } finally {
      channel.close()
    }
    // SIGHUP logs its reload at info; the drain logs every step and still ends in exit 0.
    process.kill(proc.pid as number, "SIGHUP")
    expect(await alive(readyz())).toBe(200)
    proc.kill("SIGTERM")
    expect(await exited).toEqual({ code: 0, signal: null })
  }, 90_000)
})

describe("the agent's log reader stalls (a pipe nobody reads, not closed)", () => {
  it("keeps at most MAX_LOG_BACKLOG_CHARS waiting: later lines are dropped, counted, and reported once read again", async () => {
    // An engine that prints ~3 MB of output lines before it starts: the agent logs each one (~300 bytes of JSON).
    const noisy = `yes "$(printf '%0200d' 0)" | head -n 10000; exec "$@"`
    const { config, adminPort } = await simAgentConfig({
      engine: { command: ["sh", "-c", noisy, "sh", process.execPath, simDistEntry, "--flavor", "vllm"] }
    })
    // stderr piped and not read: the pipe fills, then the agent's own stream buffers what it writes.
    const { proc, exited } = await spawnPipedAgent(config)
    const admin = `http://127.0.0.1:${adminPort}`
    await pollUntil("the agent ready", async () => (await fetch(`${admin}/readyz`)).status === 200, 45_000)
    const droppedNow = async () => {
      const text = await (await fetch(`${admin}/metrics`)).text()
      const line = text.split("\n").find((l) => l.startsWith("cgn_agent_log_lines_dropped_total "))
      return line === undefined ? undefined : Number(line.split(" ")[1])
    }
    const dropped = await droppedNow()
    // 10,000 engine lines of ~300 bytes each is ~3 MB: past the bound of 1 Mi characters (ASCII here), most of them are dropped.
    expect(dropped).toBeGreaterThan(5_000)
    // Read again: once the reader has taken the backlog the count is written, with no line of the agent's own to
    // carry it (before, it waited for the next one, which a quiet agent may not write for hours).
    const log = followLines(proc.stderr)
    const warned = log.waitFor((l) => l.includes("log: lines dropped"), 20_000, "the dropped-lines warning")
    const warning = JSON.parse(await warned) as Record<string, unknown>
    expect(warning.level).toBe("warn")
    // Each warning counts the lines dropped since the one before: on a loaded machine the backlog was caught up more
    // than once (a fresh-clone CI run read 592, then the rest), so the warnings together cover the count seen.
    const reported = () =>
      log.lines
        .filter((l) => l.includes("log: lines dropped"))
        .reduce((n, l) => n + Number((JSON.parse(l) as { dropped?: number }).dropped ?? 0), 0)
    await pollUntil("the warnings cover every line dropped", () => reported() >= (dropped as number), 20_000)
    // What waited was bounded: the lines read before the warning are the pipe's 64 KiB plus at most 1 Mi characters.
    const before = log.lines.slice(
      0,
      log.lines.findIndex((l) => l.includes("log: lines dropped"))
    )
    expect(before.reduce((n, l) => n + l.length + 1, 0)).toBeLessThan(1024 * 1024 + 256 * 1024)
    proc.kill("SIGTERM")
    expect(await exited).toEqual({ code: 0, signal: null })
  }, 90_000)
})

describe("an engine argument too long for exec (E2BIG: Node throws it from spawn, it emits no 'error')", () => {
  it("is a failed run: logged, retried with backoff, /readyz says failing; the agent still drains to exit 0", async () => {
    // One argument past the kernel's MAX_ARG_STRLEN (128 KiB): exec of the guard fails with E2BIG.
    const { config } = await simAgentConfig({
      simArgs: ["--sim-itl", "x".repeat(200_000)],
      engine: { restart_backoff_initial: "100ms", restart_backoff_max: "500ms" }
    })
    const agent = await startAgent({ config, awaitReady: false })
    const readyz = await awaitEngineFailing(agent)
    expect(readyz).toContain("E2BIG")
    expect(
      agent.logs().some((l) => l.level === "error" && String(l.msg).includes("E2BIG")),
      agent.tail()
    ).toBe(true)
    expect(await agent.stop("SIGTERM")).toEqual({ code: 0, signal: null })
  }, 90_000)
})
