/**
 * HealthReporter against a real etcd (test/support/etcd.ts): registration with lease and TTL, heartbeat
 * rewrites with a growing sequence, a router-style watcher, state changes written at once, recovery from
 * a paused, killed or revoked etcd lease, duplicate node ids, SIGKILLed agent, clean stop, standalone.
 */
import { spawn } from "node:child_process"
import * as fs from "node:fs/promises"
import * as net from "node:net"
import * as path from "node:path"
import { Effect, Exit, Layer, Logger, ManagedRuntime } from "effect"
import { Etcd3 } from "etcd3"
// As the daemon's bundle does: nice-grpc, once loaded, bounds every grpc-js connection attempt in the process
// (its connect-timeout patch, which reads grpc.min_reconnect_backoff_ms as that bound), etcd3's included.
import "nice-grpc"
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { NodeHealth } from "../../src/gen/cgn/agent/v1/agent.ts"
import { layerFromObject } from "../../src/layers/config/Config.ts"
import { layer as healthReporterLayer } from "../../src/layers/registry/HealthReporter.ts"
import type { NodeState } from "../../src/services/node/NodeStatus.ts"
import {
  epochOf,
  HealthReporter,
  nodeKey,
  nodesPrefix,
  type RegistrationStatus
} from "../../src/services/registry/HealthReporter.ts"
import { NodeStatusTest, layerTest as nodeStatusTest } from "../../src/testing/NodeStatus.ts"
import { type EtcdHandle, pollUntil, startEtcd } from "../support/etcd.ts"
import { freePort } from "../support/ports.ts"

let unhandled = 0
const onUnhandled = () => {
  unhandled++
}
process.on("unhandledRejection", onUnhandled)

let shared: EtcdHandle
let client: Etcd3
let counter = 0
const cleanups: Array<() => Promise<unknown>> = []

beforeAll(async () => {
  shared = await startEtcd()
  client = new Etcd3({ hosts: shared.endpoint })
}, 30_000)

afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => undefined)
})

afterAll(async () => {
  client?.close()
  await shared?.dispose()
  process.off("unhandledRejection", onUnhandled)
})

interface Opts {
  readonly endpoint?: string
  readonly nodeId?: string
  readonly prefix?: string
  readonly heartbeat?: string
  readonly leaseTtl?: string
  readonly damping?: number
  readonly advertise?: string
  readonly etcd?: ReadonlyArray<string>
  readonly auth?: { readonly username: string; readonly password: string }
}

const configObject = (o: Opts) => ({
  cluster: {
    name: "c1",
    etcd: o.etcd ?? [o.endpoint ?? shared.endpoint],
    etcd_prefix: o.prefix ?? "/cgn",
    ...(o.auth ? { etcd_username: o.auth.username, etcd_password: o.auth.password } : {})
  },
  agent: {
    node_id: o.nodeId ?? "n1",
    heartbeat: o.heartbeat ?? "200ms",
    lease_ttl: o.leaseTtl ?? "1s",
    health_damping: o.damping ?? 2
  },
  models: { m: { hf_repo: "org/m" } }
})

/** A reporter in this process, built before this returns; closed after the test unless the test closes it first. */
const startReporter = async (o: Opts) => {
  const status = nodeStatusTest({
    nodeId: o.nodeId ?? "n1",
    cluster: "c1",
    advertiseAddr: o.advertise ?? "127.0.0.1:7071"
  })
  // Warnings and errors, as "Warn message" lines, for the tests that check what an operator is told.
  const logs: Array<string> = []
  const logger = Logger.make(({ logLevel, message }) => {
    if (logLevel === "Warn" || logLevel === "Error")
      logs.push(
        `${logLevel} ${[message]
          .flat()
          .filter((m) => typeof m === "string")
          .join(" ")}`
      )
  })
  const live = healthReporterLayer.pipe(
    Layer.provideMerge(Layer.mergeAll(layerFromObject(configObject(o)), status)),
    Layer.provide(Logger.layer([logger]))
  )
  const runtime = ManagedRuntime.make(live)
  let closed = false
  const close = async () => {
    if (closed) return
    closed = true
    await runtime.dispose()
  }
  cleanups.push(close)
  await runtime.runPromise(Effect.asVoid(HealthReporter))
  return {
    status: () => runtime.runPromise(Effect.flatMap(HealthReporter, (r) => r.status)),
    setState: (s: NodeState) => runtime.runPromise(Effect.flatMap(NodeStatusTest, (c) => c.setState(s))),
    /** The node state and the engine phase behind it, as the live NodeStatus would show them together. */
    setEngine: (state: NodeState, phase: string) =>
      runtime.runPromise(
        Effect.flatMap(NodeStatusTest, (c) => c.update((h) => ({ ...h, state, engine: { ...h.engine!, phase } })))
      ),
    flush: () => runtime.runPromise(Effect.exit(Effect.flatMap(HealthReporter, (r) => r.flush))),
    markDraining: () => runtime.runPromise(Effect.exit(Effect.flatMap(HealthReporter, (r) => r.markDraining))),
    logs,
    close
  }
}

