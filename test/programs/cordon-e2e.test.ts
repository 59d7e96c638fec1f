// End-to-end cordon through the built agent (`node dist/main.js run`) on the built simulator, with a real etcd:
// POST /cordon mid-stream lets the stream finish, refuses new calls (UNAVAILABLE naming the cordon), turns the
// Agent service's gRPC health NOT_SERVING (the server's, which the kubelet probes, stays SERVING), /readyz 503
// "cordoned" and the etcd record "cordoned", and leaves the engine running (same pid); POST /uncordon puts the node back; SIGTERM while cordoned drains and exits 0; a restart on the same
// state_dir starts cordoned. Requires dist/ (`npm run build`).
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Etcd3 } from "etcd3"
import { type Channel, type ClientError, createClient } from "nice-grpc"
import { HealthDefinition } from "nice-grpc-server-health"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { NodeHealth } from "../../src/gen/cgn/agent/v1/agent.ts"
import { nodeKey } from "../../src/services/registry/HealthReporter.ts"
import { killAllAgents, requireDist, simAgentConfig, startAgent } from "../support/agent.ts"
import { type EtcdHandle, pollUntil, startEtcd } from "../support/etcd.ts"
import { agentClient, generate, grpcCode } from "../support/generate.ts"

let etcd: EtcdHandle
let kv: Etcd3
let stateDir: string
const channels: Array<Channel> = []

beforeAll(async () => {
  requireDist()
  etcd = await startEtcd()
  kv = new Etcd3({ hosts: etcd.endpoint })
  stateDir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-cordon-e2e-"))
})

afterAll(async () => {
  for (const c of channels) c.close()
  await killAllAgents()
  kv?.close()
  await etcd?.dispose()
  if (stateDir) fs.rmSync(stateDir, { recursive: true, force: true })
})

const words = (n: number) => Array.from({ length: n }, (_, i) => `w${i}`).join(" ")
const prefix = `/cordon-e2e${process.pid}`
const key = nodeKey(prefix, "e2e", "e2e-1")

const start = async (awaitReady: boolean) => {
  const c = await simAgentConfig({
    etcd: [etcd.endpoint],
    etcdPrefix: prefix,
    // 20 ms between tokens: a 100-token stream is in flight for ~2 s, long enough to cordon under it
    simArgs: ["--sim-itl", "20ms"],
    agent: { heartbeat: "300ms", lease_ttl: "5s", drain_timeout: "20s", state_dir: stateDir }
  })
  const agent = await startAgent({ config: c.config, awaitReady })
  const { client, channel } = agentClient(agent.grpcAddress)
  channels.push(channel)
  const health = createClient(HealthDefinition, channel)
  return { agent, client, health, engineUrl: c.engineUrl }
}

const published = (state: string) =>
  pollUntil(`etcd record in state ${state}`, async () => {
    const text = await kv.get(key).string()
    const r = text === null ? undefined : NodeHealth.fromJSON(JSON.parse(text))
    return r?.state === state ? r : undefined
  })

const enginePid = async (engineUrl: string) =>
  ((await (await fetch(`${engineUrl}/sim/state`)).json()) as { pid: number }).pid

const readyz = async (adminUrl: string) => {
  const res = await fetch(`${adminUrl}/readyz`)
  return { status: res.status, text: await res.text() }
}

const post = async (url: string, body?: unknown) => {
  const res = await fetch(url, { method: "POST", ...(body === undefined ? {} : { body: JSON.stringify(body) }) })
  return { status: res.status, json: (await res.json()) as Record<string, unknown> }
}

