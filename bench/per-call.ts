// Per-call CPU of the agent, measured quietly (`node bench/per-call.ts [--calls 3000] [--agent-root DIR ...]`,
// after `npm run build`). The built agent (DIR/dist/main.js run; openai_compat proxying the simulator, standalone)
// runs pinned to CPU 0 with the image's Node flags and environment, as `npm run bench` runs it (before the eleventh
// session: with neither); this process (the client) and the simulator to CPU 1. After 500 warm-up calls, `--calls`
// sequential 1-token Generate calls; the agent's CPU over them (all threads, /proc/PID/task/*/schedstat) divided by
// the calls. Several `--agent-root`s are measured in turn, alternating, `--rounds` times: the way to compare two
// versions of the per-call path when `npm run bench`'s 200-call figure is too noisy (its spread is ±20-40%).
// `--agent-root floor` measures bench/floor.ts (the least a Node gRPC->SSE relay does) in the agent's place.
import { type ChildProcess, spawn } from "node:child_process"
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import * as path from "node:path"
import { parseArgs } from "node:util"
import { createChannel, createClient } from "nice-grpc"
import { AgentDefinition } from "../src/gen/cgn/agent/v1/agent.ts"
import { repoRoot } from "../test/support/agent.ts"
import { pollUntil } from "../test/support/poll.ts"
import { freePorts } from "../test/support/ports.ts"
import { startSim } from "../test/support/sim.ts"
import { imageAgentEnv, imageNodeFlags, relayArgv } from "./agentArgv.ts"

const { values } = parseArgs({
  options: {
    calls: { type: "string", default: "3000" },
    rounds: { type: "string", default: "3" },
    "agent-root": { type: "string", multiple: true, default: [repoRoot] }
  }
})
const calls = Number(values.calls)

/** CPU microseconds of a process, all threads (schedstat is in ns). */
const cpuUs = (pid: number): number => {
  let ns = 0
  for (const t of readdirSync(`/proc/${pid}/task`)) {
    try {
      ns += Number(readFileSync(`/proc/${pid}/task/${t}/schedstat`, "utf8").split(" ")[0])
    } catch {
      // thread gone
    }
  }
  return ns / 1000
}

const measure = async (root: string, engineUrl: string): Promise<{ cpuUs: number; wallMs: number }> => {
  const [grpcPort, adminPort] = await freePorts(2)
  const dir = mkdtempSync(path.join(tmpdir(), "cgn-per-call-"))
  const config = path.join(dir, "agent.toml")
  writeFileSync(
    config,
    [
      "[agent]",
      `listen_grpc = "127.0.0.1:${grpcPort}"`,
      `listen_admin = "127.0.0.1:${adminPort}"`,
      'node_id = "per-call"',
      'log_level = "warn"',
      `state_dir = ${JSON.stringify(dir)}`,
      "[engine]",
      'kind = "openai_compat"',
      `url = "${engineUrl}"`,
      "[models.m]",
      'hf_repo = "org/m"',
      'served_name = "m"'
    ].join("\n")
  )
  const argv = relayArgv({ root, config, grpcPort: grpcPort!, adminPort: adminPort!, engineUrl })
  const agent: ChildProcess = spawn("taskset", ["-c", "0", process.execPath, ...imageNodeFlags(), ...argv], {
    stdio: ["ignore", "inherit", "inherit"],
    env: { ...process.env, ...imageAgentEnv() }
  })
  try {
    await pollUntil(
      "agent ready",
      async () => (await fetch(`http://127.0.0.1:${adminPort}/readyz`)).status === 200,
      60_000
    )
    const client = createClient(AgentDefinition, createChannel(`127.0.0.1:${grpcPort}`))
    const one = async () => {
      for await (const _ of client.generate({ model: "m", prompt: "hi", sampling: { maxTokens: 1 } })) {
        // drain
      }
    }
    for (let i = 0; i < 500; i++) await one()
    const c0 = cpuUs(agent.pid!)
    const t0 = performance.now()
    for (let i = 0; i < calls; i++) await one()
    return { cpuUs: (cpuUs(agent.pid!) - c0) / calls, wallMs: (performance.now() - t0) / calls }
  } finally {
    agent.kill("SIGTERM")
    await new Promise((r) => agent.once("exit", r))
    rmSync(dir, { recursive: true, force: true })
  }
}

spawn("taskset", ["-p", "-c", "1", String(process.pid)], { stdio: "ignore" })
const sim = await startSim({ flavor: "vllm", args: ["serve", "m", "--sim-itl", "0ms", "--sim-ttft", "0ms"] })
spawn("taskset", ["-a", "-p", "-c", "1", String(sim.pid)], { stdio: "ignore" })
try {
  for (let round = 1; round <= Number(values.rounds); round++) {
    for (const root of values["agent-root"]) {
      const r = await measure(root, sim.url)
      console.log(
        `round ${round} ${root}: ${r.cpuUs.toFixed(0)} µs CPU per call, ${r.wallMs.toFixed(3)} ms wall per call`
      )
    }
  }
} finally {
  await sim.stop()
}
