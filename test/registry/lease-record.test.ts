/**
 * The lease record in agent.state_dir (layers/registry/leaseRecord.ts) against a real etcd (test/support/etcd.ts): an
 * agent SIGKILLed with its key under a long lease, and its successor on the same state_dir that revokes that lease
 * and registers at once; holders the record does not name (another lease, no state_dir lock) waited for as before,
 * with messages that say why; the record removed at a clean stop. Also what the registration's lines say: lease ids
 * in hex, no empty fields, and one warning (no "retrying") for an etcd with auth off and etcd_username set.
 */
import { spawn } from "node:child_process"
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { Effect, Layer, Logger, ManagedRuntime, References } from "effect"
import { Etcd3 } from "etcd3"
import "nice-grpc"
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { NodeHealth } from "../../src/gen/cgn/agent/v1/agent.ts"
import { layerFromObject } from "../../src/layers/config/Config.ts"
import { layer as healthReporterLayer } from "../../src/layers/registry/HealthReporter.ts"
import { leaseRecordPath } from "../../src/layers/registry/leaseRecord.ts"
import { holdStateDir } from "../../src/layers/stateDir/stateLock.ts"
import {
  epochOf,
  HealthReporter,
  LeaseLost,
  nodeKey,
  type RegistrationStatus
} from "../../src/services/registry/HealthReporter.ts"
import { layerTest as nodeStatusTest } from "../../src/testing/NodeStatus.ts"
import { type EtcdHandle, pollUntil, startEtcd } from "../support/etcd.ts"
import { freePort } from "../support/ports.ts"

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
})

interface Opts {
  readonly prefix: string
  readonly stateDir: string
  readonly endpoint?: string
  readonly advertise?: string
  /** Hold the state_dir lock first, as the daemon's engine supervisor does (default true). */
  readonly lock?: boolean
  readonly auth?: { readonly username: string; readonly password: string }
}

const configObject = (o: Opts) => ({
  cluster: {
    name: "c1",
    etcd: [o.endpoint ?? shared.endpoint],
    etcd_prefix: o.prefix,
    ...(o.auth ? { etcd_username: o.auth.username, etcd_password: o.auth.password } : {})
  },
  // A TTL far above any wait below: a key that goes within the test was revoked, not expired.
  agent: { node_id: "n1", heartbeat: "1s", lease_ttl: "30s", state_dir: o.stateDir },
  models: { m: { hf_repo: "org/m" } }
})

interface Line {
  readonly level: string
  readonly message: string
  readonly fields: Record<string, unknown>
}

const startReporter = async (o: Opts) => {
  const lines: Array<Line> = []
  const logger = Logger.make(({ logLevel, message, fiber }) => {
    lines.push({
      level: logLevel,
      message: [message]
        .flat()
        .filter((m) => typeof m === "string")
        .join(" "),
      fields: { ...fiber.getRef(References.CurrentLogAnnotations) }
    })
  })
  const below = Layer.mergeAll(
    layerFromObject(configObject(o)),
    nodeStatusTest({ nodeId: "n1", cluster: "c1", state: "ready", advertiseAddr: o.advertise ?? "10.0.0.5:7071" }),
    o.lock === false ? Layer.empty : Layer.effectDiscard(holdStateDir(o.stateDir))
  )
  const runtime = ManagedRuntime.make(
    healthReporterLayer.pipe(Layer.provideMerge(below), Layer.provide(Logger.layer([logger])))
  )
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
    lines,
    warnings: () => lines.filter((l) => l.level === "Warn" || l.level === "Error").map((l) => l.message),
    close
  }
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

const uniquePrefix = () => `/lr${process.pid}-${++counter}`
const tempStateDir = async () => {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), "cgn-lease-record-"))
  cleanups.push(() => fs.rm(dir, { recursive: true, force: true }))
  return dir
}
const readRecord = async (key: string) => {
  const text = await client.get(key).string()
  return text === null ? undefined : NodeHealth.fromJSON(JSON.parse(text))
}
const leaseRecordOf = async (stateDir: string) =>
  JSON.parse(await fs.readFile(leaseRecordPath(stateDir), "utf8")) as { lease: string; epoch: string; key: string }
/** Seconds left to a lease (-1 once gone). */
const ttlOf = async (leaseId: string) => Number((await client.leaseClient.leaseTimeToLive({ ID: leaseId })).TTL)
const decimal = (epoch: string) => BigInt(`0x${epoch}`).toString()

