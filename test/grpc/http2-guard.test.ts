// The gRPC server's guard (layers/grpc/http2/Guard.ts) over real loopback sockets, clients on several loopback
// addresses (127.0.0.2, .3...: distinct peers on Linux): a raw WINDOW_UPDATE flood is closed GOAWAY
// ENHANCE_YOUR_CALM and reported, its peer is refused for the cool-down while another peer's calls are served; the
// connection past a peer's cap (or the total cap) is closed at accept, before the server's SETTINGS; a rapid reset
// that Node's guard closes is reported as such; and a busy client (256 streaming calls at once, small messages both
// ways, plaintext and TLS) wastes so little that a rule 64 times stricter than the default never closes it.

import { spawnSync } from "node:child_process"
import * as http2 from "node:http2"
import * as net from "node:net"
import * as tls from "node:tls"
import type * as grpc from "@grpc/grpc-js"
import { afterEach, describe, expect, it, vi } from "vitest"
import type { ServerCall } from "../../src/layers/grpc/http2/Call.ts"
import { type Sampled, sampleFloods } from "../../src/layers/grpc/http2/floodSample.ts"
import type { GuardEvent } from "../../src/layers/grpc/http2/Guard.ts"
import { Http2GrpcServer } from "../../src/layers/grpc/http2/Server.ts"
import { SETTLED_IDLE_MS } from "../../src/services/grpc/ConnectionCaps.ts"
import { type FloodLimits, fullBucket } from "../../src/services/grpc/FloodRule.ts"
import { frameMessage } from "../../src/services/grpc/Wire.ts"
import { makeTestPki } from "../support/certs.ts"
import { toldCalm } from "../support/goaway.ts"
import { pollUntil } from "../support/poll.ts"

const raw = (b: Buffer) => b
const method = (
  name: string,
  requestStream: boolean,
  responseStream: boolean
): grpc.MethodDefinition<Buffer, Buffer> => ({
  path: `/t.T/${name}`,
  requestStream,
  responseStream,
  requestSerialize: raw,
  requestDeserialize: raw,
  responseSerialize: raw,
  responseDeserialize: raw
})
const service = {
  echo: method("Echo", false, false),
  many: method("Many", false, true),
  chat: method("Chat", true, true)
} satisfies grpc.ServiceDefinition

const cleanups: Array<() => void> = []
afterEach(() => {
  for (const c of cleanups.splice(0)) c()
})

const start = async (
  o: {
    perPeer?: number
    total?: number
    flood?: FloodLimits
    peerFlood?: FloodLimits
    tls?: boolean
    readMs?: number
    peerResets?: { burst: number; ratePerSec: number }
    streamResets?: { burst: number; ratePerSec: number }
  } = {}
) => {
  const events: Array<GuardEvent> = []
  const pki = o.tls ? makeTestPki() : undefined
  const material = pki && { ca: pki.ca.cert, cert: pki.server.cert, key: pki.server.key }
  const server = new Http2GrpcServer({
    maxReceiveMessageLength: 1 << 20,
    maxConnectionsPerPeer: o.perPeer,
    maxConnections: o.total,
    floodLimits: o.flood,
    peerFloodLimits: o.peerFlood,
    peerResets: o.peerResets,
    streamResets: o.streamResets,
    requestReadTimeoutMs: o.readMs,
    tls: material && { current: () => material, subscribe: () => () => {} },
    onGuard: (e) => events.push(e)
  })
  server.addService(service, {
    echo: (call: ServerCall<Buffer, Buffer>, done: (e: null, v: Buffer) => void) => done(null, call.request),
    // 100 messages of 40 bytes: a token stream's shape.
    many: (call: ServerCall<Buffer, Buffer>) => {
      for (let i = 0; i < 100; i++) call.write(Buffer.alloc(40, 0x61))
      call.end()
    },
    chat: (call: ServerCall<Buffer, Buffer>) => {
      call.on("data", (m: Buffer) => call.write(m))
      call.on("end", () => call.end())
    }
  } as unknown as grpc.UntypedServiceImplementation)
  const port = await server.listen("127.0.0.1", 0)
  cleanups.push(() => {
    server.destroy()
    pki?.cleanup()
  })
  return { server, port, events, pki }
}

const connect = (port: number, from: string, pki?: ReturnType<typeof makeTestPki>) => {
  const session = pki
    ? http2.connect(`https://localhost:${port}`, {
        host: "127.0.0.1",
        localAddress: from,
        ca: pki.ca.cert,
        cert: pki.client.cert,
        key: pki.client.key
      } as http2.SecureClientSessionOptions)
    : http2.connect(`http://127.0.0.1:${port}`, { localAddress: from } as http2.ClientSessionOptions)
  session.on("error", () => {})
  cleanups.push(() => session.destroy())
  return session
}

const HEADERS = { ":method": "POST", "content-type": "application/grpc", te: "trailers" }

/** One call: its grpc-status, and the messages' bytes received. */
const call = (
  session: http2.ClientHttp2Session,
  path: string,
  body: Uint8Array | Array<Uint8Array> = frameMessage(Buffer.from("hi"))
) =>
  new Promise<{ status: string | undefined; reason: string | undefined; bytes: number }>((resolve) => {
    const req = session.request({ ...HEADERS, ":path": path })
    let status: string | undefined
    let reason: string | undefined
    let bytes = 0
    const head = (h: http2.IncomingHttpHeaders) => {
      status = (h["grpc-status"] as string | undefined) ?? status
      reason = (h["cgn-reason"] as string | undefined) ?? reason
    }
    req.on("response", head)
    req.on("trailers", head)
    req.on("data", (d: Buffer) => (bytes += d.length))
    req.on("error", () => {})
    req.on("close", () => resolve({ status, reason, bytes }))
    if (Array.isArray(body)) {
      for (const b of body) req.write(b)
      req.end()
    } else req.end(body)
  })

