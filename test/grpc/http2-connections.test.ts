// The gRPC server's connections (layers/grpc/http2/Connections.ts) over real loopback sockets: a connection
// that never completes its handshake (sends nothing, half the HTTP/2 client preface, or stops inside TLS) is
// closed at the handshake deadline, an idle connection past its handshake is kept (routers hold theirs), and
// close() closes at once every connection that runs no call (a chaos soak: such connections stayed open
// forever and held every shutdown for the whole grace).

import * as http2 from "node:http2"
import * as net from "node:net"
import * as tls from "node:tls"
import type * as grpc from "@grpc/grpc-js"
import { afterEach, describe, expect, it, vi } from "vitest"
import type { ServerCall } from "../../src/layers/grpc/http2/Call.ts"
import { concurrentStreams } from "../../src/layers/grpc/http2/Connections.ts"
import { Http2GrpcServer } from "../../src/layers/grpc/http2/Server.ts"
import { makeTestPki } from "../support/certs.ts"
import { pollUntil } from "../support/poll.ts"
import { stalledClient } from "../support/stalledClients.ts"

const raw = (b: Buffer) => b
const echo: grpc.MethodDefinition<Buffer, Buffer> = {
  path: "/t.T/Echo",
  requestStream: false,
  responseStream: false,
  requestSerialize: raw,
  requestDeserialize: raw,
  responseSerialize: raw,
  responseDeserialize: raw
}
/** Half the client preface (RFC 9113 3.4): the magic's first line, no SETTINGS. */
const HALF_PREFACE = "PRI * HTTP/2.0\r\n"

const cleanups: Array<() => void> = []
afterEach(() => {
  for (const c of cleanups.splice(0)) c()
})

const start = async (
  options: { handshakeTimeoutMs?: number; tls?: boolean; host?: string; maxConcurrentStreams?: number } = {}
) => {
  const errors: Array<Error> = []
  const pki = options.tls ? makeTestPki() : undefined
  const material = pki && { ca: pki.ca.cert, cert: pki.server.cert, key: pki.server.key }
  const server = new Http2GrpcServer({
    maxReceiveMessageLength: 1024,
    handshakeTimeoutMs: options.handshakeTimeoutMs,
    maxConcurrentStreams: options.maxConcurrentStreams,
    tls: material && { current: () => material, subscribe: () => () => {} },
    onConnectionError: (e) => errors.push(e)
  })
  /** Calls to Hold, answered when their function is called. */
  const held: Array<() => void> = []
  type Done = (e: null, v: Buffer) => void
  server.addService({ echo, hold: { ...echo, path: "/t.T/Hold" } }, {
    echo: (call: ServerCall<Buffer, Buffer>, done: Done) => done(null, call.request),
    hold: (call: ServerCall<Buffer, Buffer>, done: Done) => held.push(() => done(null, call.request))
  } as unknown as grpc.UntypedServiceImplementation)
  const port = await server.listen(options.host ?? "127.0.0.1", 0)
  cleanups.push(() => {
    server.destroy()
    pki?.cleanup()
  })
  return { server, port, errors, pki, held }
}

/** A raw TCP connection that sends `bytes` and nothing more; `closed` resolves when the server closes it. */
const silent = (port: number, bytes = "") => {
  const socket = net.connect(port, "127.0.0.1")
  socket.on("error", () => {})
  socket.resume()
  if (bytes !== "") socket.write(bytes)
  cleanups.push(() => socket.destroy())
  const closed = new Promise<number>((resolve) => socket.once("close", () => resolve(performance.now())))
  const connected = new Promise<void>((resolve) => socket.once("connect", () => resolve()))
  return { closed, connected }
}

/** An HTTP/2 connection past its handshake (the server has its SETTINGS: a PING answered), then idle. */
const established = async (port: number) => {
  const session = http2.connect(`http://127.0.0.1:${port}`)
  session.on("error", () => {})
  cleanups.push(() => session.destroy())
  // A PING sent before 'connect' is cancelled.
  await new Promise((resolve) => session.once("connect", resolve))
  await new Promise<void>((resolve, reject) => session.ping((e) => (e ? reject(e) : resolve())))
  return session
}

const echoOn = (session: http2.ClientHttp2Session, path = "/t.T/Echo") =>
  new Promise<string | undefined>((resolve) => {
    const req = session.request({ ":method": "POST", ":path": path, "content-type": "application/grpc" })
    let status: string | undefined
    req.on("response", (h) => (status = h["grpc-status"] as string | undefined))
    req.on("trailers", (t) => (status = t["grpc-status"] as string | undefined))
    req.on("error", () => {})
    req.on("close", () => resolve(status))
    req.resume()
    req.end(Buffer.from([0, 0, 0, 0, 1, 0x61]))
  })

