// Starts the engine simulator (dist/programs/sim.js, or src/programs/sim.ts when the build is stale: entries.ts) as a
// real subprocess for tests.
// The child gets its own process group (detached), so stop() can signal the simulator together with any
// grandchild it forked (--sim-fork-grandchild), the way a supervisor kills an engine and its workers.
// Readiness is the simulator's `{"msg":"listening"}` stderr line; stderr lines are kept for assertions.
import { type ChildProcess, spawn } from "node:child_process"
import { simProgram } from "./entries.ts"
import { followLines } from "./lines.ts"
import { pollUntil as poll } from "./poll.ts"
import { freePort, freePorts } from "./ports.ts"

export type SimFlavor = "vllm" | "sglang" | "llama_cpp" | "mlx"

export interface StartSimOptions {
  readonly flavor?: SimFlavor
  /** Engine args and --sim-* knobs; `--port`/`--host` are added unless present. */
  readonly args?: ReadonlyArray<string>
  readonly env?: Record<string, string>
  /** How long to wait for the `listening` line (default 20 s). */
  readonly readyTimeoutMs?: number
}

export interface SimHandle {
  readonly url: string
  readonly port: number
  readonly pid: number
  readonly proc: ChildProcess
  /** Every stderr line so far (JSON log lines), appended as they arrive. */
  readonly stderrLines: Array<string>
  /** Resolves with the first stderr line (existing or future) matching `pred`; rejects after `timeoutMs`. */
  waitForLine(pred: (line: string) => boolean, timeoutMs?: number): Promise<string>
  /** Resolves when the simulator process has exited. */
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>
  /** SIGTERM to the process group, SIGKILL after `graceMs` (default 2 s); waits for exit. Idempotent. */
  stop(graceMs?: number): Promise<void>
}

/** The simulator's entry: the build when it is fresh, else src/programs/sim.ts (entries.ts). */
export const simEntry = simProgram()

const killGroup = (pid: number, signal: NodeJS.Signals): void => {
  try {
    process.kill(-pid, signal)
  } catch {
    // group already gone
  }
}

// Last resort, as in etcd.ts: a simulator is its own process group and would outlive this test process,
// e.g. when one of several started with Promise.all fails and the others never reach the test's afterAll.
const live = new Set<number>()
process.once("exit", () => {
  for (const pid of live) killGroup(pid, "SIGKILL")
})

/** Spawns the simulator and resolves once it logs `listening`. Kills it if it never does. */
export const startSim = async (options: StartSimOptions = {}): Promise<SimHandle> => {
  const args = [...(options.args ?? [])]
  if (options.flavor !== undefined && !args.includes("--flavor")) args.unshift("--flavor", options.flavor)
  let port: number
  const portIdx = args.indexOf("--port")
  if (portIdx >= 0) port = Number(args[portIdx + 1])
  else {
    port = await freePort()
    args.push("--port", String(port))
  }
  if (!args.includes("--host")) args.push("--host", "127.0.0.1")
  const proc = spawn(process.execPath, [simEntry, ...args], {
    env: { ...process.env, ...options.env },
    stdio: ["ignore", "ignore", "pipe"],
    detached: true
  })
  const pid = proc.pid ?? -1
  if (pid > 0) live.add(pid)
  const stderr = followLines(proc.stderr)
  const stderrLines = stderr.lines
  let exitInfo: { code: number | null; signal: NodeJS.Signals | null } | undefined
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
    proc.once("exit", (code, signal) => {
      exitInfo = { code, signal }
      resolve(exitInfo)
    })
  })

  const waitForLine = (pred: (line: string) => boolean, timeoutMs = 10_000): Promise<string> =>
    stderr.waitFor(pred, timeoutMs, "simulator line")

  let stopping: Promise<void> | undefined
  const stop = (graceMs = 2_000): Promise<void> => {
    stopping ??= (async () => {
      if (exitInfo === undefined) {
        killGroup(pid, "SIGTERM")
        const timer = setTimeout(() => killGroup(pid, "SIGKILL"), graceMs)
        await exited
        clearTimeout(timer)
      }
      // Whatever is left of the group (a grandchild) goes too.
      killGroup(pid, "SIGKILL")
      live.delete(pid)
    })()
    return stopping
  }

  const listening = (l: string) => l.includes('"msg":"listening"')
  try {
    await Promise.race([
      waitForLine(listening, options.readyTimeoutMs ?? 20_000),
      exited.then((e) => {
        throw new Error(`simulator exited (${e.code ?? e.signal}) before listening:\n${stderrLines.join("\n")}`)
      })
    ])
  } catch (err) {
    await stop(100)
    throw err
  }
  return { url: `http://127.0.0.1:${port}`, port, pid, proc, stderrLines, waitForLine, exited, stop }
}