/**
 * A TCP proxy to `endpoint` that holds every chunk `delayMs` in each direction (a distant etcd, or one behind a
 * slow TLS terminator). Order is kept: chunks leave in the order they came.
 */
const slowProxy = async (endpoint: string, delayMs: number) => {
  const target = new URL(endpoint)
  const sockets = new Set<net.Socket>()
  const later = (to: net.Socket) => (chunk: Buffer) => {
    setTimeout(() => {
      if (!to.destroyed) to.write(chunk)
    }, delayMs)
  }
  const server = net.createServer((client) => {
    const upstream = net.connect(Number(target.port), target.hostname)
    for (const s of [client, upstream]) {
      sockets.add(s)
      s.on("error", () => {
        client.destroy()
        upstream.destroy()
      })
      s.on("close", () => sockets.delete(s))
    }
    client.on("data", later(upstream))
    upstream.on("data", later(client))
  })
  const port = await new Promise<number>((resolve) =>
    server.listen(0, "127.0.0.1", () => resolve((server.address() as net.AddressInfo).port))
  )
  return {
    endpoint: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy()
        server.close(() => resolve())
      })
  }
}

/** An etcd of the test's own with auth on (user root, password "s3cret") and a root client of it. */
const authEtcd = async () => {
  const etcd = await startEtcd()
  cleanups.push(() => etcd.dispose())
  const setup = new Etcd3({ hosts: etcd.endpoint })
  await setup.role("root").create()
  await setup.user("root").create("s3cret")
  await setup.user("root").addRole("root")
  await setup.auth.authEnable({})
  setup.close()
  const admin = new Etcd3({ hosts: etcd.endpoint, auth: { username: "root", password: "s3cret" } })
  cleanups.push(async () => admin.close())
  return { etcd, admin }
}

/** An etcd of the test's own (for tests that stop, wipe or alarm it) and a client of it, both closed after the test. */
const ownEtcd = async () => {
  const etcd = await startEtcd()
  cleanups.push(() => etcd.dispose())
  const local = new Etcd3({ hosts: etcd.endpoint })
  cleanups.push(async () => local.close())
  return { etcd, local }
}

const uniquePrefix = () => `/t${process.pid}-${++counter}`
const readRecord = async (etcd: Etcd3, key: string) => {
  const text = await etcd.get(key).string()
  return text === null ? undefined : NodeHealth.fromJSON(JSON.parse(text))
}
const untilState = (
  r: { status: () => Promise<RegistrationStatus> },
  state: RegistrationStatus["state"],
  timeoutMs = 10_000,
  extra: (s: RegistrationStatus) => boolean = () => true
) =>
  pollUntil(
    `reporter state ${state}`,
    async () => {
      const s = await r.status()
      return s.state === state && extra(s) ? s : undefined
    },
    timeoutMs
  )