/** An agent in its own process (lockedReporter.fixture.ts), holding the state_dir lock; its epoch once registered. */
const spawnAgent = async (o: Opts) => {
  const fixture = path.join(import.meta.dirname, "lockedReporter.fixture.ts")
  const child = spawn(process.execPath, [fixture, JSON.stringify(configObject(o))], {
    stdio: ["ignore", "pipe", "pipe"]
  })
  const exited = new Promise((res) => child.once("exit", res))
  cleanups.push(async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL")
    await exited
  })
  let out = ""
  let err = ""
  child.stdout.on("data", (d: Buffer) => {
    out += d.toString()
  })
  child.stderr.on("data", (d: Buffer) => {
    err += d.toString()
  })
  const line = await pollUntil(
    "the agent registered",
    () => out.split("\n").find((l) => l.includes('"registered"')),
    15_000
  ).catch((e) => {
    throw new Error(`${(e as Error).message}\nstderr:\n${err}`)
  })
  return {
    epoch: (JSON.parse(line) as { epoch: string }).epoch,
    kill: async () => {
      child.kill("SIGKILL")
      await exited
    }
  }
}

describe("the lease record in agent.state_dir", () => {
  it("a SIGKILLed agent's successor on the same state_dir revokes its lease and registers at once, not after the TTL", async () => {
    const prefix = uniquePrefix()
    const key = nodeKey(prefix, "c1", "n1")
    const stateDir = await tempStateDir()
    const first = await spawnAgent({ prefix, stateDir })
    // The record names the agent's lease, readable by its user only.
    expect(await leaseRecordOf(stateDir)).toEqual({ lease: decimal(first.epoch), epoch: first.epoch, key })
    expect((await fs.stat(leaseRecordPath(stateDir))).mode & 0o777).toBe(0o600)
    await first.kill()
    // Nobody revoked it: the dead agent's "ready" stays under its 30 s lease.
    expect((await readRecord(key))?.freshness?.epoch).toBe(first.epoch)
    const killedAt = Date.now()
    const next = await startReporter({ prefix, stateDir })
    const registered = await untilState(next, "registered", 10_000)
    expect(Date.now() - killedAt).toBeLessThan(10_000)
    expect(await ttlOf(decimal(first.epoch))).toBe(-1)
    expect((await readRecord(key))?.freshness?.epoch).toBe(registered.epoch)
    expect(next.warnings().filter((w) => w.includes(`lease ${first.epoch}`))).toEqual([
      expect.stringContaining("this node's previous agent's (recorded in agent.state_dir)")
    ])
    expect(next.warnings().filter((w) => w.includes("is still registered"))).toEqual([])
    // The record names the new lease now, and goes with it at a clean stop.
    expect((await leaseRecordOf(stateDir)).epoch).toBe(registered.epoch)
    await next.close()
    expect(await client.get(key).string()).toBeNull()
    await expect(fs.access(leaseRecordPath(stateDir))).rejects.toThrow(/ENOENT/)
  }, 40_000)

  it("a holder the record does not name is waited for, as before: the lease is not revoked, the message says why", async () => {
    const prefix = uniquePrefix()
    const key = nodeKey(prefix, "c1", "n1")
    // The holder: another agent at this node's address, of another state_dir.
    const holder = await startReporter({ prefix, stateDir: await tempStateDir() })
    const held = await untilState(holder, "registered")
    // This state_dir's record names a live lease of something else.
    const stateDir = await tempStateDir()
    const other = await client.lease(60, { autoKeepAlive: false }).grant()
    cleanups.push(() => client.leaseClient.leaseRevoke({ ID: other }).catch(() => undefined))
    await fs.writeFile(leaseRecordPath(stateDir), JSON.stringify({ lease: other, epoch: epochOf(other), key }))
    const next = await startReporter({ prefix, stateDir })
    const conflict = await untilState(next, "conflict")
    expect(conflict.conflict?.lease).toBe(held.epoch)
    expect(conflict.lastError).toContain(
      `not revoked: an agent revokes only the lease its previous agent recorded in agent.state_dir, and ${leaseRecordPath(stateDir)} records lease ${epochOf(other)}, not this one;`
    )
    expect(conflict.lastError).toContain(
      "retrying until that lease ends (at most agent.lease_ttl after etcd last saw it kept alive; an etcd restart extends it)"
    )
    // Several rounds later: still refused, neither lease revoked, the key still the holder's.
    await pollUntil("two more refused rounds", async () =>
      (await next.status()).writeFailures >= conflict.writeFailures + 2 ? true : undefined
    )
    expect((await next.status()).state).toBe("conflict")
    expect(await ttlOf(held.leaseId!)).toBeGreaterThan(0)
    expect(await ttlOf(other)).toBeGreaterThan(0)
    expect((await readRecord(key))?.freshness?.epoch).toBe(held.epoch)
    expect(next.warnings().filter((w) => w.includes("lease revoked"))).toEqual([])
  }, 30_000)

  it("an agent that does not hold the state_dir lock neither revokes the lease recorded there nor records its own", async () => {
    const prefix = uniquePrefix()
    const key = nodeKey(prefix, "c1", "n1")
    const stateDir = await tempStateDir()
    // The holder, alive, in a process of its own that holds the lock.
    const holder = await spawnAgent({ prefix, stateDir })
    const recorded = await fs.readFile(leaseRecordPath(stateDir), "utf8")
    expect(JSON.parse(recorded).epoch).toBe(holder.epoch)
    // Another agent on the same state_dir without its lock (a proxied engine takes none): the holder may be alive.
    const next = await startReporter({ prefix, stateDir, lock: false })
    const conflict = await untilState(next, "conflict")
    expect(conflict.conflict?.lease).toBe(holder.epoch)
    expect(conflict.lastError).toContain("this agent does not hold agent.state_dir's lock")
    await pollUntil("two more refused rounds", async () =>
      (await next.status()).writeFailures >= conflict.writeFailures + 2 ? true : undefined
    )
    expect(await ttlOf(decimal(holder.epoch))).toBeGreaterThan(0)
    expect((await readRecord(key))?.freshness?.epoch).toBe(holder.epoch)
    expect(await fs.readFile(leaseRecordPath(stateDir), "utf8")).toBe(recorded)
  }, 30_000)
})