/**
 * A vLLM prefill simulator and a decode one over NIXL's side channel (NixlConnector, kv_both, failing a lost
 * load), each on a side-channel port of its own; `prefillArgs` added to P's command line.
 */
export const startNixlPair = async (
  prefillArgs: ReadonlyArray<string> = []
): Promise<{ p: SimHandle; d: SimHandle; pSide: number }> => {
  const kvCfg = JSON.stringify({ kv_connector: "NixlConnector", kv_role: "kv_both", kv_load_failure_policy: "fail" })
  const [pSide, dSide] = await freePorts(2)
  const side = (port: number | undefined) => ({
    VLLM_NIXL_SIDE_CHANNEL_HOST: "127.0.0.1",
    VLLM_NIXL_SIDE_CHANNEL_PORT: String(port)
  })
  const [p, d] = await Promise.all([
    startSim({ args: ["serve", "m", "--kv-transfer-config", kvCfg, ...prefillArgs], env: side(pSide) }),
    startSim({ args: ["serve", "m", "--kv-transfer-config", kvCfg], env: side(dSide) })
  ])
  return { p, d, pSide: pSide as number }
}

/**
 * Reads a streamed answer until its first SSE ping (a `:` comment line), at most `timeoutMs`: the text read, and
 * when its first `data:` event arrived (performance.now()). Fails naming what came if no ping did.
 */
export const readUntilPing = async (
  res: Response,
  timeoutMs = 10_000
): Promise<{ text: string; firstDataAt: number | undefined }> => {
  const reader = (res.body as ReadableStream<Uint8Array>).getReader()
  const decoder = new TextDecoder()
  let text = ""
  let firstDataAt: number | undefined
  const deadline = Date.now() + timeoutMs
  while (!text.includes(":\n\n")) {
    let timer: NodeJS.Timeout | undefined
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no SSE ping; got ${JSON.stringify(text)}`)), deadline - Date.now())
    })
    const { value, done } = await Promise.race([reader.read(), late]).finally(() => clearTimeout(timer))
    if (done) break
    text += decoder.decode(value, { stream: true })
    if (firstDataAt === undefined && text.includes("data: ")) firstDataAt = performance.now()
  }
  return { text, firstDataAt }
}

/** POST a JSON body; returns status, headers and the parsed JSON (or raw text if not JSON). */
export const postJson = async (
  url: string,
  body: unknown,
  headers: Record<string, string> = {}
): Promise<{ status: number; headers: Headers; json: unknown; text: string }> => {
  const res = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify(body)
  })
  const { text, json } = await readBody(res)
  return { status: res.status, headers: res.headers, json, text }
}

/** The body as text, and as JSON when it parses (error bodies of some flavors are not JSON). */
const readBody = async (res: Response): Promise<{ text: string; json: unknown }> => {
  const text = await res.text()
  try {
    return { text, json: JSON.parse(text) }
  } catch {
    return { text, json: undefined }
  }
}

/** Splits an SSE body into its `data:` payloads (comments and blank lines dropped). */
export const sseData = (text: string): Array<string> =>
  text
    .split("\n\n")
    .map((e) => e.trim())
    .filter((e) => e.startsWith("data: "))
    .map((e) => e.slice("data: ".length))

/** GET JSON helper. */
export const getJson = async (url: string): Promise<{ status: number; json: unknown; text: string }> => {
  const res = await fetch(url)
  const { text, json } = await readBody(res)
  return { status: res.status, json, text }
}

/** test/support/poll.ts's pollUntil with the argument order the simulator tests use. */
export const pollUntil = <A>(fn: () => Promise<A | undefined>, timeoutMs = 10_000, everyMs = 20): Promise<A> =>
  poll("a simulator condition", fn, timeoutMs, everyMs)
