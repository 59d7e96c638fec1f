// A SIGTERM while `run` is still in its preflight (before the daemon starts: programs/run.ts) ends the start with exit
// 130 and the line that says so, as one during the daemon's start does (signal-while-starting.test.ts). A lifecycle
// review saw exit 130 and no line: the line was said only around the daemon, not around the config's load, preflight
// and the state_dir checks that run first. The window is held open by security.ca_file naming a FIFO that the test
// opens for writing and never writes: preflight's read of it (layers/tls/tlsMaterial.ts readOne) waits for data.
import { execFileSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterEach, describe, expect, it } from "vitest"
import { killAllAgents, startAgent } from "../support/agent.ts"
import { pollUntil } from "../support/poll.ts"

const cleanups: Array<() => void> = []
afterEach(async () => {
  await killAllAgents()
  for (const c of cleanups.splice(0).reverse()) c()
})

/** The FIFO's write end, once a reader has it open (ENXIO until then: fifo(7)); the open never blocks. */
const openedByReader = (fifo: string): number | undefined => {
  try {
    return fs.openSync(fifo, fs.constants.O_WRONLY | fs.constants.O_NONBLOCK)
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENXIO") return undefined
    throw e
  }
}

describe("a signal while run is in its preflight", () => {
  it("ends the start with exit 130 and the 'stopped by a signal while starting' line", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-preflight-signal-"))
    cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }))
    const stateDir = path.join(dir, "state")
    fs.mkdirSync(stateDir, { mode: 0o700 })
    const ca = path.join(dir, "ca.pem")
    execFileSync("mkfifo", [ca])
    const agent = await startAgent({
      awaitReady: false,
      config: {
        agent: { state_dir: stateDir, listen_grpc: "127.0.0.1:0", listen_admin: "127.0.0.1:0" },
        engine: { kind: "vllm", command: [process.execPath, "-e", "setInterval(() => {}, 1000)"] },
        security: {
          require_mtls: true,
          ca_file: ca,
          cert_file: path.join(dir, "cert.pem"),
          key_file: path.join(dir, "key.pem")
        },
        models: { m: { hf_repo: "a/b" } }
      }
    })
    // preflight has ca_file open: its read waits for data, which never comes while the write end is held open
    let fd = await pollUntil("preflight reading ca_file", () => openedByReader(ca), 20_000)
    const release = () => {
      if (fd >= 0) fs.closeSync(fd)
      fd = -1
    }
    cleanups.push(release)
    process.kill(agent.pid, "SIGTERM")
    await agent.waitForLine((l) => l.includes("stopped by a signal while starting"), 10_000)
    // The read itself is still blocked in libuv's threadpool, and Node's exit joins those threads
    // (libuv src/threadpool.c uv__threadpool_cleanup): released only now, after the line, so it cannot let preflight
    // go on instead (an EOF: an empty CA, then exit 2).
    release()
    const exit = await agent.exited
    expect(exit, agent.tail()).toEqual({ code: 130, signal: null })
    const last = JSON.parse(agent.stderrLines.at(-1) ?? "{}") as Record<string, unknown>
    expect(last, agent.tail()).toMatchObject({
      level: "info",
      msg: "cgn-agent stopped by a signal while starting: nothing was served yet; its start undone",
      exit_code: 130
    })
    expect(agent.stdoutLines).toEqual([])
  })
})
