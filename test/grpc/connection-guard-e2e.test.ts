// The built daemon in front of the simulator, with agent.max_connections_per_peer = 2, clients on several loopback
// addresses (distinct peers on Linux): the third connection of a peer whose two run calls is closed at accept
// (nothing of the server's reaches it), and admitted in place of one once it is idle (`idle_evicted`); a raw WINDOW_UPDATE flood is closed GOAWAY ENHANCE_YOUR_CALM; both are counted in /metrics
// (cgn_agent_grpc_connections_refused_total / _closed_total{reason}) and logged at warn, once per peer and reason a
// minute however often they come; and a Generate call on another connection completes meanwhile. With
// agent.keepalive_time at 1 s (its floor) and keepalive_timeout at 300 ms: a client that stopped answering after its
// handshake is closed, counted (reason="keepalive_timeout") and logged; a node:http2 client, which answers the PINGs,
// is kept.

import * as http2 from "node:http2"
import * as net from "node:net"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { GenerateRequest } from "../../src/gen/cgn/agent/v1/agent.ts"
import { type AgentHandle, killAllAgents, simAgentConfig, startAgent } from "../support/agent.ts"
import { toldCalm } from "../support/goaway.ts"
import { pollUntil } from "../support/poll.ts"

let agent: AgentHandle
let port = 0
const sockets: Array<{ destroy(): void }> = []

beforeAll(async () => {
  const { config, grpcPort } = await simAgentConfig({
    agent: { max_connections_per_peer: 2, keepalive_time: "1s", keepalive_timeout: "300ms" },
    simArgs: ["--sim-ttft", "1ms", "--sim-itl", "1ms"]
  })
  port = grpcPort
  agent = await startAgent({ config })
}, 60_000)

afterAll(async () => {
  for (const s of sockets) s.destroy()
  await killAllAgents()
})

const connect = async (from: string) => {
  const session = http2.connect(`http://127.0.0.1:${port}`, { localAddress: from } as http2.ClientSessionOptions)
  session.on("error", () => {})
  sockets.push(session)
  // Or its close: a connection refused at accept gets no SETTINGS.
  await new Promise((resolve) => {
    session.once("remoteSettings", resolve)
    session.once("close", resolve)
  })
  return session
}

/** One Generate call of 8 tokens on `session`: its grpc-status. */
const generate = (session: http2.ClientHttp2Session) =>
  new Promise<string | undefined>((resolve) => {
    const req = session.request({
      ":method": "POST",
      ":path": "/cgn.agent.v1.Agent/Generate",
      "content-type": "application/grpc",
      te: "trailers"
    })
    let status: string | undefined
    req.on("response", (h) => (status = (h["grpc-status"] as string | undefined) ?? status))
    req.on("trailers", (t) => (status = t["grpc-status"] as string))
    req.on("error", () => {})
    req.resume()
    req.on("close", () => resolve(status))
    const body = GenerateRequest.encode(
      GenerateRequest.fromPartial({ prompt: "hello", sampling: { maxTokens: 8, stop: [] } })
    ).finish()
    const prefix = Buffer.alloc(5)
    prefix.writeUInt32BE(body.length, 1)
    req.end(Buffer.concat([prefix, body]))
  })

/** A Health Watch left open on `session` (its first status received): the connection runs a call. */
const watch = async (session: http2.ClientHttp2Session) => {
  const req = session.request({
    ":method": "POST",
    ":path": "/grpc.health.v1.Health/Watch",
    "content-type": "application/grpc",
    te: "trailers"
  })
  req.on("error", () => {})
  req.end(Buffer.alloc(5))
  await new Promise((resolve) => req.once("data", resolve))
  return req
}

const frame = (type: number, stream: number, payload: Buffer) => {
  const h = Buffer.alloc(9)
  h.writeUIntBE(payload.length, 0, 3)
  h[3] = type
  h.writeUInt32BE(stream, 5)
  return Buffer.concat([h, payload])
}

/** A raw connection from `from` that sends the HTTP/2 preface: the bytes it received, and its close. */
const raw = (from: string) => {
  const socket = net.connect({ port, host: "127.0.0.1", localAddress: from })
  // the error that ended the socket, if one did (a write after the server closed: EPIPE, ECONNRESET)
  let error: string | undefined
  socket.on("error", (e: NodeJS.ErrnoException) => {
    error = e.code
  })
  sockets.push(socket)
  let received = Buffer.alloc(0)
  socket.on("data", (d: Buffer) => (received = Buffer.concat([received, d])))
  const closed = new Promise<void>((resolve) => socket.once("close", () => resolve()))
  socket.write(Buffer.concat([Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), frame(4, 0, Buffer.alloc(0))]))
  const goaway = (): number | undefined => {
    for (let i = 0; i + 9 <= received.length; i += 9 + received.readUIntBE(i, 3))
      if (received[i + 3] === 7 && i + 17 <= received.length) return received.readUInt32BE(i + 13)
    return undefined
  }
  return { socket, closed, goaway, received: () => received.length, error: () => error }
}

const metric = async (line: string) => {
  const page = await (await fetch(`${agent.adminUrl}/metrics`)).text()
  return page.split("\n").find((l) => l.startsWith(`${line} `))
}