describe("the registration's lines", () => {
  it("a lost lease is named in hex, as its epoch", async () => {
    expect(new LeaseLost({ leaseId: "4111120487276619526", reason: "gone" }).message).toBe(
      `etcd lease ${epochOf("4111120487276619526")} lost: gone`
    )
    const r = await startReporter({ prefix: uniquePrefix(), stateDir: await tempStateDir(), lock: false })
    const before = await untilState(r, "registered")
    await client.leaseClient.leaseRevoke({ ID: before.leaseId! })
    await untilState(r, "registered", 10_000, (s) => s.epoch !== before.epoch)
    const revoked = r.lines.find((l) => l.message === "etcd registration: revoked")
    expect(revoked?.fields.error).toBe(`etcd lease ${before.epoch} lost: etcd reports the lease expired or revoked`)
  }, 20_000)

  it("with etcd_username set and etcd's auth off: one warning, no retrying, and no empty fields", async () => {
    const etcd = await startEtcd()
    cleanups.push(() => etcd.dispose())
    const r = await startReporter({
      prefix: uniquePrefix(),
      stateDir: await tempStateDir(),
      lock: false,
      endpoint: etcd.endpoint,
      auth: { username: "root", password: "s3cret" }
    })
    const st = await untilState(r, "registered")
    expect(st.leasesGranted).toBe(1)
    expect(r.warnings()).toEqual([expect.stringMatching(/^etcd has authentication disabled: going on without a token/)])
    const changes = r.lines.filter((l) => l.message.startsWith("etcd registration: "))
    expect(changes.map((l) => l.message)).toEqual(["etcd registration: registered"])
    expect(changes[0]?.fields).toEqual({
      component: "HealthReporter",
      key: st.key,
      from: "registering",
      to: "registered",
      epoch: st.epoch
    })
  }, 20_000)

  it("the first retrying line has no empty epoch", async () => {
    // A port just found free: nothing listens there, the first grant fails.
    const r = await startReporter({
      prefix: uniquePrefix(),
      stateDir: await tempStateDir(),
      lock: false,
      endpoint: `http://127.0.0.1:${await freePort()}`
    })
    await untilState(r, "retrying")
    const retrying = r.lines.find((l) => l.message === "etcd registration: retrying")
    expect(retrying?.fields).not.toHaveProperty("epoch")
    expect(retrying?.fields.error).toEqual(expect.any(String))
  }, 20_000)
})
