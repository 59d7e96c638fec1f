// Shutdown with every peer hung, as a Kubernetes operator meets it: the built agent (`node dist/main.js run`) on
// the simulator gets SIGTERM while etcd is frozen (SIGSTOP), the engine ignores SIGTERM, kvcached accepts and
// never answers, and the OTLP collector accepts and never answers; each alone, then all at once. Each case
// asserts exit 0 within the bound the drain logs (`exit_within`, programs/shutdownBound.ts, README "Running the
// daemon"), and the log line that says what was cut short. Short drain_timeout, stop_grace and heartbeat keep
// the file fast. Requires dist/ (`npm run build`; `npm test` builds first). etcd is started once for the file.
import * as fs from "node:fs"
import * as net from "node:net"
import * as os from "node:os"
import * as path from "node:path"
import { Duration } from "effect"
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { decodeConfigObject } from "../../src/layers/config/Config.ts"
import { CALL_DEADLINE_SLACK_MS } from "../../src/layers/registry/etcdClient.ts"
import { shutdownBound } from "../../src/programs/shutdownBound.ts"
import { reporterTiming } from "../../src/services/registry/ReporterTiming.ts"
import {
  type AgentHandle,
  killAllAgents,
  processAlive,
  requireDist,
  simAgentConfig,
  startAgent
} from "../support/agent.ts"
import { type EtcdHandle, pollUntil, startEtcd } from "../support/etcd.ts"
import { agentClient, generate } from "../support/generate.ts"
import { freePort } from "../support/ports.ts"

let etcd: EtcdHandle
const cleanups: Array<() => void> = []

beforeAll(async () => {
  requireDist()
  etcd = await startEtcd()
})
afterEach(async () => {
  etcd.resume()
  await killAllAgents()
  for (const c of cleanups.splice(0)) c()
})
afterAll(async () => {
  await killAllAgents()
  await etcd?.dispose()
})

/** A peer that accepts connections and never reads nor answers: kvcached wedged, a black-holed collector. */
const silentServer = async (listenOn: { port: number } | { path: string }) => {
  const sockets = new Set<net.Socket>()
  const server = net.createServer((socket) => {
    socket.pause()
    socket.on("error", () => {})
    sockets.add(socket)
  })
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject)
    if ("port" in listenOn) server.listen(listenOn.port, "127.0.0.1", resolve)
    else server.listen(listenOn.path, resolve)
  })
  cleanups.push(() => {
    for (const s of sockets) s.destroy()
    server.close()
  })
  return { accepted: () => sockets.size }
}

interface Hung {
  /** etcd frozen (SIGSTOP) after the node registered. */
  readonly etcd?: boolean
  /** The engine ignores SIGTERM (`--sim-ignore-sigterm`): only the guard's SIGKILL after stop_grace ends it. */
  readonly engine?: boolean
  /** kvcached accepts the KV bridge's connection and never answers Hello. */
  readonly kvcached?: boolean
  /** The OTLP collector accepts and never answers. */
  readonly otlp?: boolean
}

const AGENT = { heartbeat: "1s", lease_ttl: "3s", drain_timeout: "1s" }
const STOP_GRACE_MS = 1_000
// One etcd call's bound at this heartbeat and TTL: its deadline (ReporterTiming.ts) plus etcdClient's slack.
const ETCD_CALL_MS = reporterTiming(Duration.seconds(1), Duration.seconds(3)).callTimeoutMs + CALL_DEADLINE_SLACK_MS

interface Stopped {
  readonly agent: AgentHandle
  readonly code: number | null
  readonly signal: NodeJS.Signals | null
  readonly elapsedMs: number
  readonly boundMs: number
  readonly enginePid: number
  /** The agent's log lines by message (JSON), in order. */
  readonly lines: (msg: string | RegExp) => Array<Record<string, unknown>>
  /** Milliseconds between the first lines matching `from` and `to` (by their `ts`). */
  readonly between: (from: string | RegExp, to: string | RegExp) => number
}

const matches = (msg: string | RegExp, l: Record<string, unknown>) =>
  typeof l.msg === "string" && (typeof msg === "string" ? l.msg.includes(msg) : msg.test(l.msg))

