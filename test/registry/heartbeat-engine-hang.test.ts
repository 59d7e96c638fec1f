/**
 * The heartbeat against a hung engine, in this process: the live HealthReporter and NodeStatus, a real etcd
 * (test/support/etcd.ts) and the live EngineClient scraping an engine /metrics endpoint that stops answering
 * (accepts, never responds: a SIGSTOPped engine). With a 1 s heartbeat (a 3 s lease) the record keeps being
 * written on time and the key never goes: no lease is lost. Before the engine-load sampler (engineLoad.ts) the
 * record's build waited for the scrape (10 s, the client's timeout) under the reporter's lock, the keepalive
 * behind it, and the lease expired.
 */
import * as http from "node:http"
import type { AddressInfo } from "node:net"
import { Effect, Layer, Logger, ManagedRuntime } from "effect"
import { Etcd3 } from "etcd3"
import "nice-grpc"
import { afterAll, beforeAll, expect, it } from "vitest"
import { NodeHealth } from "../../src/gen/cgn/agent/v1/agent.ts"
import { layerFromObject } from "../../src/layers/config/Config.ts"
import * as EngineClientLive from "../../src/layers/engine/EngineClient.ts"
import * as NodeStatusLayer from "../../src/layers/node/NodeStatus.ts"
import { layer as healthReporterLayer } from "../../src/layers/registry/HealthReporter.ts"
import { State } from "../../src/services/engine/EngineState.ts"
import { HealthReporter, nodeKey } from "../../src/services/registry/HealthReporter.ts"
import { EngineProcessControl, testPlan } from "../../src/testing/EngineProcess.ts"
import { type EtcdHandle, pollUntil, startEtcd } from "../support/etcd.ts"
import { nodeStatusDeps } from "../support/nodeStatus.ts"

let etcd: EtcdHandle
let client: Etcd3
beforeAll(async () => {
  etcd = await startEtcd()
  client = new Etcd3({ hosts: etcd.endpoint })
}, 30_000)
afterAll(async () => {
  client?.close()
  await etcd?.dispose()
})

/** An engine's /metrics: answers while `hung` is false; then accepts requests and never answers them. */
const startEngine = async () => {
  const state = { hung: false, requests: 0, open: 0 }
  const server = http.createServer((req, res) => {
    state.requests++
    if (!state.hung) {
      res.end("running 2\nwaiting 1\nkv 0.25\n")
      return
    }
    state.open++
    req.socket.once("close", () => state.open--)
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  const port = (server.address() as AddressInfo).port
  const close = () =>
    new Promise<void>((resolve) => {
      server.closeAllConnections()
      server.close(() => resolve())
    })
  return { state, url: `http://127.0.0.1:${port}/metrics`, close }
}

it("a hung engine neither delays the heartbeat's record nor costs the lease (1 s heartbeat, 3 s lease)", async () => {
  const engine = await startEngine()
  const key = nodeKey("/hang", "c1", "n1")
  const config = layerFromObject({
    models: { m: { hf_repo: "org/m" } },
    cluster: { name: "c1", etcd: [etcd.endpoint], etcd_prefix: "/hang" },
    agent: { node_id: "n1", heartbeat: "1s", advertise_addr: "10.1.2.3:7071" }
  })
  const plan = testPlan({
    metrics: { url: engine.url, names: { running: ["running"], waiting: ["waiting"], kvUsage: ["kv"] } }
  })
  const deps = nodeStatusDeps(config, EngineClientLive.layerFromPlan(plan))
  const live = healthReporterLayer.pipe(
    Layer.provideMerge(NodeStatusLayer.layer().pipe(Layer.provideMerge(deps))),
    Layer.provide(Logger.layer([]))
  )
  const runtime = ManagedRuntime.make(live)
  const deletes: Array<number> = []
  const watcher = await client.watch().key(key).create()
  watcher.on("delete", () => deletes.push(Date.now()))
  const status = () => runtime.runPromise(Effect.flatMap(HealthReporter, (r) => r.status))
  const record = async () => {
    const v = await client.get(key).string()
    return v === null ? undefined : NodeHealth.fromJSON(JSON.parse(v))
  }
  try {
    await runtime.runPromise(Effect.flatMap(EngineProcessControl, (c) => c.set(State.Ready({ since: 1, run: 0 }))))
    await pollUntil("the engine's load in etcd", async () => (await record())?.load?.kvUsage === 0.25)
    const before = await status()

    engine.state.hung = true
    // Six more heartbeats (6 s: two lease TTLs), each written on time, or a lost key: whichever comes first.
    const seq0 = before.sequence
    await pollUntil(
      "six heartbeats written while the engine hangs",
      async () => deletes.length > 0 || (await status()).sequence >= seq0 + 6,
      20_000
    )
    const after = await status()
    expect(deletes).toEqual([])
    expect(after).toMatchObject({ state: "registered", epoch: before.epoch, leasesGranted: 1, leasesLost: 0 })
    expect(after.sinceKeepAliveMs).toBeLessThan(3_000)
    const last = await record()
    expect(last?.state).toBe("ready")
    expect(last?.freshness?.epoch).toBe(before.epoch)
    // the last sample is over three heartbeats old: left out, as for an engine that reports none
    expect(last?.load?.kvUsage).toBe(-1)
    // scrapes went on through the hang, one per heartbeat on the sampler's own schedule (a blocked sampler would
    // show 2: the last answered one and one hung); under a loaded CI machine it can run a scrape or two behind the
    // writer's six heartbeats (a run read 5), so at least 4
    expect(engine.state.requests).toBeGreaterThanOrEqual(4)
    // each hung scrape was given up (its request aborted): none piles up behind the others
    await pollUntil("the hung scrapes aborted", () => engine.state.open <= 1)
  } finally {
    await watcher.cancel()
    await runtime.dispose()
    await engine.close()
  }
}, 40_000)