/** An HTTP/2 frame (RFC 9113 4.1). */
/** A Chat call left open on `session` (its first message echoed): the connection runs a call. */
const holdCall = async (session: http2.ClientHttp2Session) => {
  const req = session.request({ ...HEADERS, ":path": "/t.T/Chat" })
  req.on("error", () => {})
  req.write(frameMessage(Buffer.from("x")))
  await new Promise((resolve) => req.once("data", resolve))
  return req
}

const frame = (type: number, flags: number, stream: number, payload: Buffer) => {
  const h = Buffer.alloc(9)
  h.writeUIntBE(payload.length, 0, 3)
  h[3] = type
  h[4] = flags
  h.writeUInt32BE(stream, 5)
  return Buffer.concat([h, payload])
}
const PREFACE = Buffer.concat([Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), frame(4, 0, 0, Buffer.alloc(0))])

/** A raw connection from `from` that sends the preface; its reads (frames the server sent) and its close. */
const rawClient = (port: number, from: string, pki?: ReturnType<typeof makeTestPki>) => {
  const socket = pki
    ? tls.connect({
        socket: net.connect({ port, host: "127.0.0.1", localAddress: from }),
        ALPNProtocols: ["h2"],
        ca: pki.ca.cert,
        cert: pki.client.cert,
        key: pki.client.key,
        servername: "localhost"
      })
    : net.connect({ port, host: "127.0.0.1", localAddress: from })
  // the error that ended the socket, if one did (a write after the server closed: EPIPE, ECONNRESET)
  let error: string | undefined
  socket.on("error", (e: NodeJS.ErrnoException) => {
    error = e.code
  })
  cleanups.push(() => socket.destroy())
  let inBytes = Buffer.alloc(0)
  socket.on("data", (d: Buffer) => (inBytes = Buffer.concat([inBytes, d])))
  const closed = new Promise<void>((resolve) => socket.once("close", () => resolve()))
  socket.write(PREFACE)
  /** The error code of the GOAWAY the server sent, if one came. */
  const goaway = (): number | undefined => {
    for (let i = 0; i + 9 <= inBytes.length; i += 9 + inBytes.readUIntBE(i, 3))
      if (inBytes[i + 3] === 7 && i + 17 <= inBytes.length) return inBytes.readUInt32BE(i + 13)
    return undefined
  }
  return { socket, closed, goaway, received: () => inBytes.length, error: () => error }
}

/** `p`, or "pending" if it has not settled within `ms`: a bound on a wait that must be short. */
const within = <A>(p: Promise<A>, ms: number) =>
  Promise.race([p, new Promise<"pending">((resolve) => setTimeout(() => resolve("pending"), ms))])

/** Writes WINDOW_UPDATE (stream 0, increment 1) frames as fast as the socket takes them until it closes. */
const floodWindowUpdates = async (socket: net.Socket, closed: Promise<void>, maxMs: number) => {
  const batch = Buffer.concat(Array.from({ length: 1000 }, () => frame(8, 0, 0, Buffer.from([0, 0, 0, 1]))))
  let over = false
  void closed.then(() => (over = true))
  const t0 = performance.now()
  while (!over && performance.now() - t0 < maxMs) {
    if (!socket.write(batch)) await Promise.race([new Promise((r) => socket.once("drain", r)), closed])
    else await new Promise((r) => setImmediate(r))
  }
  return { closed: over, ms: performance.now() - t0 }
}

/**
 * Floods 256 KiB of WINDOW_UPDATEs from `from` and awaits its closure, then expects it to be the only event: the
 * sample that closed it read every other connection too, so a connection the rule would close was closed by then.
 */
const closesFlooder = async (
  port: number,
  from: string,
  events: Array<GuardEvent>,
  pki?: ReturnType<typeof makeTestPki>
) => {
  const flooder = rawClient(port, from, pki)
  flooder.socket.write(Buffer.concat(Array.from({ length: 20_000 }, () => frame(8, 0, 0, Buffer.from([0, 0, 0, 1])))))
  expect(await within(flooder.closed, 5_000)).not.toBe("pending")
  expect(events).toEqual([{ kind: "closed", reason: "frame_flood", peer: from, bytes: expect.any(Number) }])
}

/** Resets `n` calls on `session` (HEADERS, then RST_STREAM CANCEL), then awaits a PING: the server read them all. */
const resetStreams = async (session: http2.ClientHttp2Session, n: number) => {
  for (let i = 0; i < n && !session.closed && !session.destroyed; i++) {
    const req = session.request({ ...HEADERS, ":path": "/t.T/Echo" })
    req.on("error", () => {})
    req.close(http2.constants.NGHTTP2_CANCEL)
    if (i % 500 === 499) await new Promise((r) => setImmediate(r))
  }
  if (!session.closed && !session.destroyed) await new Promise<void>((resolve) => session.ping(() => resolve()))
}

