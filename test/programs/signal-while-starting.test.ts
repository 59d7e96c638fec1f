// A SIGTERM that reaches `run` before the daemon routes signals to its drain (runMain.ts: the handler is installed
// once the agent serves) interrupts its start: a lifecycle review saw exit 130 with nothing logged after the start's
// own lines. Now its last line says so. The window held open by a lock of another host's agent (another pid
// namespace), which a start waits out (layers/stateDir/stateLock.ts) before it goes on.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterEach, describe, expect, it } from "vitest"
import { lockFilePath } from "../../src/layers/stateDir/stateLock.ts"
import { startAgent } from "../support/agent.ts"
import { pollUntil } from "../support/poll.ts"

const cleanups: Array<() => void> = []
afterEach(() => {
  for (const c of cleanups.splice(0).reverse()) c()
})

describe("a signal while the agent starts", () => {
  it("ends the start with an info line saying so (exit 130), not with nothing", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-early-signal-"))
    cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }))
    const stateDir = path.join(dir, "state")
    fs.mkdirSync(stateDir, { mode: 0o700 })
    // a fresh lock of an agent this host cannot judge (another pid namespace): waited out, up to 15 s
    const lock = { pid: 1, startedAt: Date.now(), pidNs: "pid:[1]", host: os.hostname(), token: "elsewhere" }
    fs.writeFileSync(lockFilePath(stateDir), `${JSON.stringify(lock)}\n`, { mode: 0o600 })
    const agent = await startAgent({
      awaitReady: false,
      config: {
        agent: { state_dir: stateDir, listen_grpc: "127.0.0.1:0", listen_admin: "127.0.0.1:0" },
        engine: { kind: "vllm", command: [process.execPath, "-e", "setInterval(() => {}, 1000)"] },
        models: { m: { hf_repo: "a/b" } }
      }
    })
    await pollUntil("the start waiting out the lock", () => agent.stderrLines.some((l) => l.includes("waiting up to")))
    const exit = await agent.stop("SIGTERM")
    expect(exit.code).toBe(130)
    const last = JSON.parse(agent.stderrLines.at(-1) ?? "{}") as Record<string, unknown>
    expect(last).toMatchObject({
      level: "info",
      msg: "cgn-agent stopped by a signal while starting: nothing was served yet; its start undone",
      exit_code: 130
    })
    expect(agent.stdoutLines).toEqual([])
  })

  it("a signal after the drain (the core's teardown) changes nothing: exit 0, no 'while starting' line", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-late-signal-"))
    cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }))
    const agent = await startAgent({
      config: {
        agent: {
          state_dir: path.join(dir, "state"),
          listen_grpc: "127.0.0.1:0",
          listen_admin: "127.0.0.1:0",
          drain_timeout: "1s"
        },
        // a spawned engine (one that never listens): its supervisor and the guard are part of the core's teardown
        engine: { kind: "vllm", command: [process.execPath, "-e", "setInterval(() => {}, 1000)"], stop_grace: "1s" },
        models: { m: { hf_repo: "a/b" } }
      },
      awaitReady: false
    })
    await pollUntil("serving", () => agent.stderrLines.some((l) => l.includes("cgn-agent serving")))
    // the drain's signal, then one every 2 ms until the process is gone: some land after the daemon's handler is
    // released, in the core's teardown (a code review saw exit 130 and "stopped by a signal while starting")
    let gone = false
    const exited = agent.exited.then((e) => {
      gone = true
      return e
    })
    process.kill(agent.pid, "SIGTERM")
    while (!gone) {
      try {
        process.kill(agent.pid, "SIGTERM")
      } catch {
        break
      }
      await new Promise((r) => setTimeout(r, 2))
    }
    expect(await exited).toEqual({ code: 0, signal: null })
    expect(agent.stderrLines.some((l) => l.includes("while starting"))).toBe(false)
    expect(JSON.parse(agent.stderrLines.at(-1) ?? "{}")).toMatchObject({ msg: "cgn-agent stopped" })
  })
})
