/**
 * promtool (Prometheus' own checker: Debian package `prometheus`, which .ci/run installs) for the tests that lint the
 * agent's /metrics and the shipped rules, and the /metrics page of a real run for them to read.
 */
import { spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { createChannel, createClient } from "nice-grpc"
import { AgentDefinition } from "../../src/gen/cgn/agent/v1/agent.ts"
import { parsePromText } from "../../src/services/engine/PromText.ts"
import { simAgentConfig, startAgent } from "./agent.ts"
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