describe("cordon and uncordon on a running agent", () => {
  it("cordon mid-stream, uncordon, SIGTERM while cordoned, restart starts cordoned", async () => {
    const s = await start(true)
    await published("ready")
    const pid = await enginePid(s.engineUrl)

    const long = generate(s.client, { prompt: words(120), sampling: { maxTokens: 100 } })
    await long.firstDelta
    const cordoned = await post(`${s.agent.adminUrl}/cordon`, { reason: "e2e maintenance" })
    expect(cordoned).toMatchObject({ status: 202, json: { cordoned: true, alreadyCordoned: false } })
    await s.agent.waitForLine(
      (l) => l.includes("cordoned: new Generate calls are refused") && l.includes("e2e maintenance")
    )

    const refused = await generate(s.client, { prompt: "q", sampling: { maxTokens: 4 } }).done
    expect(grpcCode(refused.error)).toBe("UNAVAILABLE")
    expect((refused.error as ClientError).details).toMatch(/cordoned/)
    // routers' view (the Agent service) NOT_SERVING; the kubelet's ("", the probes) SERVING: a working pod
    expect((await s.health.check({ service: "cgn.agent.v1.Agent" })).status).toBe(2) // NOT_SERVING
    expect((await s.health.check({ service: "" })).status).toBe(1) // SERVING
    expect(await readyz(s.agent.adminUrl)).toEqual({ status: 503, text: "cordoned" })
    expect((await published("cordoned")).engine?.phase).toBe("ready")
    const metrics = await (await fetch(`${s.agent.adminUrl}/metrics`)).text()
    expect(metrics).toMatch(/cgn_agent_node_state\{state="cordoned"\} 1/)

    const finished = await long.done
    expect(finished.error).toBeUndefined()
    expect(finished.tokens()).toBe(100)
    expect(await enginePid(s.engineUrl)).toBe(pid)

    expect(await post(`${s.agent.adminUrl}/uncordon`)).toEqual({
      status: 202,
      json: { cordoned: false, wasCordoned: true }
    })
    await published("ready")
    expect(await readyz(s.agent.adminUrl)).toEqual({ status: 200, text: "ready" })
    expect((await s.health.check({ service: "cgn.agent.v1.Agent" })).status).toBe(1) // SERVING
    expect((await s.health.check({ service: "" })).status).toBe(1) // SERVING
    const ok = await generate(s.client, { prompt: "hello there", sampling: { maxTokens: 4 } }).done
    expect(ok.error).toBeUndefined()
    expect(await enginePid(s.engineUrl)).toBe(pid)

    // cordoned again, then SIGTERM: the ordered drain as usual (draining wins), exit 0, the cordon kept on disk
    await post(`${s.agent.adminUrl}/cordon`, { reason: "upgrade" })
    await published("cordoned")
    const exit = await s.agent.stop("SIGTERM", 30_000)
    expect(exit).toEqual({ code: 0, signal: null })
    expect(s.agent.stderrLines.join("\n")).toContain("drain: engine stopped")
    expect(JSON.parse(fs.readFileSync(path.join(stateDir, "cordon.json"), "utf8"))).toMatchObject({ reason: "upgrade" })

    // a restart on the same state_dir: the engine starts and is supervised, the node stays out of traffic
    const again = await start(false)
    await again.agent.waitForLine((l) => l.includes("starting cordoned") && l.includes("upgrade"), 20_000)
    await pollUntil(
      "engine ready behind the cordon",
      async () => {
        const res = await fetch(`${again.agent.adminUrl}/status`).catch(() => undefined)
        const body = res?.ok ? ((await res.json()) as { health: { engine: { phase: string } } }) : undefined
        return body?.health.engine.phase === "ready" ? true : undefined
      },
      20_000
    )
    expect(await readyz(again.agent.adminUrl)).toEqual({ status: 503, text: "cordoned" })
    await published("cordoned")
    expect((await again.health.check({ service: "cgn.agent.v1.Agent" })).status).toBe(2)
    // the kubelet's probes pass on a cordoned pod whose engine is ready: it is not restarted nor held back in a rollout
    expect((await again.health.check({ service: "" })).status).toBe(1)
    const status = (await (await fetch(`${again.agent.adminUrl}/status`)).json()) as { cordon: unknown }
    expect(status.cordon).toMatchObject({ reason: "upgrade" })
    const stillRefused = await generate(again.client, { prompt: "q", sampling: { maxTokens: 4 } }).done
    expect(grpcCode(stillRefused.error)).toBe("UNAVAILABLE")

    expect((await post(`${again.agent.adminUrl}/uncordon`)).json).toEqual({ cordoned: false, wasCordoned: true })
    await published("ready")
    expect(fs.existsSync(path.join(stateDir, "cordon.json"))).toBe(false)
    expect(await again.agent.stop("SIGTERM", 30_000)).toEqual({ code: 0, signal: null })
  }, 120_000)
})
