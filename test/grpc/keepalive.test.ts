// The gRPC server's keepalive: the rule (services/grpc/Keepalive.ts) stepped directly, and the live side
// (layers/grpc/http2/Keepalive.ts) over real loopback sockets. A client that answers PINGs (node:http2's, which
// acknowledges them itself) is pinged once per keepalive_time while idle and kept; a client that has gone silent
// (a raw one that stopped after its handshake; one behind a proxy that starts dropping everything both ways, as a
// router whose host vanished, with a call open on it) is closed keepalive_timeout after the PING, reported as
// `keepalive_timeout`, and its call sees 'cancelled'. Before it, such connections stayed open for good.

import * as http2 from "node:http2"
import * as net from "node:net"
import type * as grpc from "@grpc/grpc-js"
import { afterEach, describe, expect, it } from "vitest"
import type { ServerCall } from "../../src/layers/grpc/http2/Call.ts"
import type { GuardEvent } from "../../src/layers/grpc/http2/Guard.ts"
import { Http2GrpcServer } from "../../src/layers/grpc/http2/Server.ts"
import {
  type KeepaliveTimes,
  keepaliveTimes,
  liveness,
  livenessStep,
  lookEveryMs
} from "../../src/services/grpc/Keepalive.ts"
import { frameMessage } from "../../src/services/grpc/Wire.ts"
import { makeTestPki } from "../support/certs.ts"
import { pollUntil } from "../support/poll.ts"
import { stalledClient } from "../support/stalledClients.ts"

describe("the keepalive rule", () => {
  const times: KeepaliveTimes = { timeMs: 60_000, timeoutMs: 20_000 }

  it("pings a connection silent for keepalive_time once, and closes it keepalive_timeout after the PING", () => {
    let l = liveness(100, 0)
    const actions: Array<string | undefined> = []
    for (const t of [30_000, 59_999, 60_000, 65_000, 79_999, 80_000]) {
      const step = livenessStep(l, 100, t, times)
      l = step.liveness
      actions.push(step.action)
    }
    expect(actions).toEqual([undefined, undefined, "ping", undefined, undefined, "close"])
  })

  it("takes any byte read as the peer heard (the PING's ACK, or a call's): no close, and the next PING a keepalive_time later", () => {
    const pinged = livenessStep(liveness(100, 0), 100, 60_000, times)
    expect(pinged.action).toBe("ping")
    const acked = livenessStep(pinged.liveness, 117, 60_010, times)
    expect(acked).toEqual({ liveness: { read: 117, heardAtMs: 60_010, pingedAtMs: undefined }, action: undefined })
    expect(livenessStep(acked.liveness, 117, 80_010, times).action).toBeUndefined()
    expect(livenessStep(acked.liveness, 117, 120_009, times).action).toBeUndefined()
    expect(livenessStep(acked.liveness, 117, 120_010, times).action).toBe("ping")
  })

  it("never pings a connection that reads something between looks", () => {
    let l = liveness(0, 0)
    for (let t = 5_000, read = 1; t <= 600_000; t += 5_000, read++) {
      const step = livenessStep(l, read, t, times)
      expect(step.action).toBeUndefined()
      l = step.liveness
    }
  })

  it("looks a quarter of the shorter time apart, between 10 ms and 5 s", () => {
    expect(lookEveryMs(times)).toBe(5_000)
    expect(lookEveryMs({ timeMs: 8_000, timeoutMs: 20_000 })).toBe(2_000)
    expect(lookEveryMs({ timeMs: 100, timeoutMs: 20 })).toBe(10)
  })

  it("reads its times from the config's [agent] keys", async () => {
    const { Duration } = await import("effect")
    expect(keepaliveTimes({ keepalive_time: Duration.minutes(1), keepalive_timeout: Duration.seconds(20) })).toEqual(
      times
    )
  })
})

const raw = (b: Buffer) => b
const hold: grpc.MethodDefinition<Buffer, Buffer> = {
  path: "/t.T/Hold",
  requestStream: false,
  responseStream: true,
  requestSerialize: raw,
  requestDeserialize: raw,
  responseSerialize: raw,
  responseDeserialize: raw
}

const cleanups: Array<() => void> = []
afterEach(() => {
  for (const c of cleanups.splice(0)) c()
})

/** A server whose Hold calls stay open (as a Health Watch does), with the keepalive `times`. */
const start = async (times: KeepaliveTimes, pki?: ReturnType<typeof makeTestPki>) => {
  const events: Array<GuardEvent> = []
  const held: Array<ServerCall<Buffer, Buffer>> = []
  const material = pki && { ca: pki.ca.cert, cert: pki.server.cert, key: pki.server.key }
  const server = new Http2GrpcServer({
    maxReceiveMessageLength: 1024,
    keepalive: times,
    tls: material && { current: () => material, subscribe: () => () => {} },
    onGuard: (e) => events.push(e)
  })
  server.addService({ hold }, {
    hold: (call: ServerCall<Buffer, Buffer>) => held.push(call)
  } as unknown as grpc.UntypedServiceImplementation)
  const port = await server.listen("127.0.0.1", 0)
  cleanups.push(() => server.destroy())
  return { server, port, events, held }
}

/**
 * A TCP proxy to `port` that relays both ways until `vanish()`, then reads and drops everything both ways and
 * closes nothing: the agent's side sees what it sees of a peer whose host lost its network.
 */
