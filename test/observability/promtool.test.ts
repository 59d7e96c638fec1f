// /metrics of a real run (the built agent, the simulator as its vLLM engine, the KV bridge on) passes
// `promtool check metrics` (Prometheus' own linter: Debian package `prometheus`), and every metric the
// shipped Grafana dashboard (examples/grafana/cgn-agent.json) and the shipped rules
// (examples/prometheus/cgn-agent-rules.yaml) read exists on that page, and README names every agent series on it.
import * as fs from "node:fs"
import * as path from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { killAllAgents, repoRoot } from "../support/agent.ts"
import { metricNamesIn, metricNamesOn, promtool, scrapeRealRun, shippedRules } from "../support/promtool.ts"

let page = ""

beforeAll(async () => {
  page = await scrapeRealRun()
}, 120_000)

afterAll(async () => {
  await killAllAgents()
})

describe("/metrics of a real run", () => {
  it("passes promtool check metrics", () => {
    const r = promtool(["check", "metrics"], page)
    expect(r.output).toBe("")
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
    const present = metricNamesOn(page)
    expect([...queried].filter((name) => !present.has(name))).toEqual([])
  })

  it("has every metric the shipped rules read (or they record, or Prometheus' own `up`)", () => {
    // Every family is declared at start whatever the host (GPU, TLS and etcd series without samples on this
    // GPU-less, plaintext, standalone run); the KV bridge's only while it is on, as scrapeRealRun has it.
    const present = metricNamesOn(page)
    expect(present.has("cgn_agent_gpu_lost")).toBe(true)
    expect(present.has("cgn_agent_kvcached_connected")).toBe(true)
    const rules = shippedRules().groups.flatMap((g) => g.rules)
    const recorded = new Set(rules.flatMap((r) => (r.record === undefined ? [] : [r.record])))
    const read = [...new Set(rules.flatMap((r) => metricNamesIn(r.expr)))]
    expect(read.length).toBeGreaterThan(20)
    const unknown = read.filter((name) =>
      name.includes(":") ? !recorded.has(name) : !present.has(name) && name !== "up"
    )
    expect(unknown).toEqual([])
  })

  it("has a 0 sample of the per-model counters from the start, so increase() sees the first stall or token", () => {
    // A series that first appears at 1 shows no increase: the stall alert would miss a process's first stall.
    expect(page).toMatch(/^cgn_agent_engine_stream_stalls_total\{model="m"\} 0$/m)
    expect(page).toMatch(/^cgn_agent_relayed_tokens_total\{model="m"\} [1-9]/m)
    // calls served by an engine that reports usage (the simulator) count none
    expect(page).toMatch(/^cgn_agent_finals_without_usage_total\{model="m"\} 0$/m)
    // and of the engine's OOM kills (CgnAgentEngineOomKilled fires on its first increase)
    expect(page).toMatch(/^cgn_agent_engine_oom_kills_total 0$/m)
    // README: "`engine_restart_requests_total{source}` (... `stall` ... `admin` ...; 0 from the start)"
    expect(page).toMatch(/^cgn_agent_engine_restart_requests_total\{source="stall"\} 0$/m)
    expect(page).toMatch(/^cgn_agent_engine_restart_requests_total\{source="admin"\} 0$/m)
    // a call the caller holds back for agent.client_send_timeout is as rare and as worth an alert on its first
    expect(page).toMatch(/^cgn_agent_client_send_timeouts_total\{model="m"\} 0$/m)
  })

  it("has only agent series README's Metrics paragraph names (a new series needs its words there)", () => {
    const readme = fs.readFileSync(path.join(repoRoot, "README.md"), "utf8")
    const start = readme.indexOf("Metrics (prefix `cgn_agent_`)")
    const paragraph = readme.slice(start, readme.indexOf("\nNaming rules", start))
    const named = new Set([...paragraph.matchAll(/`([a-z_]+)(?:\{[^`]*\})?`/g)].map((m) => m[1]))
    const families = [...page.matchAll(/^# TYPE cgn_agent_(\S+) /gm)].map((m) => m[1]!)
    expect(families.length).toBeGreaterThan(40)
    expect(families.filter((f) => !named.has(f))).toEqual([])
  })
})
