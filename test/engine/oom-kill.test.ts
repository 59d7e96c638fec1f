// The kernel's OOM killer, for real: the built agent runs inside a memory cgroup of the test's own with a 512 MiB
// limit (the agent, its guard and an idle engine peaked at 88 MiB there, measured on this project's CI machine), as it
// runs in a container with its engine. The engine, a script of the test's, makes itself the OOM killer's choice
// (oom_score_adj 1000, which a process may raise for itself) and allocates until the kernel SIGKILLs it. The agent
// lives on and says why its engine died: in /status (the exit's oomKills and memoryLimitBytes, NodeHealth's engine
// detail), in the restart log line, in cgn_agent_engine_oom_kills_total. The control: an engine that SIGKILLs itself
// in the same setup shows no OOM kill. Only the test's cgroup is limited; it is removed after each case.
// Needs root (or a delegated cgroup) and dist/ (`npm run build`); skipped, named, where no cgroup can be made.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterEach, beforeAll, describe, expect, it } from "vitest"
import {
  type AgentHandle,
  killAllAgents,
  processAlive,
  requireDist,
  simAgentConfig,
  startAgent
} from "../support/agent.ts"
import { canCreateMemoryCgroup, createMemoryCgroup, type TestCgroup } from "../support/memoryCgroup.ts"
import { pollUntil } from "../support/poll.ts"

const LIMIT = 512 * 2 ** 20

/** Makes itself the OOM killer's first choice, then allocates and touches 16 MiB at a time, keeping all of it. */
const HOG = `import * as fs from "node:fs"
fs.writeFileSync("/proc/self/oom_score_adj", "1000")
console.log("allocating")
const kept = []
for (;;) kept.push(Buffer.alloc(16 * 2 ** 20, 1))
`
/** Dies of a SIGKILL that is not the OOM killer's. */
const SELF_KILL = `setTimeout(() => process.kill(process.pid, "SIGKILL"), 200)
`

interface Exit {
  readonly run: number
  readonly signal: string | null
  readonly code: number | null
  readonly oomKills: number | null
  readonly memoryLimitBytes: number | null
}
interface Status {
  readonly health: { readonly engine?: { readonly detail?: string } }
  readonly engine: { readonly exits: ReadonlyArray<Exit> }
}

let cgroup: TestCgroup | undefined
let agent: AgentHandle | undefined
let dir: string | undefined

beforeAll(() => requireDist())
afterEach(async () => {
  try {
    // SIGTERM and its drain, awaited; the guard stops the engine with it
    if (agent !== undefined) expect((await agent.stop("SIGTERM", 30_000)).code).toBe(0)
  } finally {
    agent = undefined
    await killAllAgents()
    await cgroup?.remove()
    cgroup = undefined
    if (dir !== undefined) fs.rmSync(dir, { recursive: true, force: true })
    dir = undefined
  }
})

/** The built agent inside a fresh limited cgroup, its engine the script `engine`; the first restart a minute away. */
const startInCgroup = async (name: string, engine: string): Promise<AgentHandle> => {
  cgroup = createMemoryCgroup(`cgn-oom-${name}-${process.pid}`, LIMIT)
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-oom-"))
  const script = path.join(dir, "engine.mjs")
  fs.writeFileSync(script, engine)
  const { config } = await simAgentConfig({
    // the rendered vLLM arguments follow the script's path: the script ignores them
    engine: { command: [process.execPath, script], restart_backoff_initial: "60s", restart_backoff_max: "60s" }
  })
  agent = await startAgent({ config, awaitReady: false, launcher: cgroup.enter })
  return agent
}

const status = async (a: AgentHandle): Promise<Status> =>
  (await fetch(`${a.adminUrl}/status`)).json() as Promise<Status>

/** Polls /status (bounded) until the first run's exit is there. */
const firstExit = (a: AgentHandle): Promise<{ readonly exit: Exit; readonly body: Status }> =>
  pollUntil(
    "the engine's first exit in /status",
    async () => {
      const body = await status(a)
      const exit = body.engine.exits.find((x) => x.run === 0)
      return exit === undefined ? undefined : { exit, body }
    },
    60_000,
    100
  )

const oomCounter = async (a: AgentHandle): Promise<number> => {
  const page = await (await fetch(`${a.adminUrl}/metrics`)).text()
  const m = /^cgn_agent_engine_oom_kills_total (\S+)$/m.exec(page)
  if (m === null) throw new Error("no cgn_agent_engine_oom_kills_total sample on /metrics")
  return Number(m[1])
}

describe("the kernel's OOM killer ends the engine", () => {
  it.skipIf(!canCreateMemoryCgroup)(
    "the agent lives and says so: /status, NodeHealth's detail, the restart log line, the counter (needs a memory cgroup it can create)",
    async () => {
      const a = await startInCgroup("hog", HOG)
      const { exit, body } = await firstExit(a)
      expect(exit.signal, a.tail()).toBe("SIGKILL")
      expect(exit.oomKills).toBeGreaterThanOrEqual(1)
      expect(exit.memoryLimitBytes).toBe(LIMIT)
      expect(cgroup!.oomKills(), "the kernel's own count").toBeGreaterThanOrEqual(exit.oomKills!)
      const said =
        /signal SIGKILL, killed by the kernel's OOM killer \(\d+ kills? in the agent's memory cgroup, limit 512\.0 MiB\)/
      expect(body.health.engine?.detail).toMatch(said)
      expect(await a.waitForLine((l) => l.includes("restart attempt 1"), 10_000)).toMatch(said)
      expect(await oomCounter(a)).toBeGreaterThanOrEqual(1)
      // the agent, in the same cgroup, was not the OOM killer's choice
      expect(processAlive(a.pid)).toBe(true)
      expect((await fetch(`${a.adminUrl}/healthz`)).status).toBe(200)
      expect(cgroup!.pids()).toContain(a.pid)
    },
    120_000
  )

  it.skipIf(!canCreateMemoryCgroup)(
    "an engine that SIGKILLs itself in the same setup: no OOM kill said or counted (needs a memory cgroup it can create)",
    async () => {
      const a = await startInCgroup("self", SELF_KILL)
      const { exit, body } = await firstExit(a)
      expect(exit).toMatchObject({ signal: "SIGKILL", oomKills: 0, memoryLimitBytes: LIMIT })
      expect(body.health.engine?.detail).toMatch(/ended: exited, signal SIGKILL, after /)
      expect(body.health.engine?.detail).not.toContain("OOM")
      expect(await oomCounter(a)).toBe(0)
      expect(cgroup!.oomKills()).toBe(0)
    },
    120_000
  )
})
