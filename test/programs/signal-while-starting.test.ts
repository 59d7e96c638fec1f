// A SIGTERM that reaches `run` before the daemon routes signals to its drain (runMain.ts: the handler is installed
// once the agent serves) interrupts its start: a lifecycle review saw exit 130 with nothing logged after the start's
// own lines. Now its last line says so. The window held open by a lock of another host's agent (another pid
// namespace), which a start waits out (layers/engine/stateLock.ts) before it goes on.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterEach, describe, expect, it } from "vitest"
import { lockFilePath } from "../../src/layers/engine/stateLock.ts"
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
})
