// The gRPC server's connections (layers/grpc/http2/Connections.ts) over real loopback sockets: a connection
// that never completes its handshake (sends nothing, half the HTTP/2 client preface, or stops inside TLS) is
// closed at the handshake deadline, an idle connection past its handshake is kept (routers hold theirs), and
// close() closes at once every connection that runs no call (a chaos soak: such connections stayed open
// forever and held every shutdown for the whole grace).

import * as http2 from "node:http2"
import * as net from "node:net"
import type * as grpc from "@grpc/grpc-js"
import { afterEach, describe, expect, it } from "vitest"
import type { ServerCall } from "../../src/layers/grpc/http2/Call.ts"
import { Http2GrpcServer } from "../../src/layers/grpc/http2/Server.ts"
import { makeTestPki } from "../support/certs.ts"
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

const start = async (options: { handshakeTimeoutMs?: number; tls?: boolean } = {}) => {
  const errors: Array<Error> = []
  const pki = options.tls ? makeTestPki() : undefined
  const material = pki && { ca: pki.ca.cert, cert: pki.server.cert, key: pki.server.key }
  const server = new Http2GrpcServer({
    maxReceiveMessageLength: 1024,
    handshakeTimeoutMs: options.handshakeTimeoutMs,
    tls: material && { current: () => material, subscribe: () => () => {} },
    onConnectionError: (e) => errors.push(e)
  })
  server.addService({ echo }, {
    echo: (call: ServerCall<Buffer, Buffer>, done: (e: null, v: Buffer) => void) => done(null, call.request)
  } as unknown as grpc.UntypedServiceImplementation)
  const port = await server.listen("127.0.0.1", 0)
  cleanups.push(() => {
    server.destroy()
    pki?.cleanup()
  })
  return { server, port, errors, pki }
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

const echoOn = (session: http2.ClientHttp2Session) =>
  new Promise<string | undefined>((resolve) => {
    const req = session.request({ ":method": "POST", ":path": "/t.T/Echo", "content-type": "application/grpc" })
    let status: string | undefined
    req.on("response", (h) => (status = h["grpc-status"] as string | undefined))
    req.on("trailers", (t) => (status = t["grpc-status"] as string | undefined))
    req.on("error", () => {})
    req.on("close", () => resolve(status))
    req.resume()
    req.end(Buffer.from([0, 0, 0, 0, 1, 0x61]))
  })

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

  it("closes a connection that stops inside its TLS handshake at the deadline (Node's TLS bound is 120 s)", async () => {
    const { port } = await start({ handshakeTimeoutMs: 300, tls: true })
    const nothing = silent(port)
    expect(await within(nothing.closed, 5_000)).not.toBe("pending")
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
