// Which of the agent's modules one Generate call runs (`node bench/generate-path.ts`, after `npm run build`).
// The built agent (dist/main.js, engine = the simulator, no etcd) runs with V8 coverage on and a preloaded hook
// (bench/coverage-hook.mjs) that writes and resets the counters on SIGUSR2. Two windows, each bracketed by two
// signals: an idle one of the same length (background work: probes, timers) and one holding one Generate call.
// A module counts as touched by the call when a function in it ran in the call's window and not in the idle one.
// Prints the modules (src paths) and their number.
import fs from "node:fs"
import os from "node:os"
import path from "node:path"
import { setTimeout as sleep } from "node:timers/promises"
import { createChannel, createClient } from "nice-grpc"
import { AgentDefinition } from "../src/gen/cgn/agent/v1/agent.ts"
import { repoRoot, simDistEntry, startAgent } from "../test/support/agent.ts"
import { freePort } from "../test/support/ports.ts"

interface FunctionCoverage {
  readonly functionName: string
  readonly ranges: ReadonlyArray<{ readonly count: number }>
}
interface ScriptCoverage {
  readonly url: string
  readonly functions: ReadonlyArray<FunctionCoverage>
}

const covDir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-cov-"))
const hook = path.join(repoRoot, "bench/coverage-hook.mjs")
const agent = await startAgent({
  config: {
    agent: {
      listen_grpc: `127.0.0.1:${await freePort()}`,
      listen_admin: `127.0.0.1:${await freePort()}`,
      node_id: "cov"
    },
    engine: {
      kind: "vllm",
      url: `http://127.0.0.1:${await freePort()}`,
      command: [process.execPath, simDistEntry, "--flavor", "vllm"],
      args: ["--sim-ttft", "1ms", "--sim-itl", "1ms"]
    },
    models: { m: { hf_repo: "org/m" } }
  },
  env: { NODE_V8_COVERAGE: covDir, NODE_OPTIONS: `--import ${hook}` }
})

/** The dist modules with a function that ran since the last signal, read from the file the signal wrote. */
const window = async (work: () => Promise<void>): Promise<Set<string>> => {
  const before = new Set(fs.readdirSync(covDir))
  process.kill(agent.pid, "SIGUSR2")
  await waitNewFile(before)
  const mid = new Set(fs.readdirSync(covDir))
  await work()
  process.kill(agent.pid, "SIGUSR2")
  const file = await waitNewFile(mid)
  const { result } = JSON.parse(fs.readFileSync(path.join(covDir, file), "utf8")) as {
    result: ReadonlyArray<ScriptCoverage>
  }
  const ran = new Set<string>()
  const dist = `file://${path.join(repoRoot, "dist")}/`
  for (const s of result) {
    if (!s.url.startsWith(dist)) continue
    // A module's top-level function always has a range; count only functions (or blocks) that ran.
    if (s.functions.some((f) => f.functionName !== "" && (f.ranges[0]?.count ?? 0) > 0))
      ran.add(`src/${s.url.slice(dist.length).replace(/\.js$/, ".ts")}`)
  }
  return ran
}

const waitNewFile = async (seen: Set<string>): Promise<string> => {
  for (let i = 0; i < 500; i++) {
    const fresh = fs.readdirSync(covDir).filter((f) => !seen.has(f) && f.includes(`-${agent.pid}-`))
    if (fresh.length > 0) {
      await sleep(50) // the file is written in one go; let the write finish
      return fresh[0]!
    }
    await sleep(10)
  }
  throw new Error("no coverage file from the agent")
}

const client = createClient(AgentDefinition, createChannel(agent.grpcAddress))
const generate = async (): Promise<void> => {
  for await (const _ of client.generate({ model: "m", prompt: "hello", sampling: { maxTokens: 4 } })) {
    // drain
  }
}
await generate() // warm: first-call work (lazy imports, pools) is not the steady path
const started = performance.now()
const call = await window(generate)
const callMs = performance.now() - started
const idle = await window(() => sleep(callMs))
await agent.stop("SIGTERM")
fs.rmSync(covDir, { recursive: true, force: true })

const touched = [...call].filter((f) => !idle.has(f)).sort()
console.log(`modules one Generate call runs (not run in an idle window of the same length): ${touched.length}`)
for (const f of touched) console.log(`  ${f}`)
console.log(`background modules (ran in both windows, not counted): ${[...call].filter((f) => idle.has(f)).length}`)