/** Starts an agent with the given peers hung, lets it serve one call, then SIGTERMs it and waits for the exit. */
const stopWithHungPeers = async (hung: Hung): Promise<Stopped> => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-hung-"))
  cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }))
  const kvcached = hung.kvcached ? await silentServer({ path: path.join(dir, "kvcached.sock") }) : undefined
  const otlpPort = await freePort()
  const collector = hung.otlp ? await silentServer({ port: otlpPort }) : undefined
  const c = await simAgentConfig({
    etcd: hung.etcd ? [etcd.endpoint] : [],
    etcdPrefix: `/hung${process.pid}`,
    simArgs: hung.engine ? ["--sim-ignore-sigterm"] : [],
    agent: { ...AGENT, ...(hung.otlp ? { otlp_endpoint: `http://127.0.0.1:${otlpPort}` } : {}) },
    engine: { stop_grace: `${STOP_GRACE_MS}ms` }
  })
  const kv = hung.kvcached
    ? {
        kv: {
          events: true,
          uds: path.join(dir, "kvcached.sock"),
          events_endpoint: `tcp://127.0.0.1:${await freePort()}`
        }
      }
    : {}
  const raw = { ...c.config, ...kv }
  const decoded = decodeConfigObject(raw, undefined)
  if (decoded._tag === "Failure") throw new Error(decoded.failure.message)
  const boundMs = Duration.toMillis(shutdownBound(decoded.success))

  const agent = await startAgent({ config: raw, readyTimeoutMs: 30_000 })
  const { pid: enginePid } = (await (await fetch(`${c.engineUrl}/sim/state`)).json()) as { pid: number }
  const { client, channel } = agentClient(agent.grpcAddress)
  try {
    // A call: a span for the collector, KV events for kvcached.
    const done = await generate(client, { prompt: "a b c d e f g h i j k l m n o p", sampling: { maxTokens: 4 } }).done
    expect(done.error).toBeUndefined()
  } finally {
    channel.close()
  }
  if (kvcached !== undefined) {
    const kvStatus = async () =>
      (
        (await (await fetch(`${agent.adminUrl}/status`)).json()) as {
          kv: { queued: number; kvcachedConnected: boolean }
        }
      ).kv
    // The bridge reached kvcached, which never answered: the call's events wait in the queue.
    const s = await pollUntil("KV events queued for a silent kvcached", async () => {
      const k = await kvStatus()
      return kvcached.accepted() > 0 && k.queued > 0 ? k : undefined
    })
    expect(s.kvcachedConnected).toBe(false)
  }
  if (hung.etcd) {
    await pollUntil("registered in etcd", () => agent.logs().some((l) => l.msg === "etcd registration: registered"))
    etcd.pause()
  }

  const signalledAt = Date.now()
  // A shutdown that hangs is SIGKILLed a little past its bound (and fails on the signal below), not by vitest.
  const exit = await agent.stop("SIGTERM", boundMs + 5_000)
  const elapsedMs = Date.now() - signalledAt
  if (collector !== undefined) expect(collector.accepted(), "the exporter reached the collector").toBeGreaterThan(0)
  const lines = (msg: string | RegExp) => agent.logs().filter((l) => matches(msg, l))
  const at = (msg: string | RegExp) => {
    const l = lines(msg)[0]
    if (l === undefined) throw new Error(`no log line ${msg}:\n${agent.tail()}`)
    return Date.parse(String(l.ts))
  }
  return { agent, ...exit, elapsedMs, boundMs, enginePid, lines, between: (from, to) => at(to) - at(from) }
}

/** What every case shares: exit 0 within the bound the drain logged, the engine gone. */
const expectCleanExit = (s: Stopped) => {
  const why = `${s.elapsedMs} ms (bound ${s.boundMs} ms):\n${s.agent.tail(60)}`
  expect({ code: s.code, signal: s.signal }, why).toEqual({ code: 0, signal: null })
  expect(s.elapsedMs, why).toBeLessThanOrEqual(s.boundMs)
  expect(s.lines("drain: started")[0]?.exit_within, why).toBe(Duration.format(Duration.millis(s.boundMs)))
  expect(s.lines("cgn-agent stopped"), why).toHaveLength(1)
  // the last line, said once every layer is released: what they say of their own stop (records kvcached never
  // acknowledged, spans dropped) comes before it
  expect(s.agent.logs().at(-1)?.msg, why).toBe("cgn-agent stopped")
  expect(processAlive(s.enginePid), "the engine is gone").toBe(false)
}

