// End-to-end: the built agent (`node dist/main.js run --config F`) as a child process, the built simulator
// (vLLM flavor) as its engine, a real etcd. Covers Generate through the whole stack, the etcd record, the
// /metrics page, the ordered drain (SIGTERM and POST /drain, within and past drain_timeout), SIGKILL
// (no engine left, the key expires with the lease) and a bad config (exit 2, nothing started).
// Requires dist/ (`npm run build`; `npm test` builds first). etcd is started once for the file.
import { Etcd3 } from "etcd3"
import { type Channel, type ClientError, createClient } from "nice-grpc"
import { HealthDefinition } from "nice-grpc-server-health"
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { type AgentClient, NodeHealth } from "../../src/gen/cgn/agent/v1/agent.ts"
import { parsePromText } from "../../src/services/engine/PromText.ts"
import { nodeKey } from "../../src/services/registry/HealthReporter.ts"
import {
  type AgentHandle,
  killAllAgents,
  processAlive,
  requireDist,
  type SimAgentOptions,
  simAgentConfig,
  startAgent
} from "../support/agent.ts"
import { type EtcdHandle, pollUntil, startEtcd } from "../support/etcd.ts"
import { agentClient, generate, grpcCode } from "../support/generate.ts"

let etcd: EtcdHandle
let kv: Etcd3
let prefixCounter = 0
const channels: Array<Channel> = []

beforeAll(async () => {
  requireDist()
  etcd = await startEtcd()
  kv = new Etcd3({ hosts: etcd.endpoint })
})

afterAll(async () => {
  for (const c of channels) c.close()
  await killAllAgents()
  kv?.close()
  await etcd?.dispose()
})

const words = (n: number) => Array.from({ length: n }, (_, i) => `w${i}`).join(" ")

const clientFor = (agent: AgentHandle): { client: AgentClient; channel: Channel } => {
  const c = agentClient(agent.grpcAddress)
  channels.push(c.channel)
  return c
}

const simState = async (engineUrl: string) => {
  const res = await fetch(`${engineUrl}/sim/state`)
  return (await res.json()) as { pid: number; grandchildPid: number | null; running: number }
}

const readRecord = async (key: string): Promise<NodeHealth | undefined> => {
  const text = await kv.get(key).string()
  return text === null ? undefined : NodeHealth.fromJSON(JSON.parse(text))
}

const uniquePrefix = () => `/e2e${process.pid}-${++prefixCounter}`

/** Starts an agent on the simulator, registered in the file's etcd under a fresh prefix. */
const startSimAgent = async (o: SimAgentOptions = {}) => {
  const prefix = uniquePrefix()
  const c = await simAgentConfig({ etcd: [etcd.endpoint], etcdPrefix: prefix, ...o })
  const agent = await startAgent({ config: c.config })
  return { agent, engineUrl: c.engineUrl, key: nodeKey(prefix, "e2e", o.nodeId ?? "e2e-1"), ...clientFor(agent) }
}

const untilPublished = (key: string, state: string) =>
  pollUntil(`etcd record ${key} in state ${state}`, async () => {
    const r = await readRecord(key)
    return r?.state === state ? r : undefined
  })

const untilGone = (what: string, pids: ReadonlyArray<number>) =>
  pollUntil(what, () => (pids.every((p) => !processAlive(p)) ? true : undefined), 10_000)

