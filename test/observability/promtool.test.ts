// /metrics of a real run (the built agent, the simulator as its vLLM engine, the KV bridge on) passes
// `promtool check metrics` (Prometheus' own linter: Debian package `prometheus`), and every metric the
// shipped Grafana dashboard (examples/grafana/cgn-agent.json) queries exists on that page.
import { spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { createChannel, createClient } from "nice-grpc"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { AgentDefinition } from "../../src/gen/cgn/agent/v1/agent.ts"
import { parsePromText } from "../../src/services/engine/PromText.ts"
import { killAllAgents, repoRoot, simAgentConfig, startAgent } from "../support/agent.ts"
import { freePorts } from "../support/ports.ts"

const PROMTOOL = process.env.PROMTOOL ?? "promtool"
let page = ""
let tmp = ""

beforeAll(async () => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-promtool-"))
  const [kvPort] = await freePorts(1)
  const { config } = await simAgentConfig({ nodeId: "prom-1" })
  // The KV bridge on (no kvcached listening: it retries), so its series are on the page too.
  const kv = { events: true, uds: path.join(tmp, "kvcached.sock"), events_endpoint: `tcp://127.0.0.1:${kvPort}` }
  const agent = await startAgent({ config: { ...config, kv }, readyTimeoutMs: 60_000 })
  const channel = createChannel(agent.grpcAddress)
  try {
    // One finished call, so the histograms and the per-call counters have samples.
    for await (const _ of createClient(AgentDefinition, channel).generate({ requestId: "p", prompt: "a b" })) {
      // drain the stream
    }
  } finally {
    channel.close()
  }
  page = await (await fetch(`${agent.adminUrl}/metrics`)).text()
  await agent.stop("SIGTERM", 30_000)
}, 120_000)

afterAll(async () => {
  await killAllAgents()
  fs.rmSync(tmp, { recursive: true, force: true })
})

describe("/metrics of a real run", () => {
  it("passes promtool check metrics", () => {
    const r = spawnSync(PROMTOOL, ["check", "metrics"], { input: page, encoding: "utf8" })
    if (r.error !== undefined)
      throw new Error(`${PROMTOOL} not found (${r.error.message}): install it, e.g. apt-get install prometheus`)
    expect(`${r.stdout}${r.stderr}`).toBe("")
    expect(r.status).toBe(0)
    // The page was a real one: the agent's series, the process metrics and the KV bridge are on it.
    for (const name of ["cgn_agent_requests_total", "process_cpu_seconds_total", "cgn_agent_kv_events_forwarded_total"])
      expect(page).toContain(`# TYPE ${name} counter`)
  })

  it("has every metric the shipped Grafana dashboard queries", () => {
    const dashboard = JSON.parse(fs.readFileSync(path.join(repoRoot, "examples/grafana/cgn-agent.json"), "utf8")) as {
      panels: Array<{ targets?: Array<{ expr: string }> }>
      templating: { list: Array<{ definition?: string }> }
    }
    const exprs = [
      ...dashboard.panels.flatMap((p) => (p.targets ?? []).map((t) => t.expr)),
      ...dashboard.templating.list.flatMap((v) => (v.definition === undefined ? [] : [v.definition]))
    ]
    const queried = new Set(exprs.flatMap((e) => e.match(/\b(?:cgn_agent|process|nodejs)_[a-zA-Z0-9_]+/g) ?? []))
    expect(queried.size).toBeGreaterThan(20)
    const families = [...page.matchAll(/^# TYPE (\S+) /gm)].map((m) => m[1]!)
    const present = new Set([...families, ...parsePromText(page).map((s) => s.name)])
    expect([...queried].filter((name) => !present.has(name))).toEqual([])
  })
})
