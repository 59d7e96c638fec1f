// The simulator takes stop signals as the engines do (llama.cpp tools/server/server.cpp `signal_handler`,
// uvicorn `Server.handle_exit`): the first SIGTERM/SIGINT starts a graceful shutdown (exit 0); a second one
// during it exits at once with code 1 and "Received second interrupt, terminating immediately.". That is what
// makes a supervisor that signals twice visible in tests. `--sim-ignore-sigterm` ignores every SIGTERM;
// `--sim-sigterm-waits-streams` waits for the clients of the streams in flight, as llama-server often does.
import { afterAll, describe, expect, it } from "vitest"
import { type SimHandle, startSim } from "../support/sim.ts"

const started: Array<SimHandle> = []
const start = async (args: Array<string> = []) => {
  const s = await startSim({ flavor: "llama_cpp", args })
  started.push(s)
  return s
}
afterAll(() => Promise.all(started.map((s) => s.stop(200))))

const SECOND = "Received second interrupt, terminating immediately."
const shuttingDown = (l: string) => l.includes('"msg":"shutting down"')

describe("stop signals", () => {
  it("one SIGTERM: a graceful shutdown, exit 0", async () => {
    const s = await start()
    process.kill(s.pid, "SIGTERM")
    expect((await s.exited).code).toBe(0)
    expect(s.stderrLines.some(shuttingDown)).toBe(true)
    expect(s.stderrLines.some((l) => l.includes('"msg":"shut down"'))).toBe(true)
    expect(s.stderrLines.some((l) => l.includes(SECOND))).toBe(false)
  })

  it.each([
    ["SIGTERM", "SIGTERM"],
    ["SIGINT", "SIGTERM"],
    ["SIGTERM", "SIGINT"]
  ] as const)("%s then %s during the shutdown: exit 1 at once, with the engines' line", async (first, second) => {
    // A long shutdown, so the second signal surely lands inside it on a loaded machine.
    const s = await start(["--sim-shutdown-delay", "30s"])
    process.kill(s.pid, first)
    await s.waitForLine(shuttingDown)
    process.kill(s.pid, second)
    expect((await s.exited).code).toBe(1)
    expect(s.stderrLines.some((l) => l.includes(SECOND))).toBe(true)
  })

  it("--sim-sigterm-waits-streams: the stream in flight stalls, and the process exits once its client has left", async () => {
    const s = await start(["--sim-sigterm-waits-streams", "--sim-itl", "5ms", "--sim-mode", "random"])
    const ac = new AbortController()
    const res = await fetch(`${s.url}/v1/completions`, {
      method: "POST",
      body: JSON.stringify({ prompt: "a b", max_tokens: 100_000, stream: true }),
      signal: ac.signal
    })
    const reader = res.body!.getReader()
    await reader.read()
    process.kill(s.pid, "SIGTERM")
    await s.waitForLine(shuttingDown)
    // the listener is closed, the stream open; the process waits (a bounded check that it has not exited: the
    // exit is what the client's leaving brings, below)
    await expect(fetch(`${s.url}/health`)).rejects.toThrow()
    expect(s.proc.exitCode).toBeNull()
    ac.abort()
    expect((await s.exited).code).toBe(0)
  })

  it("--sim-ignore-sigterm ignores every SIGTERM (no second-signal exit); SIGINT still stops it", async () => {
    const s = await start(["--sim-ignore-sigterm"])
    process.kill(s.pid, "SIGTERM")
    process.kill(s.pid, "SIGTERM")
    await s.waitForLine((l) => l.includes("ignoring SIGTERM"))
    expect((await fetch(`${s.url}/health`)).status).toBe(200)
    process.kill(s.pid, "SIGINT")
    expect((await s.exited).code).toBe(0)
    expect(s.stderrLines.some((l) => l.includes(SECOND))).toBe(false)
  })
})