describe("the gRPC server's guard", () => {
  it("closes a WINDOW_UPDATE flood GOAWAY ENHANCE_YOUR_CALM, reports it, refuses its peer for the cool-down; another peer is served", async () => {
    const { port, events } = await start()
    const victim = connect(port, "127.0.0.1")
    expect((await call(victim, "/t.T/Echo")).status).toBe("0")
    const flooder = rawClient(port, "127.0.0.2")
    const flood = await floodWindowUpdates(flooder.socket, flooder.closed, 5_000)
    expect(flood.closed).toBe(true)
    toldCalm(flooder)
    expect(events).toContainEqual(expect.objectContaining({ kind: "closed", reason: "frame_flood", peer: "127.0.0.2" }))
    // The peer comes back at once: refused at accept (nothing of the server's comes to it).
    const again = rawClient(port, "127.0.0.2")
    expect(await within(again.closed, 5_000)).not.toBe("pending")
    expect(again.received()).toBe(0)
    expect(events).toContainEqual({ kind: "refused", reason: "cooldown", peer: "127.0.0.2", limit: 0 })
    // The other peer's connection was never touched.
    expect((await call(victim, "/t.T/Echo")).status).toBe("0")
  })

  it("closes a PING flood, whose acks (the agent's writes) cancelled it: it was never closed", async () => {
    // the rule 64 times stricter (128 KiB at once, 16 KiB/s), so that 340 KB of PINGs is a flood
    const { port, events } = await start({ flood: { burstBytes: 128 * 1024, floorBytesPerSec: 16 * 1024 } })
    const flooder = rawClient(port, "127.0.0.6")
    // PINGs (17 bytes each) paced 200 at a time, below nghttp2's own limit on acks waiting to go out (a burst of
    // thousands is closed by nghttp2 itself), each acked by node:http2
    const batch = Buffer.concat(Array.from({ length: 200 }, () => frame(6, 0, 0, Buffer.alloc(8))))
    let sent = 0
    let over = false
    void flooder.closed.then(() => (over = true))
    while (!over && sent < 100 * batch.length) {
      flooder.socket.write(batch)
      sent += batch.length
      await new Promise((r) => setTimeout(r, 1))
    }
    expect(await within(flooder.closed, 5_000)).not.toBe("pending")
    toldCalm(flooder)
    expect(events).toEqual([{ kind: "closed", reason: "frame_flood", peer: "127.0.0.6", bytes: expect.any(Number) }])
  })

  it("closes a SETTINGS flood, whose acks (the agent's writes) cancelled it: it was never closed", async () => {
    // README: the acks the agent sends for the client's own PINGs and SETTINGS are not its writes. Empty SETTINGS
    // frames (9 bytes, each acked with 9) paced as the PING flood's, under the same stricter rule.
    const { port, events } = await start({ flood: { burstBytes: 128 * 1024, floorBytesPerSec: 16 * 1024 } })
    const flooder = rawClient(port, "127.0.0.7")
    const batch = Buffer.concat(Array.from({ length: 200 }, () => frame(4, 0, 0, Buffer.alloc(0))))
    let sent = 0
    let over = false
    void flooder.closed.then(() => (over = true))
    while (!over && sent < 300 * batch.length) {
      flooder.socket.write(batch)
      sent += batch.length
      await new Promise((r) => setTimeout(r, 1))
    }
    expect(await within(flooder.closed, 5_000)).not.toBe("pending")
    toldCalm(flooder)
    expect(events).toEqual([{ kind: "closed", reason: "frame_flood", peer: "127.0.0.7", bytes: expect.any(Number) }])
  })

  it("closes a peer's connections that flood together, each under its own limit; its clean connection and other peers' stay", async () => {
    // A rule 64 times stricter than the default for a connection (16 KiB/s, 128 KiB at once), and a peer's four times
    // that but at once twice (256 KiB): each flooder wastes 100 KiB, under its own burst; a peer's four pass the peer's.
    const { port, events } = await start({
      flood: { floorBytesPerSec: 16 << 10, burstBytes: 128 << 10 },
      peerFlood: { floorBytesPerSec: 64 << 10, burstBytes: 256 << 10 }
    })
    const wasteEach = Buffer.concat(
      Array.from({ length: Math.ceil((100 << 10) / 13) }, () => frame(8, 0, 0, Buffer.from([0, 0, 0, 1])))
    )
    const clean = connect(port, "127.0.0.4")
    expect((await call(clean, "/t.T/Echo")).status).toBe("0")
    // Four peers, one flooder each: never closed (a fifth peer's flood, closed alone, shows a sample read them all).
    for (const from of ["127.0.0.5", "127.0.0.6", "127.0.0.7", "127.0.0.8"])
      rawClient(port, from).socket.write(wasteEach)
    await closesFlooder(port, "127.0.0.9", events)
    events.length = 0
    // One peer, four flooders: all four closed ENHANCE_YOUR_CALM, reported; its clean connection still serves.
    const flooders = Array.from({ length: 4 }, () => rawClient(port, "127.0.0.4"))
    for (const f of flooders) f.socket.write(wasteEach)
    for (const f of flooders) expect(await within(f.closed, 5_000)).not.toBe("pending")
    expect(flooders.map((f) => f.goaway())).toEqual(Array(4).fill(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM))
    expect(events).toEqual(
      Array(4).fill({ kind: "closed", reason: "frame_flood", peer: "127.0.0.4", bytes: expect.any(Number) })
    )
    expect((await call(clean, "/t.T/Echo")).status).toBe("0")
  })

  it("closes the connection past a peer's cap at accept, before the server's SETTINGS, while its connections run calls; other peers connect", async () => {
    const { port, events, server } = await start({ perPeer: 2 })
    const a = connect(port, "127.0.0.3")
    const b = connect(port, "127.0.0.3")
    expect((await call(a, "/t.T/Echo")).status).toBe("0")
    expect((await call(b, "/t.T/Echo")).status).toBe("0")
    const held = [await holdCall(a), await holdCall(b)]
    const third = rawClient(port, "127.0.0.3")
    expect(await within(third.closed, 5_000)).not.toBe("pending")
    expect(third.received()).toBe(0)
    expect(events).toEqual([{ kind: "refused", reason: "peer_limit", peer: "127.0.0.3", limit: 2 }])
    expect((await call(connect(port, "127.0.0.4"), "/t.T/Echo")).status).toBe("0")
    expect(server.connections).toBe(3)
    // A closed connection frees its place.
    a.destroy()
    await pollUntil("the connection counted out", () => server.connections === 2)
    expect((await call(connect(port, "127.0.0.3"), "/t.T/Echo")).status).toBe("0")
    expect(held[1]?.closed).toBe(false)
  })

  it("closes the connection past the total cap at accept, while the connections run calls", async () => {
    const { port, events } = await start({ total: 2 })
    for (const from of ["127.0.0.5", "127.0.0.6"]) {
      const session = connect(port, from)
      expect((await call(session, "/t.T/Echo")).status).toBe("0")
      await holdCall(session)
    }
    const third = rawClient(port, "127.0.0.7")
    expect(await within(third.closed, 5_000)).not.toBe("pending")
    expect(third.received()).toBe(0)
    expect(events).toEqual([{ kind: "refused", reason: "total_limit", peer: "127.0.0.7", limit: 2 }])
  })

  /** Connects from `from` and makes an Echo call, again until one is answered (a place freed); the session. */
  const admittedFrom = (port: number, from: string, pki?: ReturnType<typeof makeTestPki>) =>
    pollUntil(`a connection from ${from} admitted`, async () => {
      const s = connect(port, from, pki)
      if ((await call(s, "/t.T/Echo")).status === "0") return s
      s.destroy()
      return undefined
    })

  it(`admits a connection past a peer's cap in place of the one idle longest, once idle ${SETTLED_IDLE_MS} ms: closed GOAWAY NO_ERROR and reported; busy ones are kept`, async () => {
    const { port, events, server } = await start({ perPeer: 3 })
    const [a, b, c] = [connect(port, "127.0.0.19"), connect(port, "127.0.0.19"), connect(port, "127.0.0.19")]
    for (const s of [b, a, c]) expect((await call(s, "/t.T/Echo")).status).toBe("0")
    const held = await holdCall(c)
    const goaway = new Promise<number>((resolve) => b.once("goaway", resolve))
    // Refused until b has been idle a second, then admitted in its place.
    await admittedFrom(port, "127.0.0.19")
    expect(await goaway).toBe(http2.constants.NGHTTP2_NO_ERROR)
    expect(events.filter((e) => e.kind === "closed")).toEqual([
      { kind: "closed", reason: "idle_evicted", peer: "127.0.0.19", forPeer: "127.0.0.19" }
    ])
    const refusals = events.filter((e) => e.kind === "refused")
    expect(refusals.length).toBeGreaterThan(0)
    expect(refusals.every((e) => e.reason === "peer_limit")).toBe(true)
    await pollUntil("b's connection counted out", () => server.open.sessions === 3)
    expect(a.closed || a.destroyed).toBe(false)
    expect(held.closed).toBe(false)
    // The evicted client's reconnection takes the next idlest's place (a; c runs a call).
    await admittedFrom(port, "127.0.0.19")
    await pollUntil("a closed", () => a.closed || a.destroyed)
    expect(held.closed).toBe(false)
    // Each connection gave its place back once: at its eviction, not again at its socket's close.
    await pollUntil("the sessions of c and the two new alone", () => server.open.sessions === 3)
    expect(server.connections).toBe(3)
  })

  it("at the total cap and its own, closes one of the new peer's own idle connections, no other peer's; with none idle, closes nothing", async () => {
    const { port, events, server } = await start({ total: 3, perPeer: 2 })
    const other = connect(port, "127.0.0.20")
    const mine = [connect(port, "127.0.0.21"), connect(port, "127.0.0.21")]
    for (const s of [other, ...mine]) expect((await call(s, "/t.T/Echo")).status).toBe("0")
    const held = await holdCall(mine[1]!)
    const third = await admittedFrom(port, "127.0.0.21")
    expect(events.filter((e) => e.kind === "closed")).toEqual([
      { kind: "closed", reason: "idle_evicted", peer: "127.0.0.21", forPeer: "127.0.0.21" }
    ])
    await pollUntil("mine[0] counted out", () => server.open.sessions === 3)
    expect(other.closed || other.destroyed).toBe(false)
    // Both of 127.0.0.21's connections now run calls: its next is refused, and no other peer's is closed for it.
    await holdCall(third)
    const refused = rawClient(port, "127.0.0.21")
    expect(await within(refused.closed, 5_000)).not.toBe("pending")
    expect(refused.received()).toBe(0)
    expect(events.filter((e) => e.kind === "closed")).toHaveLength(1)
    expect(other.closed || other.destroyed).toBe(false)
    expect(held.closed).toBe(false)
  })

  it("at the total cap, takes another peer's idle connection on a plaintext listener, never under TLS (no certificate shown yet)", async () => {
    const plain = await start({ total: 1 })
    const secure = await start({ total: 1, tls: true })
    const plainRouter = connect(plain.port, "127.0.0.25")
    const secureRouter = connect(secure.port, "127.0.0.25", secure.pki)
    expect((await call(plainRouter, "/t.T/Echo")).status).toBe("0")
    expect((await call(secureRouter, "/t.T/Echo")).status).toBe("0")
    // Plaintext: once the router's connection has been idle a second, another peer's takes its place.
    await admittedFrom(plain.port, "127.0.0.26")
    expect(plain.events.filter((e) => e.kind === "closed")).toEqual([
      { kind: "closed", reason: "idle_evicted", peer: "127.0.0.25", forPeer: "127.0.0.26" }
    ])
    // Under TLS, idle as long: refused, the router's connection kept.
    const refused = rawClient(secure.port, "127.0.0.26")
    expect(await within(refused.closed, 5_000)).not.toBe("pending")
    expect(secure.events).toEqual([{ kind: "refused", reason: "total_limit", peer: "127.0.0.26", limit: 1 }])
    expect((await call(secureRouter, "/t.T/Echo")).status).toBe("0")
  })

  it("at a peer's own cap, takes its idle connection on a plaintext listener, never under TLS (the new one from the same address has shown no certificate)", async () => {
    const plain = await start({ perPeer: 1 })
    const secure = await start({ perPeer: 1, tls: true })
    const plainRouter = connect(plain.port, "127.0.0.28")
    const secureRouter = connect(secure.port, "127.0.0.28", secure.pki)
    expect((await call(plainRouter, "/t.T/Echo")).status).toBe("0")
    expect((await call(secureRouter, "/t.T/Echo")).status).toBe("0")
    await admittedFrom(plain.port, "127.0.0.28")
    expect(plain.events.filter((e) => e.kind === "closed")).toHaveLength(1)
    // Under TLS, idle as long: a TCP connect from the router's address is refused, the router's connection kept.
    const refused = rawClient(secure.port, "127.0.0.28")
    expect(await within(refused.closed, 5_000)).not.toBe("pending")
    expect(secure.events).toEqual([{ kind: "refused", reason: "peer_limit", peer: "127.0.0.28", limit: 1 }])
    expect((await call(secureRouter, "/t.T/Echo")).status).toBe("0")
  })

  it("counts nothing for connections their clients reset while they waited to be accepted (no address: all would have one key)", async () => {
    const { port, server } = await start({ total: 8 })
    // The server's loop is blocked while a child connects 5 sockets and resets each (the kernel completes the
    // handshakes meanwhile): each is then accepted with no address.
    const script = `const net = require("node:net"); let n = 0
      for (let i = 0; i < 5; i++) { const c = net.connect(${port}, "127.0.0.1", () => { c.resetAndDestroy(); if (++n === 5) process.exit(0) }); c.on("error", () => {}) }`
    for (let round = 0; round < 3; round++) spawnSync(process.execPath, ["-e", script], { timeout: 10_000 })
    // Accepted after the reset ones (one accept queue): when its call is answered, the server has seen them all.
    const legit = connect(port, "127.0.0.27")
    expect((await call(legit, "/t.T/Echo")).status).toBe("0")
    await pollUntil("the reset connections closed", () => server.open.sessions === 1)
    expect(server.connections).toBe(1)
  })

  it("under TLS at the total cap, closes a connection that has not started its handshake for a second, for a new client", async () => {
    const { port, events, pki } = await start({ tls: true, total: 2 })
    const busy = connect(port, "127.0.0.24", pki)
    expect((await call(busy, "/t.T/Echo")).status).toBe("0")
    const held = await holdCall(busy)
    // A TCP connection that never sends its ClientHello: the server would wait for it 10 s (Connections.ts).
    const stuck = net.connect({ port, host: "127.0.0.1", localAddress: "127.0.0.22" })
    stuck.on("error", () => {})
    cleanups.push(() => stuck.destroy())
    const stuckClosed = new Promise((resolve) => stuck.once("close", resolve))
    await new Promise((resolve) => stuck.once("connect", resolve))
    // Until the stuck one has waited a second a new client is refused (a handshake may be a router's, connecting);
    // then it is admitted in its place.
    const status = await pollUntil("a new client admitted", async () => {
      const s = connect(port, "127.0.0.23", pki)
      const r = await call(s, "/t.T/Echo")
      if (r.status === "0") return r.status
      s.destroy()
      return undefined
    })
    expect(status).toBe("0")
    expect(await within(stuckClosed, 5_000)).not.toBe("pending")
    expect(events.filter((e) => e.kind === "closed")).toEqual([
      { kind: "closed", reason: "idle_evicted", peer: "127.0.0.22", forPeer: "127.0.0.23" }
    ])
    expect(events.filter((e) => e.kind === "refused").every((e) => e.peer === "127.0.0.23")).toBe(true)
    expect(held.closed).toBe(false)
  })

  for (const withData of [false, true])
    it(`reports a connection Node's rapid-reset guard closed, and refuses its peer for the cool-down (${withData ? "HEADERS, DATA, RST" : "HEADERS, RST"})`, async () => {
      // Node's guard at 500 then 10/s, not the agent's 10,000 then 1,000/s: a loaded host's client in this process
      // reset streams hardly faster than that refill, and never reached the guard within the test's time
      const { port, events } = await start({ streamResets: { burst: 500, ratePerSec: 10 } })
      const session = connect(port, withData ? "127.0.0.18" : "127.0.0.8")
      await new Promise((r) => session.once("remoteSettings", r))
      const closed = new Promise<void>((r) => session.once("close", () => r()))
      for (let i = 0; i < 5_000 && !session.closed && !session.destroyed; i++) {
        const req = session.request({ ...HEADERS, ":path": "/t.T/Echo" })
        req.on("error", () => {})
        if (withData) req.write(frameMessage(Buffer.from("x")))
        req.close(http2.constants.NGHTTP2_CANCEL)
        if (i % 500 === 499) await new Promise((r) => setImmediate(r))
      }
      await closed
      const peer = withData ? "127.0.0.18" : "127.0.0.8"
      await pollUntil("the guard's report", () => events.length > 0)
      expect(events[0]).toEqual({ kind: "closed", reason: "reset_flood", peer })
      const again = rawClient(port, peer)
      expect(await within(again.closed, 5_000)).not.toBe("pending")
      expect(events).toContainEqual({ kind: "refused", reason: "cooldown", peer, limit: 0 })
    }, 30_000)

  it("closes a connection whose streams are refused past the refusal budget (an unknown method in a loop)", async () => {
    const { port, events } = await start()
    const session = connect(port, "127.0.0.15")
    const goaway = new Promise<number>((r) => session.once("goaway", (code: number) => r(code)))
    // 1,500 at once: past the burst of 1,000 before its refill (100/s) can cover them
    await Promise.all(Array.from({ length: 1_500 }, () => call(session, "/t.T/NewMethod")))
    expect(await within(goaway, 5_000)).toBe(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM)
    expect(events).toContainEqual({ kind: "closed", reason: "refusal_flood", peer: "127.0.0.15" })
    // another peer is served, and this one's calls to a method it lacks are refused as before below the budget
    const other = connect(port, "127.0.0.16")
    expect((await call(other, "/t.T/NewMethod")).status).toBe("12")
    expect((await call(other, "/t.T/Echo")).status).toBe("0")
  })

  it("counts streams that are no gRPC call (a GET) toward the refusal budget too", async () => {
    // README: the refusal flood counts "streams refused before any method ran (... not gRPC ...)"
    const { port, events } = await start()
    const session = connect(port, "127.0.0.29")
    const goaway = new Promise<number>((r) => session.once("goaway", (code: number) => r(code)))
    const get = () =>
      new Promise<void>((resolve) => {
        const req = session.request({ ":method": "GET", ":path": "/t.T/Echo" })
        req.on("error", () => {})
        req.resume()
        req.on("close", () => resolve())
        req.end()
      })
    // 1,500 at once, as the unknown-method flood above
    await Promise.all(Array.from({ length: 1_500 }, get))
    expect(await within(goaway, 5_000)).toBe(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM)
    expect(events).toContainEqual({ kind: "closed", reason: "refusal_flood", peer: "127.0.0.29" })
  })

  it("reports a CONTINUATION flood nghttp2 closed as control_flood, and refuses its peer for the cool-down", async () => {
    const { port, events } = await start()
    const client = rawClient(port, "127.0.0.20")
    // HEADERS without END_HEADERS, then CONTINUATION frames of one small literal field each: nghttp2 closes the
    // connection past 8 of them (NGHTTP2_ERR_TOO_MANY_CONTINUATIONS, CVE-2024-27316's class of floods).
    const path = Buffer.from("/t.T/Echo")
    client.socket.write(frame(1, 0, 1, Buffer.concat([Buffer.from([0x83, 0x86, 0x04, path.length]), path])))
    const field = Buffer.from([0x00, 1, 0x78, 1, 0x79])
    client.socket.write(Buffer.concat(Array.from({ length: 100 }, () => frame(9, 0, 1, field))))
    expect(await within(client.closed, 5_000)).not.toBe("pending")
    await pollUntil("the guard's report", () => events.length > 0)
    expect(events).toEqual([{ kind: "closed", reason: "control_flood", peer: "127.0.0.20" }])
    const again = rawClient(port, "127.0.0.20")
    expect(await within(again.closed, 5_000)).not.toBe("pending")
    expect(events).toContainEqual({ kind: "refused", reason: "cooldown", peer: "127.0.0.20", limit: 0 })
  })

  it("reports a busy connection's protocol error as one, not as the rapid-reset guard's closure (no cool-down)", async () => {
    const { port, events } = await start()
    const client = rawClient(port, "127.0.0.14")
    const lit = (n: string, v: string) =>
      Buffer.concat([Buffer.from([0x00, n.length]), Buffer.from(n), Buffer.from([v.length]), Buffer.from(v)])
    const block = Buffer.concat(
      [
        [":method", "POST"],
        [":scheme", "http"],
        [":path", "/t.T/Echo"],
        [":authority", "x"],
        ["content-type", "application/grpc"],
        ["te", "trailers"]
      ].map(([n, v]) => lit(n as string, v as string))
    )
    // 11,000 calls (past the guard's burst of 10,000 resets), none reset by the client: each served.
    let id = 1
    for (let b = 0; b < 11; b++) {
      const frames: Array<Buffer> = []
      for (let i = 0; i < 1000; i++, id += 2) frames.push(frame(1, 0x4, id, block), frame(0, 0x1, id, Buffer.alloc(5))) // HEADERS; an empty message, END_STREAM
      client.socket.write(Buffer.concat(frames))
      await pollUntil("the batch answered", () => client.received() >= (b + 1) * 1000 * 10)
    }
    client.socket.write(frame(0, 0, 0, Buffer.from("x"))) // DATA on stream 0: PROTOCOL_ERROR (RFC 9113 6.1)
    expect(await within(client.closed, 5_000)).not.toBe("pending")
    await pollUntil("the guard's report", () => events.length > 0)
    expect(events).toEqual([{ kind: "closed", reason: "protocol_error", peer: "127.0.0.14" }])
    // No cool-down (README: only a flood's address is refused): the address's next connection is served at once.
    expect((await call(connect(port, "127.0.0.14"), "/t.T/Echo")).status).toBe("0")
    expect(events).toEqual([{ kind: "closed", reason: "protocol_error", peer: "127.0.0.14" }])
  })

  it("closes a peer's connection past the peer's reset budget on all its connections together, ENHANCE_YOUR_CALM", async () => {
    // Default: 40,000 at once, 1,000/s; Node's guard (10,000 per connection) never sees these.
    const { port, events } = await start({ peerResets: { burst: 300, ratePerSec: 1 } })
    const resets = async (session: http2.ClientHttp2Session, n: number) => {
      for (let i = 0; i < n && !session.closed && !session.destroyed; i++) {
        const req = session.request({ ...HEADERS, ":path": "/t.T/Echo" })
        req.on("error", () => {})
        req.close(http2.constants.NGHTTP2_CANCEL)
      }
      // A PING answered: the server has read every reset sent before it.
      await new Promise<void>((resolve) => session.ping(() => resolve()))
    }
    const a = connect(port, "127.0.0.10")
    const b = connect(port, "127.0.0.10")
    const goaway = new Promise<number>((resolve) => b.once("goaway", (code) => resolve(code)))
    await resets(a, 200)
    expect(events).toEqual([])
    await resets(b, 200)
    expect(await within(goaway, 5_000)).toBe(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM)
    expect(events).toEqual([{ kind: "closed", reason: "reset_flood", peer: "127.0.0.10" }])
    // Another peer's calls go on.
    expect((await call(connect(port, "127.0.0.11"), "/t.T/Echo")).status).toBe("0")
  })

  it("closes a peer's connection at the reset past its budget, not at the budget's last one", async () => {
    // No refill (0/s): the budget of 5 is spent by exactly 5 resets, and the 6th is past it.
    const { port, events } = await start({ peerResets: { burst: 5, ratePerSec: 0 } })
    const session = connect(port, "127.0.0.24")
    const goaway = new Promise<number>((resolve) => session.once("goaway", (code) => resolve(code)))
    await resetStreams(session, 5)
    expect(events).toEqual([])
    expect((await call(session, "/t.T/Echo")).status).toBe("0")
    await resetStreams(session, 1)
    expect(await within(goaway, 5_000)).toBe(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM)
    expect(events).toEqual([{ kind: "closed", reason: "reset_flood", peer: "127.0.0.24" }])
  })

  it("by default lets one address reset 20,000 streams at once over 4 connections (its budget is 40,000)", async () => {
    const { port, events } = await start()
    const sessions = [1, 2, 3, 4].map(() => connect(port, "127.0.0.25"))
    // 5,000 each: under Node's guard on each connection (10,000), over one connection's worth (10,000) together
    await Promise.all(sessions.map((s) => resetStreams(s, 5_000)))
    expect(events).toEqual([])
    expect(sessions.every((s) => !s.closed && !s.destroyed)).toBe(true)
  }, 30_000)

  it("sizes Node's rapid-reset guard for a router: after most of the burst of 10,000, 1,000 more a second later are kept", async () => {
    const { port, events } = await start()
    const session = connect(port, "127.0.0.26")
    let goaway: number | undefined
    session.once("goaway", (code: number) => (goaway = code))
    await resetStreams(session, 9_500)
    // nghttp2 refills its budget once a whole second has passed: 1,000 at Node's rate for a router, 33 at its default
    await new Promise((r) => setTimeout(r, 1_100))
    await resetStreams(session, 1_000)
    expect(goaway).toBeUndefined()
    expect(events).toEqual([])
    expect((await call(session, "/t.T/Echo")).status).toBe("0")
  }, 30_000)

  it("closes a connection at the refusal past the budget of 1,000, not at the budget's last one", async () => {
    // performance.now() frozen (the guard's clock): no refill while the calls are refused.
    const now = performance.now()
    const frozen = vi.spyOn(performance, "now").mockReturnValue(now)
    cleanups.push(() => frozen.mockRestore())
    const { port, events } = await start()
    const session = connect(port, "127.0.0.27")
    const goaway = new Promise<number>((r) => session.once("goaway", (code: number) => r(code)))
    const refused = await Promise.all(Array.from({ length: 1_000 }, () => call(session, "/t.T/NewMethod")))
    expect(refused.every((r) => r.status === "12")).toBe(true)
    expect(events).toEqual([])
    expect(session.closed || session.destroyed).toBe(false)
    await call(session, "/t.T/NewMethod")
    expect(await within(goaway, 5_000)).toBe(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM)
    expect(events).toEqual([{ kind: "closed", reason: "refusal_flood", peer: "127.0.0.27" }])
  })

  for (const tls of [false, true])
    it(`never closes a busy client: 256 streaming calls at once, both ways, on 4 connections (${tls ? "TLS" : "plaintext"}), under rules 64 times stricter`, async () => {
      // Default: 1 MiB/s for ever, 8 MiB at once; for a client address, four times that.
      const flood = { floorBytesPerSec: 16 * 1024, burstBytes: 128 * 1024 }
      const peerFlood = { floorBytesPerSec: 64 * 1024, burstBytes: 512 * 1024 }
      const { port, events, pki } = await start({ tls, flood, peerFlood })
      const sessions = Array.from({ length: 4 }, () => connect(port, "127.0.0.9", pki))
      const chat = Array.from({ length: 20 }, (_, i) => frameMessage(Buffer.alloc(30 + i, 0x62)))
      for (let round = 0; round < 4; round++) {
        const results = await Promise.all(
          Array.from({ length: 256 }, (_, i) => {
            const session = sessions[i % 4] as http2.ClientHttp2Session
            return i % 8 < 4 ? call(session, "/t.T/Many") : call(session, "/t.T/Chat", chat)
          })
        )
        expect(results.every((r) => r.status === "0")).toBe(true)
        expect(results[0]!.bytes).toBe(100 * 45)
      }
      // The same rule closes 256 KiB of WINDOW_UPDATEs (twice its burst) from another peer: it was in force, and the
      // sample that found it read the busy connection too (each sample reads every connection).
      await closesFlooder(port, "127.0.0.12", events, pki)
      expect(sessions.every((s) => !s.closed && !s.destroyed)).toBe(true)
    }, 60_000)

  it("counts the bodies of calls it refuses or stops early as theirs, not a flood: the connection stays", async () => {
    // A rule far stricter than the default: 40 refused 60 KB bodies are 2.4 MB, 19 times its burst.
    const { port, events } = await start({ flood: { floorBytesPerSec: 16 * 1024, burstBytes: 128 * 1024 } })
    const session = connect(port, "127.0.0.1")
    const body = frameMessage(Buffer.alloc(60_000, 0x61))
    const oversized = Buffer.concat([Buffer.from([0, 0, 0x20, 0, 0]), Buffer.alloc(60_000, 0x61)]) // says 2 MiB
    for (let i = 0; i < 40; i++) {
      // a method this server lacks (a newer router's, in a rolling upgrade): refused before the body is read
      expect((await call(session, "/t.T/NewMethod", body)).status).toBe("12")
      // a message over the limit (1 MiB here): refused on its length prefix, 60 KB of it in flight
      expect((await call(session, "/t.T/Echo", oversized)).status).toBe("8")
    }
    await closesFlooder(port, "127.0.0.13", events)
    expect((await call(session, "/t.T/Echo")).status).toBe("0")
  })
})