describe("a running agent", () => {
  let agent: AgentHandle
  let client: AgentClient
  let key: string
  let engineUrl: string

  beforeAll(async () => {
    const s = await startSimAgent({
      simArgs: ["--sim-itl", "2ms"],
      agent: { heartbeat: "300ms", lease_ttl: "3s" }
    })
    agent = s.agent
    client = s.client
    key = s.key
    engineUrl = s.engineUrl
  })
  afterAll(() => killAllAgents())

  it("streams Generate through the agent to the simulator: deltas, then a final with reason and usage", async () => {
    const { done } = generate(client, { requestId: "e2e-req-1", prompt: words(12), sampling: { maxTokens: 8 } })
    const r = await done
    expect(r.error).toBeUndefined()
    expect(r.deltas.length).toBeGreaterThan(0)
    expect(r.tokens()).toBe(8)
    expect(r.text().trim().split(/\s+/)).toEqual(words(8).split(" "))
    expect(r.final?.finishReason).toBe("length")
    expect(r.final?.usage).toEqual({
      promptTokens: expect.any(Number),
      completionTokens: 8,
      totalTokens: expect.any(Number)
    })
    expect(r.final?.usage?.totalTokens).toBe((r.final?.usage?.promptTokens ?? 0) + 8)
    expect(r.final?.nodeId).toBe("e2e-1")
    expect(r.final?.requestId).toBe("e2e-req-1")

    const echo = await generate(client, { prompt: "hello there", sampling: { maxTokens: 50 } }).done
    expect(echo.text().trim()).toBe("hello there")
    expect(echo.final?.finishReason).toBe("stop")
  })

  it("keeps a fresh NodeHealth in etcd under a lease with the configured TTL", async () => {
    const first = await untilPublished(key, "ready")
    expect(first.nodeId).toBe("e2e-1")
    expect(first.cluster).toBe("e2e")
    expect(first.advertiseAddr).toBe(agent.grpcAddress)
    expect(first.engine?.kind).toBe("vllm")
    expect(first.engine?.model).toBe("m")
    expect(first.engine?.phase).toBe("ready")
    expect(first.freshness?.epoch).toMatch(/^[0-9a-f]+$/)
    const seq1 = Number(first.freshness?.sequence)
    const second = await pollUntil("a newer heartbeat write", async () => {
      const r = await readRecord(key)
      return r !== undefined && Number(r.freshness?.sequence) > seq1 ? r : undefined
    })
    expect(second.freshness?.epoch).toBe(first.freshness?.epoch)
    // the writer's heartbeat, to judge the record's age by
    expect(second.freshness?.heartbeatMs).toBe(300)
    const writtenAt = Date.parse(second.freshness?.writtenAt ?? "")
    expect(Math.abs(Date.now() - writtenAt)).toBeLessThan(3_000)

    const res = await kv.get(key).exec()
    const lease = res.kvs[0]?.lease
    expect(lease).toBeDefined()
    expect(lease).not.toBe("0")
    expect(
      BigInt(lease ?? "0")
        .toString(16)
        .padStart(16, "0")
    ).toBe(second.freshness?.epoch)
    const ttl = await kv.leaseClient.leaseTimeToLive({ ID: lease ?? "0" })
    expect(Number(ttl.grantedTTL)).toBe(3)
    expect(Number(ttl.TTL)).toBeGreaterThan(0)

    // GetNodeHealth carries the freshness of the last record written: the same epoch, a sequence at least the one read
    const answered = await client.getNodeHealth({})
    expect(answered.freshness?.epoch).toBe(second.freshness?.epoch)
    expect(answered.freshness?.sequence).toBeGreaterThanOrEqual(Number(second.freshness?.sequence))

    const status = (await (await fetch(`${agent.adminUrl}/status`)).json()) as {
      registration: { state: string; key: string }
      health: { state: string }
      engine: { state: { _tag: string }; restarts: number; pid: number }
      tls: unknown
    }
    expect(status.registration).toMatchObject({ state: "registered", key })
    expect(status.tls).toEqual({ enabled: false, generation: 0 }) // plaintext here; test/tls covers mTLS
    expect(status.health.state).toBe("ready")
    // The pid /status names is the engine's own (the simulator reports it), not the guard's.
    expect(status.engine).toMatchObject({ state: { _tag: "Ready" }, restarts: 0, pid: (await simState(engineUrl)).pid })
  })

  it("serves /metrics in Prometheus text with the engine's signals, request counts and process metrics", async () => {
    await generate(client, { prompt: words(4), sampling: { maxTokens: 4 } }).done
    // The engine's gauges are those of the last heartbeat's scrape (every 300 ms): one taken while the call ran reads
    // it running. Read until a scrape after the call's end shows the engine idle (bounded).
    const scrape = async () => {
      const res = await fetch(`${agent.adminUrl}/metrics`)
      expect(res.status).toBe(200)
      expect(res.headers.get("content-type")).toMatch(/text\/plain/)
      return parsePromText(await res.text())
    }
    const samples = await pollUntil("a scrape of the engine after the call", async () => {
      const got = await scrape()
      return got.some((s) => s.name === "cgn_agent_engine_running_requests" && s.value === 0) ? got : undefined
    })
    const names = new Set(samples.map((s) => s.name))
    for (const n of [
      "cgn_agent_engine_running_requests",
      "cgn_agent_engine_waiting_requests",
      "cgn_agent_engine_kv_cache_usage_ratio",
      "process_cpu_seconds_total",
      "process_resident_memory_bytes",
      "cgn_agent_engine_restarts_total"
    ]) {
      expect(names, n).toContain(n)
    }
    const value = (name: string, labels: Record<string, string> = {}) =>
      samples.find((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v))?.value
    expect(value("cgn_agent_engine_running_requests")).toBe(0)
    expect(value("cgn_agent_engine_waiting_requests")).toBe(0)
    const kvUsage = value("cgn_agent_engine_kv_cache_usage_ratio") ?? -1
    expect(kvUsage).toBeGreaterThanOrEqual(0)
    expect(kvUsage).toBeLessThanOrEqual(1)
    expect(value("cgn_agent_requests_total", { role: "both", model: "m", grpc_code: "OK" })).toBeGreaterThanOrEqual(3)
    expect(value("cgn_agent_engine_state", { state: "ready" })).toBe(1)
    // The node's own state (what routers and /readyz go by), wired by the daemon.
    expect(value("cgn_agent_node_state", { state: "ready" })).toBe(1)
    expect(value("cgn_agent_node_state", { state: "unhealthy" })).toBe(0)
    expect(value("process_cpu_seconds_total")).toBeGreaterThan(0)
  })
})

