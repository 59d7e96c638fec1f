// The fatal line that ends `run` says why in the operator's words, without the error's internal tag: a second agent
// on a held state_dir logged `engine process: AnotherAgent: agent.state_dir ... is held by agent pid N ...`. The
// cgn-agent binary from source, on a state_dir whose lock names a live process (a stand-in for the first agent:
// services/stateDir/LockVerdict.ts judges a lock by its pid, start time, pid namespace and host).
import { type ChildProcess, spawn } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterEach, describe, expect, it } from "vitest"
import { processStartMs } from "../../src/layers/engine/processGroup.ts"
import { lockFilePath } from "../../src/layers/stateDir/stateLock.ts"
import { fatalMessage } from "../../src/programs/fatal.ts"
import { EngineProcessError } from "../../src/services/engine/EngineProcess.ts"
import { runCli } from "../support/cli.ts"

const cleanups: Array<() => void> = []
afterEach(() => {
  for (const c of cleanups.splice(0).reverse()) c()
})

describe("run's fatal line has no internal error tag", () => {
  it("a second agent on a held state_dir: the holder and the remedy, no 'AnotherAgent:'", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-fatal-tag-"))
    cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }))
    const stateDir = path.join(dir, "state")
    fs.mkdirSync(stateDir, { mode: 0o700 })
    const holder: ChildProcess = spawn("sleep", ["600"], { stdio: "ignore" })
    cleanups.push(() => holder.kill("SIGKILL"))
    const pid = holder.pid!
    const lock = {
      pid,
      startedAt: processStartMs(pid),
      pidNs: fs.readlinkSync("/proc/self/ns/pid"),
      host: os.hostname(),
      token: "first-agent"
    }
    fs.writeFileSync(lockFilePath(stateDir), `${JSON.stringify(lock)}\n`, { mode: 0o600 })
    const config = path.join(dir, "agent.toml")
    fs.writeFileSync(
      config,
      [
        "[agent]",
        `state_dir = "${stateDir}"`,
        'listen_grpc = "127.0.0.1:0"',
        'listen_admin = "127.0.0.1:0"',
        'listen_health = "127.0.0.1:0"',
        "[engine]",
        'kind = "vllm"',
        `command = [${JSON.stringify(process.execPath)}, "-e", "setInterval(() => {}, 1000)"]`,
        "[models.m]",
        'hf_repo = "a/b"'
      ].join("\n")
    )
    const r = await runCli(["run", "--config", config])
    expect(r.code, r.stderr).toBe(1)
    const last = JSON.parse(r.stderr.trim().split("\n").at(-1) ?? "{}") as Record<string, unknown>
    expect(last).toMatchObject({
      level: "fatal",
      msg: expect.stringMatching(
        new RegExp(`^engine process: agent\\.state_dir ${stateDir} is held by agent pid ${pid} `)
      ),
      exit_code: 1
    })
    expect(String(last.msg)).not.toMatch(/AnotherAgent/)
  }, 40_000)

  it("every reason the supervisor refuses a start for: the detail alone after 'engine process:'", () => {
    for (const reason of ["PortBusy", "AnotherAgent", "StaleEngine"] as const) {
      const e = new EngineProcessError({ reason, detail: "what happened; what to do" })
      expect(fatalMessage(e)).toBe("engine process: what happened; what to do")
      // the tag stays on the error, for code and tests to switch on
      expect(e.reason).toBe(reason)
    }
    // state_dir is the agent's, not the engine's: its detail names agent.state_dir, and stands alone
    const e = new EngineProcessError({ reason: "StateDir", detail: 'agent.state_dir = "/s": cannot write ...' })
    expect(fatalMessage(e)).toBe('agent.state_dir = "/s": cannot write ...')
  })
})