describe("requestReadTimeoutMs on a request-streaming call", () => {
  it("ends the call RESOURCE_EXHAUSTED (request_read_timeout) when a message started does not arrive whole in time", async () => {
    const { port } = await start({ readMs: 200 })
    const session = connect(port, "127.0.0.1")
    const req = session.request({ ...HEADERS, ":path": "/t.T/Chat" })
    let status: string | undefined
    let reason: string | undefined
    let message: string | undefined
    let echoed = 0
    req.on("response", (h) => (status = (h["grpc-status"] as string | undefined) ?? status))
    req.on("trailers", (t) => {
      status = t["grpc-status"] as string
      reason = t["cgn-reason"] as string
      message = decodeURIComponent(t["grpc-message"] as string)
    })
    req.on("data", (d: Buffer) => (echoed += d.length))
    req.on("error", () => {})
    const closed = new Promise((r) => req.on("close", r))
    const t0 = performance.now()
    // Two whole messages, answered; then half of a third, never finished.
    req.write(frameMessage(Buffer.from("one")))
    await pollUntil("the first answer", () => echoed === 8)
    // Idle between messages is not bounded: longer than the bound here.
    await new Promise((r) => setTimeout(r, 400))
    req.write(frameMessage(Buffer.from("two")))
    await pollUntil("the second answer", () => echoed === 16)
    const t1 = performance.now()
    req.write(frameMessage(Buffer.from("three")).subarray(0, 6))
    expect(await within(closed, 5_000)).not.toBe("pending")
    expect(status).toBe("8")
    expect(reason).toBe("request_read_timeout")
    // one message's bound, named by the key that sets it
    expect(message).toBe(
      "a request message did not arrive in full within 200 ms of its first bytes (agent.request_read_timeout)"
    )
    expect(performance.now() - t1).toBeGreaterThanOrEqual(190)
    expect(performance.now() - t0).toBeGreaterThan(600)
  })
})