const proxy = async (port: number) => {
  let vanished = false
  const sockets: Array<net.Socket> = []
  const server = net.createServer((client) => {
    const upstream = net.connect(port, "127.0.0.1")
    sockets.push(client, upstream)
    for (const s of [client, upstream]) s.on("error", () => {})
    client.on("data", (d: Buffer) => vanished || upstream.write(d))
    upstream.on("data", (d: Buffer) => vanished || client.write(d))
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  cleanups.push(() => {
    for (const s of sockets) s.destroy()
    server.close()
  })
  return { port: (server.address() as net.AddressInfo).port, vanish: () => (vanished = true) }
}

const connect = (port: number) => {
  const session = http2.connect(`http://127.0.0.1:${port}`)
  session.on("error", () => {})
  cleanups.push(() => session.destroy())
  return session
}

/** Starts a Hold call on `session`. */
const holdCall = (session: http2.ClientHttp2Session) => {
  const req = session.request({
    ":method": "POST",
    ":path": "/t.T/Hold",
    "content-type": "application/grpc",
    te: "trailers"
  })
  req.on("error", () => {})
  req.end(frameMessage(Buffer.from("hi")))
  return req
}

describe("the gRPC server's keepalive", () => {
  it("pings an idle node:http2 client once per keepalive_time and keeps it: it answers", async () => {
    const { server, port, events } = await start({ timeMs: 100, timeoutMs: 100 })
    const session = connect(port)
    let pings = 0
    session.on("ping", () => pings++)
    await pollUntil("three PINGs", () => pings >= 3)
    expect(session.closed || session.destroyed).toBe(false)
    expect(server.connections).toBe(1)
    expect(events).toEqual([])
  })

  it("under TLS too: an idle mTLS client is pinged and kept; one whose network vanished is closed", async () => {
    const pki = makeTestPki()
    cleanups.push(() => pki.cleanup())
    const { server, port, events } = await start({ timeMs: 100, timeoutMs: 100 }, pki)
    const tlsConnect = (to: number) => {
      const session = http2.connect(`https://localhost:${to}`, {
        host: "127.0.0.1",
        ca: pki.ca.cert,
        cert: pki.client.cert,
        key: pki.client.key
      } as http2.SecureClientSessionOptions)
      session.on("error", () => {})
      cleanups.push(() => session.destroy())
      return session
    }
    const kept = tlsConnect(port)
    const path = await proxy(port)
    const gone = tlsConnect(path.port)
    let [keptPings, gonePings] = [0, 0]
    kept.on("ping", () => keptPings++)
    gone.on("ping", () => gonePings++)
    await pollUntil("PINGs answered on both", () => keptPings >= 2 && gonePings >= 2)
    path.vanish()
    await pollUntil("the vanished one closed", () => server.connections === 1)
    expect(events).toEqual([{ kind: "closed", reason: "keepalive_timeout", peer: "127.0.0.1" }])
    const before = keptPings
    await pollUntil("two more PINGs on the kept one", () => keptPings >= before + 2)
    expect(kept.closed || kept.destroyed).toBe(false)
  })

  it("closes a client that stopped after its handshake, keepalive_timeout after the PING, and reports it", async () => {
    const { server, port, events } = await start({ timeMs: 100, timeoutMs: 100 })
    const silent = await stalledClient(port, "settled")
    cleanups.push(() => silent.destroy())
    expect(server.connections).toBe(1)
    await pollUntil("the silent client closed", () => server.connections === 0)
    expect(events).toEqual([{ kind: "closed", reason: "keepalive_timeout", peer: "127.0.0.1" }])
  })

  it("closes a client whose network vanished with a call open on it: the call sees 'cancelled'", async () => {
    const { server, port, events, held } = await start({ timeMs: 150, timeoutMs: 150 })
    const path = await proxy(port)
    const session = connect(path.port)
    holdCall(session)
    await pollUntil("the call held", () => held.length === 1)
    const cancelled = new Promise((resolve) => held[0]?.once("cancelled", resolve))
    // Alive: it answers the PINGs through the proxy, with its call open.
    let pings = 0
    session.on("ping", () => pings++)
    await pollUntil("two PINGs answered", () => pings >= 2)
    expect(server.open).toEqual({ sessions: 1, calls: 1 })
    path.vanish()
    await cancelled
    await pollUntil("the connection closed", () => server.connections === 0)
    expect(server.open).toEqual({ sessions: 0, calls: 0 })
    expect(events).toEqual([{ kind: "closed", reason: "keepalive_timeout", peer: "127.0.0.1" }])
  })

  it("keeps a silent client without a keepalive (timeMs 0), as a server with none does", async () => {
    const { server, port, events } = await start({ timeMs: 0, timeoutMs: 100 })
    const keeping = await start({ timeMs: 100, timeoutMs: 100 })
    const silent = await stalledClient(port, "settled")
    const other = await stalledClient(keeping.port, "settled")
    cleanups.push(
      () => silent.destroy(),
      () => other.destroy()
    )
    // The server with a keepalive closes its silent client; the one without still holds its own.
    await pollUntil("the other closed", () => keeping.server.connections === 0)
    expect(server.connections).toBe(1)
    expect(events).toEqual([])
  })
})
