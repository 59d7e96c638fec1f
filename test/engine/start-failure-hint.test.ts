// A start failure the config fixes, end to end through the built agent (dist/main.js): the simulator, vLLM flavor,
// dies while loading as vLLM does when no GPU memory is left for its KV cache (--sim-crash-at-start kv-cache-memory:
// vLLM's own lines and exit code 1). The agent names the config key that fixes it: in /status's exit (`hint`), in the
// restart log line, in NodeHealth's engine detail and, once the runs make a crash loop, in the failing reason /readyz
// gives. Needs dist/ (`npm run build`).
import { afterEach, beforeAll, describe, expect, it } from "vitest"
import {
  type AgentHandle,
  awaitEngineFailing,
  killAllAgents,
  requireDist,
  simAgentConfig,
  startAgent
} from "../support/agent.ts"
import { pollUntil } from "../support/poll.ts"

const HINT =
  'vLLM has no GPU memory left for its KV cache once the weights are loaded: raise models."m".gpu_memory_utilization'

interface Exit {
  readonly run: number
  readonly code: number | null
  readonly hint: string | null
  readonly lastLines: ReadonlyArray<string>
}
interface Status {
  readonly health: { readonly engine?: { readonly detail?: string } }
  readonly engine: { readonly exits: ReadonlyArray<Exit> }
}

let agent: AgentHandle | undefined

beforeAll(() => requireDist())
afterEach(async () => {
  try {
    if (agent !== undefined) expect((await agent.stop("SIGTERM", 30_000)).code).toBe(0)
  } finally {
    agent = undefined
    await killAllAgents()
  }
})

const start = async (backoff: string): Promise<AgentHandle> => {
  const { config } = await simAgentConfig({
    simArgs: ["--sim-crash-at-start", "kv-cache-memory"],
    engine: { restart_backoff_initial: backoff, restart_backoff_max: backoff }
  })
  agent = await startAgent({ config, awaitReady: false })
  return agent
}

const status = async (a: AgentHandle): Promise<Status> =>
  (await fetch(`${a.adminUrl}/status`)).json() as Promise<Status>

describe("an engine that dies at start of a cause the config fixes", () => {
  it("/status's exit has the hint, and so do the restart log line and NodeHealth's detail", async () => {
    const a = await start("60s")
    const { exit, body } = await pollUntil(
      "the first run's exit in /status",
      async () => {
        const body = await status(a)
        const exit = body.engine.exits.find((x) => x.run === 0)
        return exit === undefined ? undefined : { exit, body }
      },
      30_000,
      100
    )
    expect(exit.code, a.tail()).toBe(1)
    expect(exit.lastLines.join("\n")).toContain("ValueError: No available memory for the cache blocks")
    expect(exit.hint).toContain(HINT)
    expect(body.health.engine?.detail).toContain(`; hint: ${HINT}`)
    const line = await a.waitForLine((l) => l.includes("restart attempt 1"), 10_000)
    const msg = String((JSON.parse(line) as { msg?: unknown }).msg)
    expect(msg).toMatch(/^run 0 \(pid \d+\) ended: exited, exit code 1, after [\d.]+ s; hint: /)
    expect(msg).toContain(HINT)
  }, 60_000)

  it("the crash loop's reason, in /readyz, names the key", async () => {
    const a = await start("100ms")
    const readyz = await awaitEngineFailing(a)
    expect(readyz).toContain("runs in a row ended before being stable, the last: exited (exit code 1); hint: ")
    expect(readyz).toContain(HINT)
  }, 60_000)
})