describe("the flood sample (floodSample.ts), on sessions whose socket counters the test sets", () => {
  const rules = {
    connection: { burstBytes: 128 * 1024, floorBytesPerSec: 16 * 1024 },
    peer: { burstBytes: 64 * 1024, floorBytesPerSec: 16 * 1024 }
  }
  const session = () => ({ destroyed: false, socket: { bytesRead: 0, bytesWritten: 0 } })
  const followed = (peer: string): Sampled => ({
    peer,
    accounted: 0,
    bucket: fullBucket(0, rules.connection),
    read: 0,
    written: 0,
    pings: 0,
    settings: 0
  })
  const sample = (sessions: Map<ReturnType<typeof session>, Sampled>, now: number) => {
    const closed: Array<[ReturnType<typeof session>, string, number]> = []
    sampleFloods(sessions as unknown as Map<http2.Http2Session, Sampled>, new Map(), rules, now, (s, peer, waste) =>
      closed.push([s as unknown as ReturnType<typeof session>, peer, waste])
    )
    return closed
  }

  it("credits a call's bytes to the sample they were read in only: a flood after a large call is one", () => {
    const s = session()
    const f = followed("127.0.0.1")
    const sessions = new Map([[s, f]])
    // 100 KB read, all a call's (the server accounts for them): no waste
    s.socket.bytesRead = 100_000
    f.accounted = 100_000
    expect(sample(sessions, 0)).toEqual([])
    // then 150 KB of frames no call accounts for, in the same millisecond (no refill): past the burst of 128 KiB
    s.socket.bytesRead += 150_000
    expect(sample(sessions, 0)).toEqual([[s, "127.0.0.1", 150_000]])
  })

  it("charges a connection closed for its own flood to no peer budget: its address's other connection stays", () => {
    const flooder = session()
    const other = session()
    const sessions = new Map([
      [flooder, followed("127.0.0.2")],
      [other, followed("127.0.0.2")]
    ])
    flooder.socket.bytesRead = 200_000 // past its own burst (128 KiB)
    other.socket.bytesRead = 2_000 // under the peer's (64 KiB) alone, over it with the flooder's bytes
    expect(sample(sessions, 0)).toEqual([[flooder, "127.0.0.2", 200_000]])
  })
})