describe("stopping the agent", () => {
  afterEach(() => killAllAgents())

  it("SIGTERM mid-stream: the stream completes, new calls get UNAVAILABLE, key deleted, engine gone, exit 0", async () => {
    const s = await startSimAgent({
      simArgs: ["--sim-itl", "40ms", "--sim-fork-grandchild"],
      agent: { heartbeat: "300ms", lease_ttl: "5s", drain_timeout: "20s" }
    })
    await untilPublished(s.key, "ready")
    const sim = await simState(s.engineUrl)
    expect(sim.grandchildPid).toEqual(expect.any(Number))
    const enginePids = [sim.pid, sim.grandchildPid ?? -1]
    expect(enginePids.every(processAlive)).toBe(true)

    const events: Array<{ type: string; state?: string }> = []
    const watcher = await kv.watch().key(s.key).create()
    const deleted = new Promise<void>((resolve) => {
      watcher.on("put", (kvPair) => {
        events.push({ type: "put", state: NodeHealth.fromJSON(JSON.parse(kvPair.value.toString())).state })
      })
      watcher.on("delete", () => {
        events.push({ type: "delete" })
        resolve()
      })
    })

    try {
      const stream = generate(s.client, { prompt: words(60), sampling: { maxTokens: 40 } })
      await stream.firstDelta
      expect(stream.out.final).toBeUndefined()
      process.kill(s.agent.pid, "SIGTERM")
      await s.agent.waitForLine((l) => l.includes("drain: started"))

      // During the drain: readiness off, gRPC health NOT_SERVING, new calls refused.
      const readyz = await fetch(`${s.agent.adminUrl}/readyz`)
      expect(readyz.status).toBe(503)
      const health = await createClient(HealthDefinition, s.channel).check({ service: "" })
      expect(health.status).toBe(2)
      const refused = await generate(clientFor(s.agent).client, { prompt: "late", sampling: { maxTokens: 2 } }).done
      expect(grpcCode(refused.error)).toBe("UNAVAILABLE")
      expect(refused.final).toBeUndefined()
      expect(stream.out.final, "the first stream was still in flight").toBeUndefined()

      const r = await stream.done
      expect(r.error).toBeUndefined()
      expect(r.tokens()).toBe(40)
      expect(r.final?.finishReason).toBe("length")
      expect(r.final?.usage?.completionTokens).toBe(40)

      const exit = await s.agent.exited
      expect(exit, s.agent.tail()).toEqual({ code: 0, signal: null })
      await deleted
      expect(await readRecord(s.key)).toBeUndefined()
      expect(events.some((e) => e.type === "put" && e.state === "draining")).toBe(true)
      expect(events.at(-1)).toEqual({ type: "delete" })
      await untilGone("engine and grandchild gone", enginePids)
      const logs = s.agent.stderrLines.join("\n")
      expect(logs).toContain("drain: engine stopped")
      expect(logs).not.toContain("ending in-flight streams")
    } finally {
      await watcher.cancel()
    }
  })

  it("SIGKILL: no engine process is left, and the key expires with the lease", async () => {
    const s = await startSimAgent({
      simArgs: ["--sim-fork-grandchild"],
      // 5 s, not 1: on a loaded host a 1 s lease ran out between the agent's last keepalive and the read below,
      // which then cannot tell an expiry from a revoke
      agent: { heartbeat: "300ms", lease_ttl: "5s" }
    })
    await untilPublished(s.key, "ready")
    const sim = await simState(s.engineUrl)
    const enginePids = [sim.pid, sim.grandchildPid ?? -1]
    expect(enginePids.every(processAlive)).toBe(true)

    const exit = await s.agent.stop("SIGKILL")
    expect(exit.signal).toBe("SIGKILL")
    // Nobody revoked the lease: the key outlives the agent until the lease's TTL runs out.
    expect(await readRecord(s.key)).toBeDefined()
    await untilGone("engine and grandchild gone after SIGKILL of the agent", enginePids)
    await pollUntil(
      "the node key expired",
      async () => ((await readRecord(s.key)) === undefined ? true : undefined),
      15_000
    )
  })

  it("POST /drain: the same ordered drain, exit 0; a call still queued is refused at once, retryable", async () => {
    const s = await startSimAgent({
      simArgs: ["--sim-itl", "30ms"],
      agent: { heartbeat: "300ms", lease_ttl: "5s", drain_timeout: "20s", max_inflight: 1 }
    })
    await untilPublished(s.key, "ready")
    const sim = await simState(s.engineUrl)
    const stream = generate(s.client, { prompt: words(60), sampling: { maxTokens: 40 } })
    await stream.firstDelta
    // a second call waits in the queue behind it (max_inflight 1)
    const queuedTrailer: { reason?: string | undefined; retryable?: string | undefined } = {}
    const queued = generate(
      s.client,
      { prompt: words(5), sampling: { maxTokens: 4 } },
      {
        onTrailer: (t) =>
          Object.assign(queuedTrailer, { reason: t.get("cgn-reason"), retryable: t.get("cgn-retryable") })
      }
    )
    await pollUntil("the second call queued", async () => {
      const st = (await (await fetch(`${s.agent.adminUrl}/status`)).json()) as { admission?: { queued?: number } }
      return st.admission?.queued === 1 ? true : undefined
    })

    const res = await fetch(`${s.agent.adminUrl}/drain`, { method: "POST" })
    expect(res.status).toBe(202)
    expect(await res.json()).toEqual({ draining: true, alreadyDraining: false })
    const again = await fetch(`${s.agent.adminUrl}/drain`, { method: "POST" })
    expect(await again.json()).toEqual({ draining: true, alreadyDraining: true })
    // a new call is refused for the drain, as the router's retry rule reads it, and counted (the walkthrough saw
    // cgn-reason not_serving and the drain's counter at 0)
    const trailer: { reason?: string | undefined; retryable?: string | undefined } = {}
    const refused = await generate(
      s.client,
      { prompt: words(3), sampling: { maxTokens: 2 } },
      { onTrailer: (t) => Object.assign(trailer, { reason: t.get("cgn-reason"), retryable: t.get("cgn-retryable") }) }
    ).done
    expect(grpcCode(refused.error)).toBe("UNAVAILABLE")
    expect(trailer).toEqual({ reason: "draining", retryable: "true" })
    // the queued call was not started to be cut at drain_timeout: refused as the drain began, nothing streamed
    const q = await queued.done
    expect(grpcCode(q.error)).toBe("UNAVAILABLE")
    expect(q.tokens()).toBe(0)
    expect(queuedTrailer).toEqual({ reason: "draining", retryable: "true" })
    const refusals = parsePromText(await (await fetch(`${s.agent.adminUrl}/metrics`)).text()).find(
      (m) => m.name === "cgn_agent_admission_refusals_total" && m.labels.reason === "draining"
    )
    expect(refusals?.value).toBe(2)

    const r = await stream.done
    expect(r.error).toBeUndefined()
    expect(r.tokens()).toBe(40)
    expect(r.final?.finishReason).toBe("length")
    const exit = await s.agent.exited
    expect(exit, s.agent.tail()).toEqual({ code: 0, signal: null })
    expect(await readRecord(s.key)).toBeUndefined()
    await untilGone("engine gone", [sim.pid])
    expect(s.agent.stderrLines.join("\n")).toContain('"why":"POST /drain"')
  })

  it("drain_timeout exceeded: the long stream ends with UNAVAILABLE, the process still exits 0", async () => {
    const s = await startSimAgent({
      simArgs: ["--sim-itl", "50ms"],
      agent: { heartbeat: "300ms", lease_ttl: "5s", drain_timeout: "1s" }
    })
    const sim = await simState(s.engineUrl)
    const stream = generate(s.client, { prompt: words(200), sampling: { maxTokens: 200 } })
    await stream.firstDelta
    const signalledAt = Date.now()
    process.kill(s.agent.pid, "SIGTERM")

    const r = await stream.done
    expect(grpcCode(r.error)).toBe("UNAVAILABLE")
    expect((r.error as ClientError).details).toMatch(/drain/)
    expect(r.final).toBeUndefined()
    expect(r.tokens()).toBeGreaterThan(0)
    expect(r.tokens()).toBeLessThan(200)
    expect(Date.now() - signalledAt).toBeLessThan(8_000)

    const exit = await s.agent.exited
    expect(exit, s.agent.tail()).toEqual({ code: 0, signal: null })
    expect(await readRecord(s.key)).toBeUndefined()
    await untilGone("engine gone", [sim.pid])
    expect(s.agent.stderrLines.join("\n")).toContain("ending in-flight streams")
    const cut = s.agent.logs().find((l) => l.msg === "drain: ending in-flight streams")
    expect(cut?.cut_by).toBe("agent.drain_timeout (1s)")
  })

  it("a second SIGTERM takes the fast path: the wait for in-flight streams is cut short, exit 0", async () => {
    const s = await startSimAgent({
      simArgs: ["--sim-itl", "50ms"],
      agent: { heartbeat: "300ms", lease_ttl: "5s", drain_timeout: "60s" }
    })
    const sim = await simState(s.engineUrl)
    const stream = generate(s.client, { prompt: words(400), sampling: { maxTokens: 400 } })
    await stream.firstDelta
    process.kill(s.agent.pid, "SIGTERM")
    await s.agent.waitForLine((l) => l.includes("drain: started"), 10_000)
    const secondAt = Date.now()
    process.kill(s.agent.pid, "SIGTERM")

    const r = await stream.done
    expect(grpcCode(r.error)).toBe("UNAVAILABLE")
    expect(r.tokens()).toBeLessThan(400)
    const exit = await s.agent.exited
    expect(exit, s.agent.tail()).toEqual({ code: 0, signal: null })
    // 400 tokens at 50 ms would hold the drain for 20 s; the second signal ends it well before.
    expect(Date.now() - secondAt).toBeLessThan(10_000)
    // the log says what cut the wait short (it said nothing of the second signal)
    const cut = s.agent.logs().find((l) => l.msg === "drain: ending in-flight streams")
    expect(cut?.cut_by).toBe("a second SIGTERM or SIGINT")
    expect(await readRecord(s.key)).toBeUndefined()
    await untilGone("engine gone", [sim.pid])
  })
})

describe("a bad config", () => {
  afterEach(() => killAllAgents())

  it("exits 2 naming the key path, and starts nothing", async () => {
    const prefix = uniquePrefix()
    const c = await simAgentConfig({ etcd: [etcd.endpoint], etcdPrefix: prefix })
    const agentSection = c.config.agent as Record<string, unknown>
    const config = { ...c.config, agent: { ...agentSection, drain_timeout: "soon" } }
    const agent = await startAgent({ config, awaitReady: false })
    const exit = await agent.exited
    expect(exit).toEqual({ code: 2, signal: null })
    const stderr = agent.stderrLines.join("\n")
    expect(stderr).toContain("agent.drain_timeout")
    expect(stderr).toContain(agent.configPath)
    expect(stderr).not.toContain("EngineProcess")
    for (const url of [`${agent.adminUrl}/healthz`, `${c.engineUrl}/health`]) {
      await expect(fetch(url, { signal: AbortSignal.timeout(1_000) }), url).rejects.toThrow()
    }
    expect(await kv.getAll().prefix(prefix).keys()).toEqual([])
  })
})