/** A port free now on 127.0.0.1 (bound, then released). */
const freePort = async () => {
  const probe = net.createServer()
  await new Promise<void>((resolve) => probe.listen(0, "127.0.0.1", resolve))
  const { port } = probe.address() as net.AddressInfo
  await new Promise((resolve) => probe.close(resolve))
  return port
}

/** An mTLS HTTP/2 connection from 127.0.0.1:`localPort` to `host`:`port`, past its handshake (SETTINGS in). */
const tlsFrom = async (
  pki: NonNullable<ReturnType<typeof makeTestPki>>,
  host: string,
  port: number,
  localPort: number
) => {
  const session = http2.connect(`https://${host}:${port}`, {
    createConnection: () =>
      tls.connect({
        socket: net.connect({ host, port, localAddress: "127.0.0.1", localPort }),
        ALPNProtocols: ["h2"],
        ca: pki.ca.cert,
        cert: pki.client.cert,
        key: pki.client.key,
        servername: "localhost"
      })
  })
  session.on("error", () => {})
  cleanups.push(() => session.destroy())
  await new Promise((resolve) => session.once("remoteSettings", resolve))
  return session
}

/** `p`, or "pending" if it has not settled within `ms`: a bound on a wait that must be short. */
const within = <A>(p: Promise<A>, ms: number) =>
  Promise.race([p, new Promise<"pending">((resolve) => setTimeout(() => resolve("pending"), ms))])