const warnings = (text: string) => agent.logs().filter((l) => l.level === "warn" && String(l.msg).includes(text))

describe("the daemon's connection guard", () => {
  // First, on the fresh agent: README's every reason of both series is a 0 sample before anything was refused or closed.
  it("counts every refusal and closure reason from 0 from the start", async () => {
    for (const reason of ["peer_limit", "total_limit", "cooldown", "client_certificate"])
      expect(await metric(`cgn_agent_grpc_connections_refused_total{reason="${reason}"}`), reason).toMatch(/ 0$/)
    for (const reason of [
      "frame_flood",
      "reset_flood",
      "refusal_flood",
      "control_flood",
      "protocol_error",
      "keepalive_timeout",
      "idle_evicted"
    ])
      expect(await metric(`cgn_agent_grpc_connections_closed_total{reason="${reason}"}`), reason).toMatch(/ 0$/)
  })

  it("closes a peer's third connection at accept while both run a Watch, counts it, logs it once a minute; the peer's calls go on; once one is idle, a new one takes its place", async () => {
    expect(await metric('cgn_agent_grpc_connections_refused_total{reason="peer_limit"}')).toMatch(/ 0$/)
    const a = await connect("127.0.0.1")
    const b = await connect("127.0.0.1")
    await watch(a)
    const bWatch = await watch(b)
    for (let i = 0; i < 3; i++) {
      const third = raw("127.0.0.1")
      await third.closed
      expect(third.received()).toBe(0)
    }
    expect(await metric('cgn_agent_grpc_connections_refused_total{reason="peer_limit"}')).toMatch(/ 3$/)
    await pollUntil("the refusal's warning", () => warnings("max_connections_per_peer").length > 0)
    expect(warnings("max_connections_per_peer")).toHaveLength(1)
    expect(await generate(a)).toBe("0")
    // b's Watch ends (a Generate after it on b: the agent has read the cancel when it answers): b is idle, and the
    // next connection is admitted in its place.
    bWatch.close(http2.constants.NGHTTP2_CANCEL)
    expect(await generate(b)).toBe("0")
    const goaway = new Promise((resolve) => b.once("goaway", resolve))
    // Refused until b has been idle a second (services/grpc/ConnectionCaps.ts SETTLED_IDLE_MS).
    await pollUntil("a new connection admitted", async () => (await generate(await connect("127.0.0.1"))) === "0")
    await goaway
    expect(await metric('cgn_agent_grpc_connections_closed_total{reason="idle_evicted"}')).toMatch(/ 1$/)
    await pollUntil("the eviction's warning", () => warnings("took its place").length > 0)
    expect(warnings("took its place")[0]).toMatchObject({ peer: "127.0.0.1", for_peer: "127.0.0.1" })
  })

  it("closes a WINDOW_UPDATE flood GOAWAY ENHANCE_YOUR_CALM, counts and logs it; a call on another connection completes", async () => {
    const victim = await connect("127.0.0.2")
    const flooder = raw("127.0.0.3")
    const batch = Buffer.concat(Array.from({ length: 1000 }, () => frame(8, 0, Buffer.from([0, 0, 0, 1]))))
    let closed = false
    void flooder.closed.then(() => (closed = true))
    const calls: Array<Promise<string | undefined>> = []
    const t0 = performance.now()
    while (!closed && performance.now() - t0 < 10_000) {
      if (calls.length < 5) calls.push(generate(victim))
      if (!flooder.socket.write(batch))
        await Promise.race([new Promise((r) => flooder.socket.once("drain", r)), flooder.closed])
      else await new Promise((r) => setImmediate(r))
    }
    expect(closed).toBe(true)
    // (a flooder whose own write failed first may not have read it: toldCalm; the count and the warning are the server's)
    toldCalm(flooder)
    expect(await Promise.all(calls)).toEqual(calls.map(() => "0"))
    expect(await generate(victim)).toBe("0")
    expect(await metric('cgn_agent_grpc_connections_closed_total{reason="frame_flood"}')).toMatch(/ 1$/)
    await pollUntil("the flood's warning", () => warnings("ENHANCE_YOUR_CALM").length > 0)
    expect(warnings("ENHANCE_YOUR_CALM")[0]).toMatchObject({ peer: "127.0.0.3", reason: "frame_flood" })
    expect(await metric("cgn_agent_grpc_connections")).toBeDefined()
  })

  it("closes a client that answers no keepalive PING, counts and logs it; keeps one that answers", async () => {
    const kept = await connect("127.0.0.4")
    let pings = 0
    kept.on("ping", () => pings++)
    const silent = raw("127.0.0.5")
    await silent.closed
    expect(await metric('cgn_agent_grpc_connections_closed_total{reason="keepalive_timeout"}')).toMatch(/ 1$/)
    await pollUntil("the keepalive's warning", () => warnings("keepalive_timeout").length > 0)
    expect(warnings("keepalive_timeout")[0]).toMatchObject({ peer: "127.0.0.5", reason: "keepalive_timeout" })
    expect(pings).toBeGreaterThan(0)
    expect(await generate(kept)).toBe("0")
  })
})
