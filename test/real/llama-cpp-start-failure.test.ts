// The llama.cpp exit hint against the real engine: the built agent (dist/main.js) spawns the real llama-server
// (built by `npm run real-engine:build`, test/real/engine.ts) on a models.<name>.path that does not exist, then on a
// file that is not GGUF. llama-server dies at load (exit 1, its last line "exiting due to model loading error"), and
// the agent's exit carries the llama.cpp backend's hint, matched on the lines the real server printed: this is what
// holds the backend's patterns to the real engine's words. llama-server logs through a writer thread that nothing
// waits for at exit (llama.cpp common/log.cpp; ggml-org/llama.cpp#22142): on a busy host a run that dies this fast
// can end before its later lines are written (seen in CI: only the first lines, the cause never printed; reproduced
// without the agent, `llama-server -m /nonexistent 2>&1 | wc -l` under load). So the test reads the first run whose
// output reached llama-server's last line, restarting every 100 ms until one does: one thread writes the lines in
// order, so that run's record is complete.
import * as fs from "node:fs"
import * as net from "node:net"
import * as os from "node:os"
import * as path from "node:path"
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { type AgentHandle, killAllAgents, requireDist, startAgent } from "../support/agent.ts"
import { pollUntil } from "../support/poll.ts"
import { llamaAgentConfig, type RealEngine, realEngine, SERVER_ARGS, serverPids, tinyModel } from "./engine.ts"

interface Exit {
  readonly run: number
  readonly code: number | null
  readonly signal: string | null
  readonly hint: string | null
  readonly lastLines: ReadonlyArray<string>
}

const HINT = 'llama-server could not read the model file models."tiny".path names'

let engine: RealEngine
let dir: string
let agent: AgentHandle | undefined

beforeAll(() => {
  requireDist()
  engine = realEngine()
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-real-fail-"))
}, 30 * 60_000)
afterEach(async () => {
  try {
    if (agent !== undefined) expect((await agent.stop("SIGTERM", 30_000)).code).toBe(0)
  } finally {
    agent = undefined
    await killAllAgents()
  }
})
afterAll(() => {
  if (dir) fs.rmSync(dir, { recursive: true, force: true })
})

/** llama-server's last line when it dies at load. */
const LAST_LINE = "exiting due to model loading error"

/**
 * The agent on the real llama-server with `model` as models.tiny.path (and `args` after the agent's own): the first
 * exit whose output reached `last`.
 */
const firstExit = async (model: string, args: ReadonlyArray<string> = [], last = LAST_LINE): Promise<Exit> => {
  const c = await llamaAgentConfig({
    engine,
    model,
    engineSection: {
      restart_backoff_initial: "100ms",
      restart_backoff_max: "100ms",
      args: [...SERVER_ARGS, "-np", "2", ...args]
    }
  })
  const a = await startAgent({ config: c.config, awaitReady: false })
  agent = a
  return pollUntil(
    "a real llama-server exit in /status whose output reached its last line",
    async () => {
      const body = (await (await fetch(`${a.adminUrl}/status`)).json()) as {
        readonly engine: { readonly exits: ReadonlyArray<Exit> }
      }
      // newest first: the oldest run whose output is whole
      return body.engine.exits.findLast((x) => x.lastLines.some((l) => l.includes(last)))
    },
    60_000,
    100
  )
}

describe("the real llama-server dies at load, and the agent names the key", () => {
  it("a models.<name>.path that does not exist", async () => {
    const missing = path.join(dir, "no-such-model.gguf")
    const exit = await firstExit(missing)
    expect({ code: exit.code, signal: exit.signal }).toEqual({ code: 1, signal: null })
    const lines = exit.lastLines.join("\n")
    // on failure, the agent's own log of the run: what llama-server printed, as the agent read it
    expect(lines, agent?.tail(120)).toContain(`failed to open GGUF file '${missing}'`)
    expect(exit.hint).toContain(HINT)
  }, 120_000)

  it("a flag in engine.args llama-server does not know: its own refusal, and the args keys named", async () => {
    // the model is never reached: llama-server parses its arguments first
    const exit = await firstExit(path.join(dir, "unread.gguf"), ["--no-such-flag"], "invalid argument")
    expect(exit.code).toBe(1)
    expect(exit.lastLines.join("\n"), agent?.tail(120)).toContain("error: invalid argument: --no-such-flag")
    expect(exit.hint).toContain(
      'llama-server refused its command line (the line names the flag): remove or fix it in engine.args or models."tiny".args'
    )
  }, 120_000)

  it("a models.<name>.path that is not a GGUF file", async () => {
    const notGguf = path.join(dir, "notes.gguf")
    fs.writeFileSync(notGguf, "not a model\n")
    const exit = await firstExit(notGguf)
    expect(exit.code).toBe(1)
    expect(exit.lastLines.join("\n"), agent?.tail(120)).toContain("invalid magic characters")
    expect(exit.hint).toContain(HINT)
  }, 120_000)

  it("a models.<name>.path cut short (a download not finished): named as such", async () => {
    const whole = tinyModel(engine, dir, "words")
    const cut = path.join(dir, "cut.gguf")
    const bytes = fs.readFileSync(whole)
    fs.writeFileSync(cut, bytes.subarray(0, bytes.length - 64))
    const exit = await firstExit(cut)
    expect(exit.code).toBe(1)
    expect(exit.lastLines.join("\n"), agent?.tail(120)).toContain("model is corrupted or incomplete")
    expect(exit.hint).toContain('the model file models."tiny".path names is cut short or corrupted')
  }, 120_000)
})

describe("the real llama-server cannot bind engine.url's port", () => {
  it("another process took it during the restart backoff: the hint names engine.url", async () => {
    const c = await llamaAgentConfig({
      engine,
      model: tinyModel(engine, dir, "words"),
      engineSection: { restart_backoff_initial: "1s", restart_backoff_max: "1s" }
    })
    const a = await startAgent({ config: c.config })
    agent = a
    const [pid] = serverPids(c.enginePort)
    expect(pid, a.tail()).toBeDefined()
    let squatter: net.Server | undefined
    try {
      process.kill(pid as number, "SIGKILL")
      // the port is free once the killed server is gone: taken then, before the next run binds it
      squatter = await pollUntil("the port taken", () => {
        // a connection the agent's probes open is closed at once: close() waits for every open one
        const server = net.createServer((socket) => socket.destroy())
        return new Promise<net.Server | false>((resolve) => {
          server.once("error", () => resolve(false))
          server.listen(c.enginePort, "127.0.0.1", () => resolve(server))
        })
      })
      const exit = await pollUntil(
        "a run that could not bind",
        async () => {
          const body = (await (await fetch(`${a.adminUrl}/status`)).json()) as {
            readonly engine: { readonly exits: ReadonlyArray<Exit> }
          }
          return body.engine.exits.find((x) => x.lastLines.some((l) => l.includes("couldn't bind HTTP server socket")))
        },
        60_000,
        100
      )
      expect(exit.code).toBe(1)
      expect(exit.hint).toContain(
        `llama-server could not listen on 127.0.0.1:${c.enginePort} (engine.url): another process holds that port`
      )
    } finally {
      await new Promise((resolve) => (squatter === undefined ? resolve(undefined) : squatter.close(resolve)))
    }
  }, 120_000)
})