describe("the gRPC server's connections", () => {
  it("closes a connection that sends nothing, or half the preface, at the handshake deadline; keeps an idle one past its handshake", async () => {
    const { port, errors } = await start({ handshakeTimeoutMs: 300 })
    const kept = await established(port)
    const opened = performance.now()
    const nothing = silent(port)
    const half = silent(port, HALF_PREFACE)
    const closedAt = await within(Promise.all([nothing.closed, half.closed]), 5_000)
    expect(closedAt).not.toBe("pending")
    for (const t of closedAt as Array<number>) expect(t - opened).toBeGreaterThanOrEqual(250)
    expect(errors.map((e) => e.message)).toEqual([
      "no HTTP/2 handshake within 300 ms; connection closed",
      "no HTTP/2 handshake within 300 ms; connection closed"
    ])
    // Idle past its own deadline, the established connection still serves.
    expect(kept.closed || kept.destroyed).toBe(false)
    expect(await echoOn(kept)).toBe("0")
  })

  it("by default gives a connection 10 s for its handshake (README: HANDSHAKE_TIMEOUT_MS), not a moment less", async () => {
    const { server, port, errors } = await start()
    // The deadline is a setTimeout armed at the session's start: faked, so that 10 s pass at once.
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout"] })
    cleanups.push(() => vi.useRealTimers())
    silent(port)
    for (let i = 0; i < 1_000 && server.open.sessions === 0; i++) await new Promise((r) => setImmediate(r))
    expect(server.open.sessions).toBe(1)
    vi.advanceTimersByTime(9_999)
    expect(errors).toEqual([])
    vi.advanceTimersByTime(1)
    expect(errors.map((e) => e.message)).toEqual(["no HTTP/2 handshake within 10000 ms; connection closed"])
  })

  it("closes a connection that stops inside its TLS handshake at the deadline (Node's TLS bound is 120 s)", async () => {
    const { port } = await start({ handshakeTimeoutMs: 300, tls: true })
    const nothing = silent(port)
    expect(await within(nothing.closed, 5_000)).not.toBe("pending")
  })

  it("keeps two TLS connections from one client address and port to two local addresses (it closed one at the deadline)", async () => {
    // 0.0.0.0: 127.0.0.1 and 127.0.0.2 both reach it (Linux routes 127/8 to lo); the client binds one port for both.
    const { port, pki } = await start({ handshakeTimeoutMs: 300, tls: true, host: "0.0.0.0" })
    const localPort = await freePort()
    const sessions = await Promise.all(["127.0.0.1", "127.0.0.2"].map((h) => tlsFrom(pki!, h, port, localPort)))
    // Accepted after both, so closed at its deadline after theirs would have passed.
    const later = silent(port)
    expect(await within(later.closed, 5_000)).not.toBe("pending")
    for (const s of sessions) expect(s.closed || s.destroyed).toBe(false)
    expect(await Promise.all(sessions.map((s) => echoOn(s)))).toEqual(["0", "0"])
  })

  it("serves a connection with the largest limit admission's limits can give (2^32 - 1, what the setting can say)", async () => {
    // admission's limits are only bounded below by the config: twice their sum may pass the setting's 32 bits
    const max = concurrentStreams(256, 2 ** 31)
    expect(max).toBe(2 ** 32 - 1)
    const { port } = await start({ maxConcurrentStreams: max })
    expect((await established(port)).remoteSettings.maxConcurrentStreams).toBe(max)
  })

  it("advertises its concurrent-stream limit (4096 by default) and refuses the streams past it, REFUSED_STREAM", async () => {
    expect((await established((await start()).port)).remoteSettings.maxConcurrentStreams).toBe(4096)
    const { port } = await start({ maxConcurrentStreams: 4 })
    const session = http2.connect(`http://127.0.0.1:${port}`)
    session.on("error", () => {})
    cleanups.push(() => session.destroy())
    // Sent with the preface, before the server's SETTINGS reach the client (which would then hold back the rest):
    // requests that never end, which admission does not count.
    const requests = Array.from({ length: 6 }, () => {
      const req = session.request({ ":method": "POST", ":path": "/t.T/Echo", "content-type": "application/grpc" })
      req.on("error", () => {})
      req.resume()
      return req
    })
    const closed = requests.map(
      (r) => new Promise<number | undefined>((resolve) => r.once("close", () => resolve(r.rstCode)))
    )
    await new Promise((resolve) => session.once("remoteSettings", resolve))
    expect(session.remoteSettings.maxConcurrentStreams).toBe(4)
    const refused = await within(Promise.all(closed.slice(4)), 2_000)
    expect(refused).toEqual([http2.constants.NGHTTP2_REFUSED_STREAM, http2.constants.NGHTTP2_REFUSED_STREAM])
    // The first four are open (the server holds them, waiting for their message), and served once it comes.
    expect(requests.slice(0, 4).map((r) => r.closed)).toEqual([false, false, false, false])
    requests[0]!.end(Buffer.from([0, 0, 0, 0, 1, 0x61]))
    expect(await within(closed[0]!, 2_000)).toBe(http2.constants.NGHTTP2_NO_ERROR)
  })

  it("close() closes at once every connection that runs no call (in its handshake, or idle), clients that stopped reading included: it resolves without destroy()", async () => {
    // The default deadline, 10 s: what closes them here is close().
    const { server, port } = await start()
    const stalled = await Promise.all(
      (["nothing", "half-preface", "settled"] as const).map((kind) => stalledClient(port, kind))
    )
    for (const s of stalled) cleanups.push(() => void s.destroy())
    const idle = await established(port)
    const idleClosed = new Promise((resolve) => idle.once("close", resolve))
    // close() resolves once every connection is closed (net.Server's 'close').
    expect(await within(server.close(), 2_000)).toBeUndefined()
    expect(await within(idleClosed, 2_000)).not.toBe("pending")
  })

  it("close() leaves a TLS connection running a call to finish it (it has left the connections in their TLS handshake)", async () => {
    const { server, port, pki, held } = await start({ tls: true })
    const session = await tlsFrom(pki!, "127.0.0.1", port, await freePort())
    const status = echoOn(session, "/t.T/Hold")
    await pollUntil("the Hold call", () => held.length === 1, 2_000)
    // Its session gets GOAWAY and stays open; its socket cut would close it with none.
    const first = new Promise((resolve) => {
      session.once("goaway", () => resolve("goaway"))
      session.once("close", () => resolve("close"))
    })
    const closed = server.close()
    expect(await within(first, 2_000)).toBe("goaway")
    held[0]!()
    expect(await within(status, 2_000)).toBe("0")
    expect(await within(closed, 2_000)).toBeUndefined()
  })

  it("close() closes at once a connection still in its TLS handshake (it has no session to close)", async () => {
    const { server, port, pki } = await start({ tls: true })
    const stalled = silent(port)
    await stalled.connected
    // Connections are accepted in order: once a later one has finished its handshake, the server has this one.
    const later = http2.connect(`https://127.0.0.1:${port}`, {
      ca: pki!.ca.cert,
      cert: pki!.client.cert,
      key: pki!.client.key,
      servername: "localhost"
    })
    later.on("error", () => {})
    cleanups.push(() => later.destroy())
    await new Promise((resolve) => later.once("remoteSettings", resolve))
    expect(await within(server.close(), 2_000)).toBeUndefined()
    expect(await within(stalled.closed, 2_000)).not.toBe("pending")
  })
})