/** (a) etcd frozen: the lease revoke is one bounded call, and the log says the key is left to its TTL. */
const expectEtcdCutShort = (s: Stopped) => {
  // The drain's write went unanswered: the release does not spend a second deadline on it before the revoke.
  expect(s.lines("could not write state=draining before revoking"), s.agent.tail(60)).toEqual([])
  expect(s.between("drain: engine stopped", "lease revoke failed")).toBeLessThanOrEqual(ETCD_CALL_MS + 500)
  expect(s.lines("drain: could not write draining to etcd")).toHaveLength(1)
  expect(s.lines("state=draining was never written")).toHaveLength(1)
  expect(s.lines("etcd: lease revoke failed, the key expires after its TTL")).toHaveLength(1)
  expect(s.lines("etcd lease revoked")).toEqual([])
}

/** (b) the engine ignored SIGTERM: SIGKILLed after stop_grace, no sooner. */
const expectEngineKilled = (s: Stopped) => {
  expect(s.lines(/^engine group \d+ stopped: killed$/), s.agent.tail(60)).toHaveLength(1)
  const stopMs = s.between("engine Ready -> Stopping", /^engine group \d+ stopped/)
  expect(stopMs).toBeGreaterThanOrEqual(STOP_GRACE_MS)
  expect(stopMs).toBeLessThanOrEqual(STOP_GRACE_MS + 3_000)
}

/** (c) kvcached never answered: what it never acknowledged is said to be dropped. */
const expectKvDropped = (s: Stopped) => {
  const [dropped] = s.lines("kv events: stopping with records kvcached never acknowledged")
  expect(dropped, s.agent.tail(60)).toMatchObject({ level: "warn", kvcachedConnected: false })
  expect(dropped?.batches).toBeGreaterThan(0)
}

/** (d) the collector never answered: the flush is cut at its bound, and the log says the spans are dropped. */
const expectSpansDropped = (s: Stopped) => {
  const [dropped] = s.lines("tracing: the collector did not take the last spans within 3s; they are dropped")
  expect(dropped, s.agent.tail(60)).toMatchObject({ level: "warn" })
  // Logged after the servers closed: the flush is among the last steps, after the drain's own span ended
  expect(s.between("drain: engine stopped", "tracing: the collector did not take")).toBeGreaterThanOrEqual(2_900)
}

describe("SIGTERM with hung peers: exit 0 within the logged bound, and the log says what was cut short", () => {
  it("(a) etcd frozen after registration: the lease revoke is bounded", async () => {
    const s = await stopWithHungPeers({ etcd: true })
    expectCleanExit(s)
    expectEtcdCutShort(s)
  }, 60_000)

  it("(b) an engine that ignores SIGTERM: SIGKILL after engine.stop_grace", async () => {
    const s = await stopWithHungPeers({ engine: true })
    expectCleanExit(s)
    expectEngineKilled(s)
  }, 60_000)

  it("(c) kvcached accepts and never answers: the bridge does not hold the exit", async () => {
    const s = await stopWithHungPeers({ kvcached: true })
    expectCleanExit(s)
    expectKvDropped(s)
  }, 60_000)

  it("(d) an OTLP collector that accepts and never answers: the span flush is bounded", async () => {
    const s = await stopWithHungPeers({ otlp: true })
    expectCleanExit(s)
    expectSpansDropped(s)
  }, 60_000)

  it("(e) all of them at once", async () => {
    const s = await stopWithHungPeers({ etcd: true, engine: true, kvcached: true, otlp: true })
    expectCleanExit(s)
    expectEtcdCutShort(s)
    expectEngineKilled(s)
    expectKvDropped(s)
    expectSpansDropped(s)
  }, 90_000)
})