describe("HealthReporter against a real etcd", () => {
  it("registers the key under its lease with the configured TTL", async () => {
    const prefix = uniquePrefix()
    const key = nodeKey(prefix, "c1", "n1")
    const r = await startReporter({ prefix, leaseTtl: "2s" })
    const st = await untilState(r, "registered")
    expect(st.key).toBe(key)
    const kv = await pollUntil("key", async () => (await client.get(key).exec()).kvs[0])
    expect(kv.lease).toBe(st.leaseId)
    const ttl = await client.leaseClient.leaseTimeToLive({ ID: st.leaseId!, keys: true })
    expect(Number(ttl.grantedTTL)).toBe(2)
    expect(ttl.keys.map((k) => k.toString())).toContain(key)
    const rec = NodeHealth.fromJSON(JSON.parse(kv.value.toString()))
    expect(rec.nodeId).toBe("n1")
    expect(rec.cluster).toBe("c1")
    expect(rec.freshness?.epoch).toBe(epochOf(st.leaseId!))
    expect(rec.freshness?.epoch).toBe(st.epoch)
    expect(rec.freshness?.sequence).toBeGreaterThanOrEqual(1)
    expect(Number.isNaN(Date.parse(rec.freshness?.writtenAt ?? ""))).toBe(false)
    expect(st.leaseAgeMs).toBeGreaterThanOrEqual(0)
  }, 20_000)

  it("a router-style watcher sees registration, heartbeat updates with a growing sequence, and deletion at once on a clean stop", async () => {
    const prefix = uniquePrefix()
    const key = nodeKey(prefix, "c1", "n1")
    const events: Array<{ type: "put" | "delete"; version: string; record?: NodeHealth; at: number }> = []
    const watcher = await client.watch().prefix(nodesPrefix(prefix, "c1")).create()
    cleanups.push(() => watcher.cancel())
    watcher.on("put", (kv) =>
      events.push({
        type: "put",
        version: kv.version,
        record: NodeHealth.fromJSON(JSON.parse(kv.value.toString())),
        at: Date.now()
      })
    )
    watcher.on("delete", (kv) => events.push({ type: "delete", version: kv.version, at: Date.now() }))
    // A long TTL, so a deletion right after close() can only come from the revoke.
    const r = await startReporter({ prefix, leaseTtl: "10s" })
    await pollUntil("5 puts", () => (events.filter((e) => e.type === "put").length >= 5 ? true : undefined))
    const puts = events.filter((e) => e.type === "put")
    expect(puts[0]!.version).toBe("1") // created, not overwritten
    const seqs = puts.map((e) => e.record!.freshness!.sequence)
    for (let i = 1; i < seqs.length; i++) expect(seqs[i]!).toBeGreaterThan(seqs[i - 1]!)
    expect(new Set(puts.map((e) => e.record!.freshness!.epoch)).size).toBe(1)
    const writtenAt = puts.map((e) => Date.parse(e.record!.freshness!.writtenAt))
    for (let i = 1; i < writtenAt.length; i++) expect(writtenAt[i]!).toBeGreaterThan(writtenAt[i - 1]!)
    const closedAt = Date.now()
    await r.close()
    expect(await client.get(key).string()).toBeNull()
    const del = await pollUntil("delete event", () => events.find((e) => e.type === "delete"))
    // Well under the 10 s TTL (so it was the revoke), with room for a loaded CI machine.
    expect(del.at - closedAt).toBeLessThan(5000)
    const lastPut = events.filter((e) => e.type === "put").at(-1)!
    expect(lastPut.record!.state).toBe("draining")
  }, 20_000)

  // A chaos soak (llama-server SIGSTOPped): after 3 failed liveness probes the engine was being torn down and every
  // call refused, yet etcd said `ready` (engine phase `unhealthy`) until `starting` was written: the verdict was damped.
  it("a liveness teardown, ready after it and draining reach etcd at once, whatever agent.health_damping (30 s heartbeat)", async () => {
    const prefix = uniquePrefix()
    const key = nodeKey(prefix, "c1", "n1")
    const r = await startReporter({ prefix, heartbeat: "30s", leaseTtl: "90s", damping: 3 })
    await untilState(r, "registered")
    const published = async (state: string, phase?: string) => {
      const t = performance.now()
      const rec = await pollUntil(
        `${state} in etcd`,
        async () => {
          const rec = await readRecord(client, key)
          return rec?.state === state && (phase === undefined || rec.engine?.phase === phase) ? rec : undefined
        },
        3_000
      )
      return { rec, lagMs: performance.now() - t }
    }
    await r.setEngine("ready", "ready")
    await published("ready", "ready")
    // liveness_failures probes failed: the supervisor tears the run down (layers/engine/watch.ts)
    await r.setEngine("unhealthy", "unhealthy")
    const teardown = await published("unhealthy", "unhealthy")
    await r.setEngine("ready", "ready")
    const ready = await published("ready", "ready")
    await r.setState("draining")
    const draining = await published("draining")
    // A heartbeat-driven write would take 30 s; the bound is a tenth of that on a loaded machine.
    expect(Math.max(teardown.lagMs, ready.lagMs, draining.lagMs)).toBeLessThan(3_000)
    // one write per change after the first ready, none of them held back for a heartbeat
    expect(draining.rec.freshness!.sequence - teardown.rec.freshness!.sequence).toBe(2)
  }, 20_000)

  it("an engine exit and an engine becoming ready reach etcd at once, not at the next heartbeat (30 s)", async () => {
    const prefix = uniquePrefix()
    const key = nodeKey(prefix, "c1", "n1")
    const r = await startReporter({ prefix, heartbeat: "30s", leaseTtl: "90s", damping: 2 })
    await untilState(r, "registered")
    const published = (state: string) =>
      pollUntil(
        `${state} in etcd`,
        async () => ((await readRecord(client, key))?.state === state ? true : undefined),
        3_000
      )
    let t = performance.now()
    await r.setEngine("ready", "ready")
    await published("ready")
    const startLagMs = performance.now() - t
    t = performance.now()
    await r.setEngine("starting", "restarting") // the engine exited; the supervisor restarts it
    await published("starting")
    const crashLagMs = performance.now() - t
    await r.setEngine("ready", "ready")
    await published("ready")
    t = performance.now()
    await r.setEngine("unhealthy", "stopped") // the supervisor gave up
    await published("unhealthy")
    const stopLagMs = performance.now() - t
    // A heartbeat-driven write would take 30 s; the bound is a tenth of that on a loaded machine.
    expect(Math.max(startLagMs, crashLagMs, stopLagMs)).toBeLessThan(3_000)
    console.log(
      `etcd lag: start ${startLagMs.toFixed(0)} ms, crash ${crashLagMs.toFixed(0)} ms, stop ${stopLagMs.toFixed(0)} ms`
    )
  }, 30_000)

  it("markDraining writes state=draining before returning", async () => {
    const prefix = uniquePrefix()
    const key = nodeKey(prefix, "c1", "n1")
    const r = await startReporter({ prefix, heartbeat: "5s", leaseTtl: "15s" })
    await untilState(r, "registered")
    expect(Exit.isSuccess(await r.markDraining())).toBe(true)
    expect((await readRecord(client, key))?.state).toBe("draining")
  }, 20_000)

  it("registers again with a new epoch after the lease is revoked from outside", async () => {
    const prefix = uniquePrefix()
    const key = nodeKey(prefix, "c1", "n1")
    const r = await startReporter({ prefix })
    const before = await untilState(r, "registered")
    await client.leaseClient.leaseRevoke({ ID: before.leaseId! })
    const after = await untilState(r, "registered", 10_000, (s) => s.epoch !== before.epoch)
    expect(after.leasesLost).toBeGreaterThanOrEqual(1)
    const rec = await pollUntil("record of the new epoch", async () => {
      const x = await readRecord(client, key)
      return x?.freshness?.epoch === after.epoch ? x : undefined
    })
    expect(rec.freshness!.sequence).toBeGreaterThan(before.sequence)
  }, 20_000)

  it("a key written by hand, with no lease: refused, the error says it never expires and how to remove it", async () => {
    const prefix = uniquePrefix()
    const key = nodeKey(prefix, "c1", "n1")
    await client.put(key).value(JSON.stringify({ nodeId: "n1", advertiseAddr: "10.0.0.9:7071" }))
    const r = await startReporter({ prefix })
    const s = await untilState(r, "conflict")
    expect(s.conflict?.lease).toBe("none")
    expect(s.lastError).toContain("with no lease")
    expect(s.lastError).toContain(`etcdctl del ${key}`)
    expect(s.lastError).not.toContain("until that lease ends")
    // deleted: the agent takes the key
    await client.delete().key(key)
    await untilState(r, "registered")
  }, 20_000)

  it("refuses a duplicate node id, naming the holder, and takes over once the holder leaves", async () => {
    const prefix = uniquePrefix()
    const key = nodeKey(prefix, "c1", "n1")
    const a = await startReporter({ prefix, advertise: "10.0.0.1:7071" })
    const sa = await untilState(a, "registered")
    const b = await startReporter({ prefix, advertise: "10.0.0.2:7071" })
    const sb = await untilState(b, "conflict")
    expect(sb.conflict?.lease).toBe(sa.epoch)
    expect(sb.conflict?.advertiseAddr).toBe("10.0.0.1:7071")
    expect(sb.lastError).toContain("10.0.0.1:7071")
    const flushed = await b.flush()
    expect(Exit.isFailure(flushed)).toBe(true)
    if (Exit.isFailure(flushed)) expect(String(flushed.cause)).toContain("RegistrationConflict")
    // never overwritten
    expect((await readRecord(client, key))?.advertiseAddr).toBe("10.0.0.1:7071")
    await a.close()
    await untilState(b, "registered")
    expect((await readRecord(client, key))?.advertiseAddr).toBe("10.0.0.2:7071")
    expect(b.logs.filter((l) => l.startsWith("Error") && l.includes("by another live agent"))).toHaveLength(1)
  }, 20_000)

  it("a key held by a lease that advertises this node's own address (its previous run, killed) is a warning that says so", async () => {
    const prefix = uniquePrefix()
    const a = await startReporter({ prefix, advertise: "10.0.0.3:7071" })
    const sa = await untilState(a, "registered")
    const b = await startReporter({ prefix, advertise: "10.0.0.3:7071" })
    const sb = await untilState(b, "conflict")
    expect(sb.conflict?.lease).toBe(sa.epoch)
    expect(sb.lastError).toContain("this node's own address (10.0.0.3:7071)")
    expect(sb.lastError).toContain("previous agent")
    expect(b.logs.filter((l) => l.includes("is still registered"))).toEqual([expect.stringMatching(/^Warn /)])
    expect(b.logs.filter((l) => l.startsWith("Error"))).toEqual([])
  }, 20_000)

  it("a key deleted by hand under a live lease is created again, with a warning that says how to take a node out", async () => {
    const prefix = uniquePrefix()
    const key = nodeKey(prefix, "c1", "n1")
    const r = await startReporter({ prefix })
    const before = await untilState(r, "registered")
    await client.delete().key(key)
    await untilState(r, "registered", 10_000, (s) => s.writes > before.writes + 1)
    const rec = await pollUntil("the key back", async () => await readRecord(client, key))
    expect(rec.freshness?.epoch).toBe(before.epoch)
    expect(r.logs.filter((l) => l.includes("deleted outside the agent"))).toEqual([
      expect.stringContaining("POST /cordon")
    ])
  }, 20_000)

  it("a state change written as etcd resumes past the lease's TTL: the lease's loss, not a key 'deleted outside the agent'", async () => {
    const { etcd } = await ownEtcd()
    const r = await startReporter({ prefix: uniquePrefix(), endpoint: etcd.endpoint })
    await untilState(r, "registered")
    etcd.pause()
    const down = await untilState(r, "retrying")
    await pollUntil("lease past its TTL", async () => ((await r.status()).sinceKeepAliveMs! > 1500 ? true : undefined))
    // a change to write at once (not a heartbeat's, which asks the lease first), waiting on the paused etcd
    const change = r.setState("unhealthy")
    etcd.resume()
    await change
    await untilState(r, "registered", 10_000, (s) => s.writes > down.writes)
    expect(r.logs.filter((l) => l.includes("deleted outside the agent"))).toEqual([])
  }, 30_000)

  it("registers again after etcd is paused (SIGSTOP) and resumed", async () => {
    const { etcd, local } = await ownEtcd()
    const prefix = uniquePrefix()
    const key = nodeKey(prefix, "c1", "n1")
    const r = await startReporter({ prefix, endpoint: etcd.endpoint })
    await untilState(r, "registered")
    etcd.pause()
    const down = await untilState(r, "retrying")
    expect(down.lastError).toBeDefined()
    // Frozen for longer than the lease TTL (1 s), as after a long GC pause or partition.
    await pollUntil("lease past its TTL", async () => ((await r.status()).sinceKeepAliveMs! > 1500 ? true : undefined))
    etcd.resume()
    const up = await untilState(r, "registered", 10_000, (s) => s.writes > down.writes)
    const rec = await pollUntil("record after resume", async () => {
      const x = await readRecord(local, key)
      return x?.freshness?.epoch === up.epoch ? x : undefined
    })
    expect(rec.nodeId).toBe("n1")
  }, 30_000)

  it("registers again within about a heartbeat after etcd is killed and restarted", async () => {
    const etcd = await startEtcd()
    cleanups.push(() => etcd.dispose())
    const prefix = uniquePrefix()
    const key = nodeKey(prefix, "c1", "n1")
    const r = await startReporter({ prefix, endpoint: etcd.endpoint })
    await untilState(r, "registered")
    await etcd.kill()
    const down = await untilState(r, "retrying")
    // Stay down a while so the client's backoff has grown.
    await pollUntil("several failed retries", async () =>
      (await r.status()).writeFailures >= down.writeFailures + 5 ? true : undefined
    )
    await etcd.restart()
    const back = Date.now()
    const up = await untilState(r, "registered", 10_000, (s) => s.writes > down.writes)
    expect(Date.now() - back).toBeLessThan(3000)
    const local = new Etcd3({ hosts: etcd.endpoint })
    cleanups.push(async () => local.close())
    const rec = await pollUntil("record after restart", async () => {
      const x = await readRecord(local, key)
      return x?.freshness?.epoch === up.epoch ? x : undefined
    })
    expect(rec.freshness!.sequence).toBeGreaterThan(down.sequence)
  }, 30_000)

  it("registers again under a new lease after etcd comes back without its data (a wiped data dir)", async () => {
    const etcd = await startEtcd()
    cleanups.push(() => etcd.dispose())
    const prefix = uniquePrefix()
    const key = nodeKey(prefix, "c1", "n1")
    const r = await startReporter({ prefix, endpoint: etcd.endpoint })
    const before = await untilState(r, "registered")
    await etcd.kill()
    const down = await untilState(r, "retrying")
    // etcd restarted with an empty data dir (a lost volume, a re-created member): our lease and key are gone.
    await fs.rm(path.join(etcd.dataDir, "data"), { recursive: true, force: true })
    await etcd.restart()
    const up = await untilState(r, "registered", 10_000, (s) => s.writes > down.writes && s.epoch !== before.epoch)
    const local = new Etcd3({ hosts: etcd.endpoint })
    cleanups.push(async () => local.close())
    const rec = await pollUntil("record under the new lease", async () => {
      const x = await readRecord(local, key)
      return x?.freshness?.epoch === up.epoch ? x : undefined
    })
    expect(rec.nodeId).toBe("n1")
    expect(up.epoch).not.toBe(before.epoch)
    // one lease in the fresh etcd: ours, the one the record names
    const leases = await local.leaseClient.leaseLeases({})
    expect(leases.leases.map((l) => epochOf(String(l.ID)))).toEqual([up.epoch])
  }, 30_000)

  it("an etcd that keeps the lease alive but refuses writes (its NOSPACE alarm) is not left holding a key that says ready after a cordon", async () => {
    const { etcd, local } = await ownEtcd()
    const prefix = uniquePrefix()
    const key = nodeKey(prefix, "c1", "n1")
    const r = await startReporter({ prefix, endpoint: etcd.endpoint, damping: 1 })
    await untilState(r, "registered")
    await r.setEngine("ready", "ready")
    await pollUntil("ready published", async () =>
      (await readRecord(local, key))?.state === "ready" ? true : undefined
    )
    const held = await r.status()
    // What etcd does over its space quota: writes and lease grants refused, keepalives and revokes still answered.
    const memberID = (await local.cluster.memberList({})).members[0]!.ID
    await local.maintenance.alarm({ action: "Activate", memberID, alarm: "Nospace" })
    cleanups.push(() => local.maintenance.alarm({ action: "Deactivate", memberID, alarm: "Nospace" }))
    // A heartbeat that changes no state is refused and the key kept: every node's writes fail alike on a full etcd.
    // Two refused heartbeats counted: a step's failure is counted once the step is over (a revoke it made included),
    // so a wrongful revoke by the first has landed by now, not racing the read.
    const refused = await untilState(r, "retrying", 10_000, (x) => x.writeFailures >= held.writeFailures + 2)
    expect(refused.leaseId).toBe(held.leaseId)
    expect((await readRecord(local, key))?.state).toBe("ready")
    // A state the key does not say is refused: the key goes, instead of saying ready while its lease is kept alive.
    await r.setState("cordoned")
    await pollUntil("the key gone", async () => ((await local.get(key).string()) === null ? true : undefined))
    expect((await local.leaseClient.leaseLeases({})).leases).toEqual([])
    expect(await r.status()).toMatchObject({ leaseId: undefined, publishedState: undefined })
    // Once etcd takes writes again, the node registers under a new lease with its state.
    await local.maintenance.alarm({ action: "Deactivate", memberID, alarm: "Nospace" })
    const rec = await pollUntil("cordoned published", async () => {
      const x = await readRecord(local, key)
      return x?.state === "cordoned" ? x : undefined
    })
    // The reporter may read its create's answer a moment after this test reads the key.
    const status = await pollUntil("cordoned in status", async () => {
      const x = await r.status()
      return x.publishedState === "cordoned" ? x : undefined
    })
    expect(status.epoch).toBe(rec.freshness?.epoch)
  }, 30_000)

  it("a state change etcd refused, its lease revoked, reads retrying at once, not registered until the next heartbeat", async () => {
    const { etcd, local } = await ownEtcd()
    const prefix = uniquePrefix()
    const key = nodeKey(prefix, "c1", "n1")
    // A long heartbeat: no tick between the refused cordon and the status read.
    const r = await startReporter({ prefix, endpoint: etcd.endpoint, damping: 1, heartbeat: "20s", leaseTtl: "60s" })
    await untilState(r, "registered")
    const memberID = (await local.cluster.memberList({})).members[0]!.ID
    await local.maintenance.alarm({ action: "Activate", memberID, alarm: "Nospace" })
    cleanups.push(() => local.maintenance.alarm({ action: "Deactivate", memberID, alarm: "Nospace" }))
    await r.setState("cordoned")
    await pollUntil("the key gone", async () => ((await local.get(key).string()) === null ? true : undefined))
    expect(await r.status()).toMatchObject({
      state: "retrying",
      leaseId: undefined,
      lastError: expect.stringMatching(/space/)
    })
  }, 30_000)

  it("a SIGKILLed agent's key disappears after the lease TTL", async () => {
    const prefix = uniquePrefix()
    const key = nodeKey(prefix, "c1", "n9")
    const fixture = path.join(import.meta.dirname, "..", "fixtures", "reporter.ts")
    const child = spawn(process.execPath, [fixture, JSON.stringify(configObject({ prefix, nodeId: "n9" }))], {
      stdio: ["ignore", "pipe", "pipe"]
    })
    cleanups.push(async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL")
    })
    let out = ""
    let err = ""
    child.stdout.on("data", (d: Buffer) => {
      out += d.toString()
    })
    child.stderr.on("data", (d: Buffer) => {
      err += d.toString()
    })
    await pollUntil("fixture registered", () => (out.includes('"registered"') ? true : undefined), 15_000).catch(
      (e) => {
        throw new Error(`${(e as Error).message}\nstderr:\n${err}`)
      }
    )
    expect(await client.get(key).string()).not.toBeNull()
    const exited = new Promise((res) => child.once("exit", res))
    child.kill("SIGKILL")
    await exited
    const killedAt = Date.now()
    // Still there right after the kill: nobody revoked it.
    expect(await client.get(key).string()).not.toBeNull()
    await pollUntil("key expired", async () => ((await client.get(key).string()) === null ? true : undefined), 8000)
    const gone = Date.now() - killedAt
    expect(gone).toBeGreaterThan(200)
    expect(gone).toBeLessThan(5000)
  }, 30_000)

  it("authenticates with [cluster].etcd_username and etcd_password", async () => {
    const etcd = await startEtcd()
    cleanups.push(() => etcd.dispose())
    const admin = new Etcd3({ hosts: etcd.endpoint })
    cleanups.push(async () => admin.close())
    await admin.role("root").create()
    await admin.user("root").create("s3cret")
    await admin.user("root").addRole("root")
    await admin.auth.authEnable({})
    const prefix = uniquePrefix()
    const wrong = await startReporter({ prefix, endpoint: etcd.endpoint, auth: { username: "root", password: "nope" } })
    const refused = await untilState(wrong, "retrying")
    expect(refused.lastError).toMatch(/auth/i)
    await wrong.close()
    const r = await startReporter({ prefix, endpoint: etcd.endpoint, auth: { username: "root", password: "s3cret" } })
    await untilState(r, "registered")
    const authed = new Etcd3({ hosts: etcd.endpoint, auth: { username: "root", password: "s3cret" } })
    cleanups.push(async () => authed.close())
    expect((await readRecord(authed, nodeKey(prefix, "c1", "n1")))?.nodeId).toBe("n1")
  }, 20_000)

  it("a role's permission revoked mid-run is etcd's refusal: a cordon is not left unwritten under a key that says ready", async () => {
    const { etcd, admin } = await authEtcd()
    const prefix = uniquePrefix()
    const key = nodeKey(prefix, "c1", "n1")
    const range = admin.range({ prefix: `${prefix}/` })
    await admin.role("agent").create()
    await admin.role("agent").grant({ permission: "Readwrite", range })
    await admin.user("agent").create("pw1")
    await admin.user("agent").addRole("agent")
    const r = await startReporter({
      prefix,
      endpoint: etcd.endpoint,
      damping: 1,
      auth: { username: "agent", password: "pw1" }
    })
    await r.setEngine("ready", "ready")
    await pollUntil("ready published", async () =>
      (await readRecord(admin, key))?.state === "ready" ? true : undefined
    )
    // Keepalives need no permission on keys: they go on; every write is refused.
    await admin.role("agent").revoke({ permission: "Readwrite", range })
    await r.setState("cordoned")
    // The lease's revoke needs the permission too (etcd checks the keys attached): the key goes within its TTL.
    await pollUntil("the key gone", async () => ((await admin.get(key).string()) === null ? true : undefined))
    expect(r.logs.join("\n")).toMatch(/etcd refused the node's record \(state cordoned\) and its lease's revoke/)
    await admin.role("agent").grant({ permission: "Readwrite", range })
    await pollUntil("cordoned published", async () =>
      (await readRecord(admin, key))?.state === "cordoned" ? true : undefined
    )
  }, 30_000)

  it("with etcd_username set, an etcd whose auth is turned off is used without a token, and with one once it is on again", async () => {
    const { etcd, admin } = await authEtcd()
    const prefix = uniquePrefix()
    const key = nodeKey(prefix, "c1", "n1")
    const r = await startReporter({ prefix, endpoint: etcd.endpoint, auth: { username: "root", password: "s3cret" } })
    await untilState(r, "registered")
    await admin.auth.authDisable({})
    const open = new Etcd3({ hosts: etcd.endpoint })
    cleanups.push(async () => open.close())
    // A write after the change goes out (the sequence moves) under the same lease: nothing expired meanwhile.
    const before = (await readRecord(open, key))?.freshness?.sequence ?? 0
    const after = await pollUntil("a write without auth", async () => {
      const x = await readRecord(open, key)
      return (x?.freshness?.sequence ?? 0) > before + 2 ? x : undefined
    })
    expect(after.freshness?.epoch).toBe((await r.status()).epoch)
    expect(r.logs.join("\n")).toMatch(/etcd has authentication disabled: going on without a token/)
    // On again (root's role is kept): calls without a token are refused, and it authenticates again.
    await open.auth.authEnable({})
    const seq = (await readRecord(admin, key))?.freshness?.sequence ?? 0
    await pollUntil("a write with auth again", async () =>
      ((await readRecord(admin, key))?.freshness?.sequence ?? 0) > seq + 2 ? true : undefined
    )
    expect(r.logs.join("\n")).toMatch(/etcd has authentication enabled again/)
  }, 30_000)

  it("registers over a slow link to etcd (every chunk 150 ms late each way): a connection attempt has seconds", async () => {
    const proxy = await slowProxy(shared.endpoint, 150)
    cleanups.push(() => proxy.close())
    const r = await startReporter({ prefix: uniquePrefix(), etcd: [proxy.endpoint], heartbeat: "1s", leaseTtl: "5s" })
    const st = await untilState(r, "registered", 15_000)
    expect(st.lastError).toBeUndefined()
  }, 20_000)

  it("keeps its lease with several endpoints of which some are dead: calls fail over to the live one", async () => {
    // One endpoint refuses connections, one accepts them and never answers (a frozen or partitioned member).
    const held = new Set<net.Socket>()
    const blackHole = net.createServer((socket) => {
      held.add(socket)
      socket.on("error", () => undefined)
      socket.on("close", () => held.delete(socket))
    })
    const holePort = await new Promise<number>((resolve) =>
      blackHole.listen(0, "127.0.0.1", () => resolve((blackHole.address() as net.AddressInfo).port))
    )
    cleanups.push(
      () =>
        new Promise<void>((resolve) => {
          for (const socket of held) socket.destroy()
          blackHole.close(() => resolve())
        })
    )
    const prefix = uniquePrefix()
    const key = nodeKey(prefix, "c1", "n1")
    const etcd = [`http://127.0.0.1:${await freePort()}`, shared.endpoint, `http://127.0.0.1:${holePort}`]
    // TTL 2 s, so one failed call (deadline 1 s) cannot cost the lease; two in a row can.
    const r = await startReporter({ prefix, etcd, heartbeat: "300ms", leaseTtl: "2s" })
    const first = await untilState(r, "registered", 15_000)
    // Ten heartbeats under the same lease. etcd3 picks a random endpoint per call, so before the failover
    // two calls in three went to a dead endpoint: the lease was lost within a few heartbeats.
    const later = await pollUntil("ten more writes", async () => {
      const s = await r.status()
      return s.writes >= first.writes + 10 || s.leasesLost > 0 ? s : undefined
    })
    expect(later.leasesLost).toBe(0)
    expect(later.epoch).toBe(first.epoch)
    // Each dead endpoint costs at most the call that found it dead (and the one that raced with it).
    expect(later.writeFailures - first.writeFailures).toBeLessThanOrEqual(4)
    expect((await readRecord(client, key))?.freshness?.epoch).toBe(first.epoch)
  }, 30_000)

  it("keeps running and reports retrying when etcd is unreachable from the start", async () => {
    // A port just found free: no etcd (nor anything else) listens there.
    const r = await startReporter({ prefix: uniquePrefix(), etcd: [`http://127.0.0.1:${await freePort()}`] })
    const st = await untilState(r, "retrying")
    expect(st.lastError).toBeDefined()
    const flushed = await r.flush()
    expect(Exit.isFailure(flushed)).toBe(true)
    await r.close()
  }, 20_000)

  it("is standalone when [cluster].etcd is empty", async () => {
    const r = await startReporter({ etcd: [] })
    const st = await r.status()
    expect(st.state).toBe("standalone")
    expect(st.key).toBeUndefined()
    expect(Exit.isSuccess(await r.flush())).toBe(true)
  })

  it("raised no unhandled rejections", () => {
    expect(unhandled).toBe(0)
  })
})
