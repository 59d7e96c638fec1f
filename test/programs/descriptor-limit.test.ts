// The built agent (`node dist/main.js run`) under a low descriptor limit (`prlimit --nofile=N:N`): every run that got
// as far as logging ends with one JSON `fatal` line carrying `exit_code` (README, exit codes), in the agent's words
// (EMFILE and the limit to raise), never the runtime's plain `ERROR (#1): ...` and a stack after the JSON lines. Before
// the fix, N=23 died on a defect (a proto file gRPC reflection reads) and N=24 on `os.networkInterfaces()` (the
// advertised address: `uv_interface_addresses returned Unknown system error 24`), also for a listen host of
// 127.0.0.1, which needs no interface list (test/registry/advertise-interfaces.test.ts: now never asked for there).
// The limits where this happens shift with the build and the host, so N
// is swept upward from below the first that logs to the first that serves. Below the first that logs, Node itself
// fails to load the program (or crashes): none of the agent's code has run. Requires dist/ and prlimit (util-linux).
import { type ChildProcess, spawn, spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { stringify as stringifyToml } from "smol-toml"
import { afterEach, beforeAll, describe, expect, it } from "vitest"
import { agentEntry, requireDist, simAgentConfig } from "../support/agent.ts"

const hasPrlimit = spawnSync("prlimit", ["--version"], { stdio: "ignore" }).status === 0

const live = new Set<ChildProcess>()
const dirs: Array<string> = []
afterEach(() => {
  for (const p of live) if (p.exitCode === null && p.signalCode === null) p.kill("SIGKILL")
  live.clear()
  for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true })
})

interface Outcome {
  readonly n: number
  readonly code: number | null
  readonly served: boolean
  readonly lines: ReadonlyArray<string>
  readonly stdout: string
}

/** One run at `--nofile=n:n`: stopped with SIGTERM once it serves, else awaited until it ends (bounded). */
const runAt = (n: number, configPath: string, cwd: string): Promise<Outcome> =>
  new Promise((resolve, reject) => {
    const proc = spawn("prlimit", [`--nofile=${n}:${n}`, process.execPath, agentEntry, "run", "--config", configPath], {
      cwd,
      stdio: ["ignore", "pipe", "pipe"]
    })
    live.add(proc)
    let stderr = ""
    let stdout = ""
    proc.stdout?.on("data", (chunk: Buffer) => {
      stdout += chunk.toString()
    })
    let served = false
    // neither serving nor ended: a hang the test reports with what it logged
    const bound = setTimeout(() => {
      proc.kill("SIGKILL")
      reject(new Error(`--nofile=${n}: neither served nor ended in 30 s:\n${stderr.slice(-3000)}`))
    }, 30_000)
    proc.stderr?.on("data", (chunk: Buffer) => {
      stderr += chunk.toString()
      if (!served && stderr.includes('"msg":"cgn-agent serving"')) {
        served = true
        proc.kill("SIGTERM")
      }
    })
    // "close": the process has ended and its stderr is read to the end
    proc.once("close", (code) => {
      clearTimeout(bound)
      live.delete(proc)
      resolve({ n, code, served, lines: stderr.split("\n").filter((l) => l.trim() !== ""), stdout })
    })
  })

const parsed = (line: string): Record<string, unknown> | undefined => {
  try {
    const v: unknown = JSON.parse(line)
    return typeof v === "object" && v !== null ? (v as Record<string, unknown>) : undefined
  } catch {
    return undefined
  }
}

const sweep = async (listenHost: string): Promise<Array<Outcome>> => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-nofile-"))
  dirs.push(dir)
  const { config } = await simAgentConfig({
    agent: { listen_grpc: `${listenHost}:0`, listen_admin: "127.0.0.1:0", log_level: "info" }
  })
  const configPath = path.join(dir, "agent.toml")
  fs.writeFileSync(configPath, stringifyToml(config))
  const out: Array<Outcome> = []
  for (let n = 16; n <= 64; n++) {
    const o = await runAt(n, configPath, dir)
    out.push(o)
    if (o.served) return out
  }
  throw new Error(`the agent never served up to --nofile=64:\n${out.at(-1)?.lines.slice(-20).join("\n")}`)
}

/** Every run that logged and did not serve: JSON lines only from the first on, the last a fatal line. */
const expectFatalLines = (outcomes: ReadonlyArray<Outcome>): Array<Record<string, unknown>> => {
  const fatals: Array<Record<string, unknown>> = []
  for (const o of outcomes) {
    const first = o.lines.findIndex((l) => parsed(l) !== undefined)
    if (o.served || first < 0) continue
    const context = `--nofile=${o.n}:\n${o.lines.slice(-15).join("\n")}\nstdout:\n${o.stdout.slice(-2000)}`
    // `run` writes nothing to stdout: the runtime's report of a defect (`ERROR (#1): ...` and a stack) went there
    expect(o.stdout, context).toBe("")
    const notJson = o.lines.slice(first).filter((l) => parsed(l) === undefined)
    expect(notJson, context).toEqual([])
    const last = parsed(o.lines.at(-1) ?? "") ?? {}
    expect(last, context).toMatchObject({ level: "fatal", exit_code: o.code })
    expect(o.code, context).toBe(1)
    // the cause in the agent's words: what ran out and what to raise; no stack, no libuv's unnamed errno
    expect(String(last.msg), context).toMatch(/EMFILE/)
    expect(String(last.msg), context).toMatch(/descriptor limit/)
    expect(String(last.msg), context).not.toMatch(/Unknown system error|internal error/)
    expect(last.stack, context).toBeUndefined()
    fatals.push(last)
  }
  return fatals
}

describe.skipIf(!hasPrlimit)("run under a low descriptor limit", () => {
  beforeAll(() => requireDist())

  it("listen_grpc on a wildcard: every run that logs ends in one JSON fatal line naming EMFILE", async () => {
    const outcomes = await sweep("0.0.0.0")
    const fatals = expectFatalLines(outcomes)
    // the limit was low enough, somewhere in the sweep, for the agent itself to fail
    expect(fatals.length, outcomes.map((o) => `${o.n}: ${o.lines.at(-1)}`).join("\n")).toBeGreaterThan(0)
  }, 240_000)
})
