/**
 * promtool (Prometheus' own checker: Debian package `prometheus`, which .ci/run installs) for the tests that lint the
 * agent's /metrics and the shipped rules, and the /metrics page of a real run for them to read.
 */
import { spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { createChannel, createClient } from "nice-grpc"
import { parse } from "yaml"
import { AgentDefinition } from "../../src/gen/cgn/agent/v1/agent.ts"
import { parsePromText } from "../../src/services/engine/PromText.ts"
import { repoRoot, simAgentConfig, startAgent } from "./agent.ts"
import { freePorts } from "./ports.ts"

export const PROMTOOL = process.env.PROMTOOL ?? "promtool"

export interface PromtoolResult {
  readonly status: number | null
  /** stdout and stderr, in that order. */
  readonly output: string
}

/** Runs `promtool args...` with `input` on stdin; throws a message saying how to install it when it is missing. */
export const promtool = (args: ReadonlyArray<string>, input?: string): PromtoolResult => {
  const r = spawnSync(PROMTOOL, args, { input, encoding: "utf8" })
  if (r.error !== undefined)
    throw new Error(`${PROMTOOL} not found (${r.error.message}): install it, e.g. apt-get install prometheus`)
  return { status: r.status, output: `${r.stdout}${r.stderr}` }
}

/**
 * /metrics of a real run: the built agent with the simulator as its vLLM engine and the KV bridge on (no kvcached
 * listening: it retries), scraped after one finished call, so the histograms and the per-call counters have samples.
 * The agent is stopped before this resolves; callers still run `killAllAgents()` in afterAll for a failed start.
 */
export const scrapeRealRun = async (): Promise<string> => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-promtool-"))
  try {
    const [kvPort] = await freePorts(1)
    const { config } = await simAgentConfig({ nodeId: "prom-1" })
    const kv = { events: true, uds: path.join(tmp, "kvcached.sock"), events_endpoint: `tcp://127.0.0.1:${kvPort}` }
    const agent = await startAgent({ config: { ...config, kv }, readyTimeoutMs: 60_000 })
    try {
      const channel = createChannel(agent.grpcAddress)
      try {
        for await (const _ of createClient(AgentDefinition, channel).generate({ requestId: "p", prompt: "a b" })) {
          // drain the stream
        }
      } finally {
        channel.close()
      }
      return await (await fetch(`${agent.adminUrl}/metrics`)).text()
    } finally {
      await agent.stop("SIGTERM", 30_000)
    }
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true })
  }
}

/**
 * Every metric name a /metrics page has: each family it declares (`# TYPE`, also one without samples yet, such as
 * the GPU series on a host without GPUs), each sample's name, and a histogram's `_bucket`, `_sum` and `_count`.
 */
export const metricNamesOn = (page: string): Set<string> => {
  const names = new Set(parsePromText(page).map((s) => s.name))
  for (const [, family, type] of page.matchAll(/^# TYPE (\S+) (\S+)/gm)) {
    names.add(family!)
    if (type === "histogram") for (const suffix of ["_bucket", "_sum", "_count"]) names.add(`${family}${suffix}`)
  }
  return names
}

/** The shipped rules file (examples/prometheus), for promtool and for the tests that read its expressions. */
export const RULES_FILE = path.join(repoRoot, "examples", "prometheus", "cgn-agent-rules.yaml")

export interface Rule {
  readonly alert?: string
  readonly record?: string
  readonly expr: string
  readonly for?: string
  readonly labels?: Record<string, string>
  readonly annotations?: Record<string, string>
}
export interface RuleFile {
  readonly groups: ReadonlyArray<{ readonly name: string; readonly rules: ReadonlyArray<Rule> }>
}

/** The shipped rules file, parsed. */
export const shippedRules = (): RuleFile => parse(fs.readFileSync(RULES_FILE, "utf8")) as RuleFile

// PromQL words that are not metric names (operators, modifiers, the float literals).
const KEYWORDS = new Set(["and", "or", "unless", "bool", "offset", "group_left", "group_right", "inf", "nan"])

/**
 * The metric names an expression selects (recording-rule names included): what is left of it without strings, label
 * matchers, label lists (`by (...)`, `on (...)`), ranges and function calls. promtool's own parser does not print
 * the selectors it read, hence this reading.
 */
export const metricNamesIn = (expr: string): Array<string> => {
  const bare = expr
    .replace(/"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`/g, '""')
    .replace(/\{[^}]*\}/g, " ")
    .replace(/\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, " ")
    .replace(/\[[^\]]*\]/g, " ")
  // A whole identifier (not the tail of a number or a duration such as 15m), not followed by "(" (a function).
  const words = [...bare.matchAll(/(?<![\w:.])[a-zA-Z_:][\w:]*(?![\w:])(?!\s*\()/g)].map((m) => m[0])
  return [...new Set(words.filter((w) => !KEYWORDS.has(w.toLowerCase())))]
}
