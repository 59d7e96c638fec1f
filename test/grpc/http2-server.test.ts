// The agent's gRPC server (layers/grpc/http2) over real loopback connections, with a grpc-js client and raw
// node:http2 requests: routing, the request's framing and decoding, compression, deadlines, status and
// trailers, handler failures, graceful close, and a router's burst of cancels (issue #15 item 8: past Node's
// default rapid-reset guard, 1000 resets, the other calls of the connection ended INTERNAL). Also what a
// caller must not be able to do to it: end the daemon with a reset, make it buffer answers without bound.

import * as http2 from "node:http2"
import * as net from "node:net"
import { Duplex } from "node:stream"
import * as tls from "node:tls"
import * as zlib from "node:zlib"
import * as grpc from "@grpc/grpc-js"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { resetWhy, type ServerCall } from "../../src/layers/grpc/http2/Call.ts"
import { STREAM_RESET_BURST } from "../../src/layers/grpc/http2/Connections.ts"
import { Http2GrpcServer } from "../../src/layers/grpc/http2/Server.ts"
import { frameMessage } from "../../src/services/grpc/Wire.ts"
import { makeTestPki } from "../support/certs.ts"
import { pollUntil } from "../support/poll.ts"

const raw = (b: Buffer) => b
const method = (name: string, responseStream: boolean): grpc.MethodDefinition<Buffer, Buffer> => ({
  path: `/t.T/${name}`,
  requestStream: false,
  responseStream,
  requestSerialize: raw,
  requestDeserialize: (b) => {
    if (b[0] === 0xff) throw new Error("first byte 0xff is not a message")
    return b
  },
  responseSerialize: raw,
  responseDeserialize: raw
})
const service = {
  echo: method("Echo", false),
  fail: method("Fail", false),
  boom: method("Boom", false),
  hang: method("Hang", true),
  // Answers each request message with 32 KiB: the second answer fills the stream's 64 KiB write buffer.
  chat: { ...method("Chat", true), requestStream: true },
  // Writes three 40 KiB messages at once (past the 64 KiB write buffer), ending the call at the first 'drain'.
  burst: method("Burst", true)
} satisfies grpc.ServiceDefinition

type Done = (e: { code: number; details: string } | null, v?: Buffer) => void
const open = new Set<ServerCall<Buffer, Buffer>>()
let cancelled = 0
/** What each Echo call had left of its grpc-timeout when its handler ran (ms; undefined: none sent). */
const echoLeft: Array<number | undefined> = []
/** Why each Hang call was cancelled: "cancelled" or "deadline". */
const hangEnds: Array<string> = []
const seen: Array<Record<string, Array<string>>> = []
/** Request messages Chat's handler was given. */
let chatHandled = 0
/** The 'drain's each Burst call saw. */
const burstDrains: Array<number> = []

const connectionErrors: Array<Error> = []
/** [path, status] of each call the server ended before its handler ran. */
const rejected: Array<[string, number]> = []
const server = new Http2GrpcServer({
  maxReceiveMessageLength: 1024,
  onConnectionError: (e) => connectionErrors.push(e),
  onRejected: (path, f) => {
    rejected.push([path, f.code])
    return f
  }
})
server.addService(service, {
  echo: (call: ServerCall<Buffer, Buffer>, done: Done) => {
    echoLeft.push(call.remainingMs())
    seen.push({ a: call.metadata.get("x-a").map(String), b: call.metadata.get("x-b-bin").map((v) => v.toString()) })
    done(null, call.request)
  },
  fail: (_call: ServerCall, done: Done) => done({ code: grpc.status.NOT_FOUND, details: "nicht gefunden: é 100%" }),
  boom: () => {
    throw new Error("handler bug")
  },
  hang: (call: ServerCall<Buffer, Buffer>) => {
    open.add(call)
    call.on("cancelled", (why: string) => {
      open.delete(call)
      cancelled++
      hangEnds.push(why)
    })
    call.write(Buffer.from("open"))
  },
  chat: (call: ServerCall<Buffer, Buffer>) => {
    call.on("data", (m: Buffer) => {
      chatHandled++
      call.write(Buffer.alloc(32 * 1024, m[0]!))
    })
    call.on("end", () => call.end())
  },
  burst: (call: ServerCall<Buffer, Buffer>) => {
    let drains = 0
    call.on("drain", () => drains++)
    call.once("drain", () => {
      call.end()
      // Read once the stream's 'drain' has run all its listeners (each emitted one 'drain' here).
      queueMicrotask(() => burstDrains.push(drains))
    })
    for (let i = 0; i < 3; i++) call.write(Buffer.alloc(40 * 1024))
  }
} as unknown as grpc.UntypedServiceImplementation)

let port = 0
let client: grpc.Client
beforeAll(async () => {
  port = await server.listen("127.0.0.1", 0)
  client = new grpc.Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure())
})
afterAll(() => {
  client?.close()
  server.destroy()
})

const unary = (path: string, body: Buffer, c = client) =>
  new Promise<{ code: number; details: string; value?: Buffer }>((resolve) =>
    c.makeUnaryRequest(path, raw, raw, body, (err, value) =>
      resolve(err ? { code: err.code, details: err.details } : { code: 0, details: "", value: value! })
    )
  )

interface RawAnswer {
  readonly httpStatus: number
  readonly acceptEncoding: string | undefined
  readonly grpcStatus: string | undefined
  readonly grpcMessage: string | undefined
  readonly data: Buffer
}

/** One request on its own connection, as raw HTTP/2; the status from the trailers or a trailers-only answer. */
const rawCall = (headers: http2.OutgoingHttpHeaders, body: Array<Uint8Array>): Promise<RawAnswer> =>
  new Promise((resolve, reject) => {
    const session = http2.connect(`http://127.0.0.1:${port}`)
    session.on("error", reject)
    const req = session.request({
      ":method": "POST",
      "content-type": "application/grpc",
      te: "trailers",
      ...headers
    })
    let head: http2.IncomingHttpHeaders = {}
    let tail: http2.IncomingHttpHeaders = {}
    const data: Array<Buffer> = []
    req.on("response", (h) => {
      head = h
    })
    req.on("trailers", (t) => {
      tail = t
    })
    req.on("data", (c: Buffer) => data.push(c))
    req.on("close", () => {
      session.close()
      const status = tail["grpc-status"] ?? head["grpc-status"]
      const message = tail["grpc-message"] ?? head["grpc-message"]
      resolve({
        httpStatus: Number(head[":status"]),
        acceptEncoding: head["grpc-accept-encoding"] as string | undefined,
        grpcStatus: status as string | undefined,
        grpcMessage: message === undefined ? undefined : decodeURIComponent(message as string),
        data: Buffer.concat(data)
      })
    })
    for (const b of body) req.write(b)
    req.end()
  })

/** A PING's round trip: the server has read every frame sent before it. */
const roundTrip = (session: http2.ClientHttp2Session) =>
  new Promise<void>((resolve, reject) => session.ping((e) => (e ? reject(e) : resolve())))

const compressed = (body: Buffer, how: (b: Buffer) => Buffer) => {
  const f = frameMessage(how(body))
  f[0] = 1
  return f
}

describe("the agent's gRPC server on node:http2", () => {
  it("answers a unary call; the handler reads the request's metadata as grpc-js gives it (repeated plain values comma-joined, -bin ones decoded)", async () => {
    const r = await rawCall(
      { ":path": "/t.T/Echo", "x-a": ["1", "2"], "x-b-bin": Buffer.from("bin").toString("base64") },
      [frameMessage(Buffer.from("hello"))]
    )
    expect(r).toMatchObject({ httpStatus: 200, grpcStatus: "0" })
    expect(r.data.subarray(5).toString()).toBe("hello")
    expect(seen.at(-1)).toEqual({ a: ["1, 2"], b: ["bin"] })
    expect((await unary("/t.T/Echo", Buffer.from("via grpc-js"))).value?.toString()).toBe("via grpc-js")
  })

  it("sends a handler's status and message (percent-encoded UTF-8) to a grpc-js client", async () => {
    expect(await unary("/t.T/Fail", Buffer.from("x"))).toEqual({
      code: grpc.status.NOT_FOUND,
      details: "nicht gefunden: é 100%"
    })
  })

  it("ends a throwing handler's call INTERNAL and goes on serving", async () => {
    const r = await unary("/t.T/Boom", Buffer.from("x"))
    expect(r.code).toBe(grpc.status.INTERNAL)
    expect(r.details).toContain("handler bug")
    expect((await unary("/t.T/Echo", Buffer.from("after"))).value?.toString()).toBe("after")
  })

  it("refuses what is not a gRPC call: unknown method, not POST, not application/grpc", async () => {
    const unknown = await rawCall({ ":path": "/t.T/Nope" }, [frameMessage(Buffer.from("x"))])
    expect(unknown).toMatchObject({ httpStatus: 200, grpcStatus: String(grpc.status.UNIMPLEMENTED) })
    expect(rejected.at(-1)).toEqual(["/t.T/Nope", grpc.status.UNIMPLEMENTED])
    expect(unknown.grpcMessage).toContain("/t.T/Nope")
    expect((await rawCall({ ":path": "/t.T/Echo", ":method": "GET" }, [])).httpStatus).toBe(405)
    expect((await rawCall({ ":path": "/t.T/Echo", "content-type": "text/plain" }, [])).httpStatus).toBe(415)
    // gRPC-Web is another protocol (trailers in the body): not answered as gRPC
    expect((await rawCall({ ":path": "/t.T/Echo", "content-type": "application/grpc-web" }, [])).httpStatus).toBe(415)
    const proto = await rawCall({ ":path": "/t.T/Echo", "content-type": "application/grpc+proto" }, [
      frameMessage(Buffer.from("x"))
    ])
    expect(proto.httpStatus).toBe(200)
  })

  it("gives each broken request a precise status", async () => {
    const echo = { ":path": "/t.T/Echo" }
    const cases: Array<[string, Array<Uint8Array>, http2.OutgoingHttpHeaders, grpc.status, string]> = [
      ["undecodable", [frameMessage(Buffer.from([0xff]))], {}, grpc.status.INVALID_ARGUMENT, "not a valid /t.T/Echo"],
      ["no message", [], {}, grpc.status.INTERNAL, "no message"],
      [
        "two messages",
        [frameMessage(Buffer.from("a")), frameMessage(Buffer.from("b"))],
        {},
        grpc.status.INTERNAL,
        "one request message"
      ],
      ["truncated", [frameMessage(Buffer.from("abc")).subarray(0, 6)], {}, grpc.status.INTERNAL, "inside a message"],
      ["over the limit", [frameMessage(Buffer.alloc(2000))], {}, grpc.status.RESOURCE_EXHAUSTED, "2000 vs 1024"],
      [
        "bad grpc-timeout",
        [frameMessage(Buffer.from("a"))],
        { "grpc-timeout": "5 seconds" },
        grpc.status.INTERNAL,
        "grpc-timeout"
      ],
      [
        "unknown encoding",
        [compressed(Buffer.from("a"), (b) => b)],
        { "grpc-encoding": "snappy" },
        grpc.status.UNIMPLEMENTED,
        "snappy"
      ],
      ["compressed as identity", [compressed(Buffer.from("a"), (b) => b)], {}, grpc.status.INTERNAL, "identity"],
      [
        // br is a grpc-encoding (and node:zlib decodes it) but not one this server reads: unsupported, never tried
        "br",
        [compressed(Buffer.from("a"), zlib.brotliCompressSync)],
        { "grpc-encoding": "br" },
        grpc.status.UNIMPLEMENTED,
        '"br", which this server does not decode'
      ],
      [
        // the encoding the caller named is the one read: gzip bytes are no deflate message (nor the reverse)
        "gzip bytes said deflate",
        [compressed(Buffer.from("a"), zlib.gzipSync)],
        { "grpc-encoding": "deflate" },
        grpc.status.INTERNAL,
        "cannot decompress the deflate message"
      ],
      [
        "deflate bytes said gzip",
        [compressed(Buffer.from("a"), zlib.deflateSync)],
        { "grpc-encoding": "gzip" },
        grpc.status.INTERNAL,
        "cannot decompress the gzip message"
      ],
      [
        // inflating stops a byte past the limit: the status says the message is longer than the limit
        "gzip bomb",
        [compressed(Buffer.alloc(100_000), zlib.gzipSync)],
        { "grpc-encoding": "gzip" },
        grpc.status.RESOURCE_EXHAUSTED,
        "(1025 vs 1024)"
      ]
    ]
    for (const [what, body, headers, code, text] of cases) {
      const before = rejected.length
      const r = await rawCall({ ...echo, ...headers }, body)
      expect({ what, status: r.grpcStatus }).toEqual({ what, status: String(code) })
      expect(r.grpcMessage).toContain(text)
      // Reported once, as no handler ran (the handler's own metrics never see it).
      expect({ what, rejected: rejected.slice(before) }).toEqual({ what, rejected: [["/t.T/Echo", code]] })
      // Trailers-only answers carry the response headers too: one refused for its compression names those the
      // server reads (grpc/grpc doc/compression.md).
      expect({ what, accept: r.acceptEncoding }).toEqual({ what, accept: "identity,deflate,gzip" })
    }
  })

  it("survives a caller resetting, with an error code, a request refused as no gRPC call (the 'error' Node raises for it, unheard, ended the daemon)", async () => {
    const uncaught: Array<string> = []
    const record = (e: Error) => uncaught.push(e.message)
    process.on("uncaughtException", record)
    const session = http2.connect(`http://127.0.0.1:${port}`)
    session.on("error", () => {})
    try {
      for (const headers of [{ ":method": "GET" }, { ":method": "POST", "content-type": "text/plain" }]) {
        const req = session.request({ ":path": "/t.T/Echo", ...headers }, { endStream: false })
        req.on("error", () => {})
        req.close(http2.constants.NGHTTP2_INTERNAL_ERROR)
        await new Promise((resolve) => req.on("close", resolve))
      }
      // The server has read both resets, and raised what it raises for them, once a PING sent after them is answered.
      await roundTrip(session)
    } finally {
      session.close()
      process.off("uncaughtException", record)
    }
    expect(uncaught).toEqual([])
    expect((await unary("/t.T/Echo", Buffer.from("still up"))).value?.toString()).toBe("still up")
  })

  it("a caller that sends many messages at once and reads none gets the handler's answers held to what fits the stream's buffer; once it reads, every one comes, in order, then the status", async () => {
    const before = chatHandled
    const session = http2.connect(`http://127.0.0.1:${port}`)
    session.on("error", () => {})
    await new Promise((resolve) => session.once("connect", resolve))
    try {
      const req = session.request({
        ":method": "POST",
        ":path": "/t.T/Chat",
        "content-type": "application/grpc",
        te: "trailers"
      })
      req.on("error", () => {})
      // 100 messages in one write (one DATA frame, one chunk at the server) and the end, while reading nothing.
      const n = 100
      req.end(Buffer.concat(Array.from({ length: n }, (_, i) => frameMessage(Buffer.from([i])))))
      // The server has read them once a PING sent after them is answered: the second PING (nghttp2 may send the
      // first ahead of the DATA frame queued before it).
      for (const _ of [1, 2]) await roundTrip(session)
      // Without backpressure the handler had all 100 at once: 3 MB of answers buffered for a caller not reading.
      // Some it had: the rest are held by the server, not still on their way (which a count of 0 could not tell).
      expect(chatHandled - before).toBeGreaterThan(0)
      expect(chatHandled - before).toBeLessThan(10)
      const data: Array<Buffer> = []
      let status: string | undefined
      req.on("data", (c: Buffer) => data.push(c))
      req.on("trailers", (t) => {
        status = t["grpc-status"] as string | undefined
      })
      await new Promise((resolve) => req.on("close", resolve))
      const all = Buffer.concat(data)
      const firstBytes: Array<number> = []
      for (let at = 0; at < all.length; at += 5 + 32 * 1024) firstBytes.push(all[at + 5]!)
      expect(status).toBe("0")
      expect(firstBytes).toEqual(Array.from({ length: n }, (_, i) => i))
      expect(chatHandled - before).toBe(n)
    } finally {
      session.close()
    }
  })

  it("a caller that keeps sending while its answers wait is stopped by HTTP/2 flow control (the server stops reading its request)", async () => {
    const session = http2.connect(`http://127.0.0.1:${port}`)
    session.on("error", () => {})
    await new Promise((resolve) => session.once("connect", resolve))
    const req = session.request({
      ":method": "POST",
      ":path": "/t.T/Chat",
      "content-type": "application/grpc",
      te: "trailers"
    })
    req.on("error", () => {})
    // 300 KB in 1,000-byte messages, each written once the one before went out (its callback), reading nothing.
    const n = 300
    let sent = 0
    let stop = false
    void (async () => {
      for (let i = 0; i < n && !stop; i++) {
        await new Promise((resolve) => req.write(frameMessage(Buffer.alloc(1000, i % 200)), resolve))
        sent = i + 1
      }
    })()
    try {
      // Stopped once no more goes out over five PING round trips; without the pause the server read it all.
      let last = -1
      for (let same = 0, pings = 0; same < 5 && sent < n && pings < 1000; pings++) {
        await roundTrip(session)
        same = sent === last ? same + 1 : 0
        last = sent
      }
      expect(sent).toBeGreaterThan(0)
      expect(sent).toBeLessThan(n)
    } finally {
      stop = true
      req.close(http2.constants.NGHTTP2_CANCEL)
      session.close()
    }
  })

  it("one 'drain' per wait for a handler that writes on past a full buffer (a listener per write gave one per write)", async () => {
    const before = burstDrains.length
    expect((await rawCall({ ":path": "/t.T/Burst" }, [frameMessage(Buffer.from("x"))])).grpcStatus).toBe("0")
    await pollUntil("the Burst call's drains counted", () => burstDrains.length > before, 10_000, 10)
    expect(burstDrains.slice(before)).toEqual([1])
  })

  it("a deadline or a cancel while the request is still arriving is reported as rejected; a handled call is not", async () => {
    const before = rejected.length
    const partial = (headers: http2.OutgoingHttpHeaders, cancel: boolean) =>
      new Promise<string | undefined>((resolve) => {
        const session = http2.connect(`http://127.0.0.1:${port}`)
        session.on("error", () => {})
        const req = session.request({
          ":method": "POST",
          "content-type": "application/grpc",
          te: "trailers",
          ...headers
        })
        let status: string | undefined
        req.on("response", (h) => {
          status = h["grpc-status"] as string | undefined
        })
        req.on("trailers", (t) => {
          status = t["grpc-status"] as string | undefined
        })
        req.on("error", () => {})
        req.on("close", () => {
          session.close()
          resolve(status)
        })
        // Half a message, never ended: the handler cannot run.
        req.write(frameMessage(Buffer.from("abcdef")).subarray(0, 7))
        // Cancelled once the server has the stream: a PING's answer comes after it read the HEADERS sent before.
        if (cancel) session.ping(() => req.close(http2.constants.NGHTTP2_CANCEL))
      })
    expect(await partial({ ":path": "/t.T/Echo", "grpc-timeout": "50m" }, false)).toBe(
      String(grpc.status.DEADLINE_EXCEEDED)
    )
    await partial({ ":path": "/t.T/Echo" }, true)
    await pollUntil("the cancel reported", () => rejected.length >= before + 2, 10_000, 10)
    expect(rejected.slice(before)).toEqual([
      ["/t.T/Echo", grpc.status.DEADLINE_EXCEEDED],
      ["/t.T/Echo", grpc.status.CANCELLED]
    ])
    // Handled calls, ended by their handler or by a deadline after it ran, are the handler's to count.
    expect((await unary("/t.T/Echo", Buffer.from("ok"))).code).toBe(0)
    await rawCall({ ":path": "/t.T/Hang", "grpc-timeout": "50m" }, [frameMessage(Buffer.from("x"))])
    expect(rejected.length).toBe(before + 2)
  })

  it("a caller's reset just before the grpc-timeout it sent is its deadline, not a cancel", async () => {
    // The caller resets at 285 ms of a 300 ms grpc-timeout, as a client whose own deadline timer fires before the
    // server's does; and at once, with the same timeout: a cancel.
    const hang = (resetAfterMs: number) =>
      new Promise<void>((resolve) => {
        const session = http2.connect(`http://127.0.0.1:${port}`)
        session.on("error", () => {})
        const req = session.request({
          ":method": "POST",
          ":path": "/t.T/Hang",
          "content-type": "application/grpc",
          te: "trailers",
          "grpc-timeout": "300m"
        })
        req.on("error", () => {})
        req.on("close", () => {
          session.close()
          resolve()
        })
        req.end(frameMessage(Buffer.from("x")))
        // the handler has the call once its first message comes back
        req.once("data", () => setTimeout(() => req.close(http2.constants.NGHTTP2_CANCEL), resetAfterMs))
      })
    const before = hangEnds.length
    await hang(285)
    await hang(0)
    await pollUntil("both ends seen", () => hangEnds.length >= before + 2, 10_000, 10)
    expect(hangEnds.slice(before)).toEqual(["deadline", "cancelled"])
  })

  it("a grpc-timeout of 0 has passed already: DEADLINE_EXCEEDED at once, the method never runs", async () => {
    const [ran, refused] = [echoLeft.length, rejected.length]
    for (const timeout of ["0S", "0m", "0n"]) {
      const r = await rawCall({ ":path": "/t.T/Echo", "grpc-timeout": timeout }, [frameMessage(Buffer.from("x"))])
      expect([timeout, r.grpcStatus, r.data.length]).toEqual([timeout, String(grpc.status.DEADLINE_EXCEEDED), 0])
    }
    expect(echoLeft.length).toBe(ran)
    expect(rejected.slice(refused)).toEqual(Array(3).fill(["/t.T/Echo", grpc.status.DEADLINE_EXCEEDED]))
  })

  it("remainingMs: what is left of the caller's grpc-timeout when the handler runs; undefined without one", async () => {
    const before = echoLeft.length
    const withDeadline = await new Promise<number>((resolve) =>
      client.makeUnaryRequest(
        "/t.T/Echo",
        raw,
        raw,
        Buffer.from("x"),
        new grpc.Metadata(),
        { deadline: Date.now() + 10_000 },
        (err) => resolve(err ? err.code : 0)
      )
    )
    expect(withDeadline).toBe(0)
    expect((await unary("/t.T/Echo", Buffer.from("y"))).code).toBe(0)
    const [left, none] = echoLeft.slice(before)
    expect(left).toBeGreaterThan(5_000)
    expect(left).toBeLessThanOrEqual(10_000)
    expect(none).toBeUndefined()
  })

  it.each([
    // a tenth of 300 ms is 30: the slack's cap
    [0, 300, "cancelled"],
    [269, 300, "cancelled"],
    [270, 300, "deadline"],
    [0, 50, "cancelled"],
    [44, 50, "cancelled"],
    [45, 50, "deadline"],
    [1000, 2000, "cancelled"],
    [1949, 2000, "cancelled"],
    [1950, 2000, "deadline"],
    [400, 300, "deadline"],
    [5000, undefined, "cancelled"],
    // 1% of 60 s is 600 ms; of 10 min 6 s, held to 1 s
    [59_399, 60_000, "cancelled"],
    [59_400, 60_000, "deadline"],
    [598_999, 600_000, "cancelled"],
    [599_000, 600_000, "deadline"]
  ] as const)("resetWhy(%i ms after the headers, timeout %s ms) = %s", (elapsed, timeout, why) => {
    expect(resetWhy(elapsed, timeout)).toBe(why)
  })

  it("reports a connection that breaks HTTP/2 (not swallowed) and goes on serving", async () => {
    const before = connectionErrors.length
    const socket = net.connect(port, "127.0.0.1")
    socket.on("error", () => {})
    socket.write("this is not the HTTP/2 connection preface\r\n\r\n")
    await pollUntil("the connection error reported", () => connectionErrors.length > before, 10_000, 10)
    socket.destroy()
    expect((await unary("/t.T/Echo", Buffer.from("after"))).value?.toString()).toBe("after")
  })

  it("refuses requests past the arriving-bytes budget (RESOURCE_EXHAUSTED) and frees a request's share when it goes", async () => {
    const small = new Http2GrpcServer({ maxReceiveMessageLength: 8192, maxArrivingBytes: 3000 })
    small.addService({ echo: service.echo }, {
      echo: (call: ServerCall<Buffer, Buffer>, done: Done) => done(null, call.request)
    } as unknown as grpc.UntypedServiceImplementation)
    const smallPort = await small.listen("127.0.0.1", 0)
    const session = http2.connect(`http://127.0.0.1:${smallPort}`)
    session.on("error", () => {})
    const echoPost = { ":method": "POST", ":path": "/t.T/Echo", "content-type": "application/grpc", te: "trailers" }
    /** A request that sends `n` bytes of a 4,000-byte message and waits; its status, once it has one. */
    const partial = (n: number) => {
      const req = session.request(echoPost)
      req.on("error", () => {})
      const status = new Promise<string | undefined>((resolve) => {
        req.on("response", (h) => resolve(h["grpc-status"] as string | undefined))
        req.on("close", () => resolve(undefined))
      })
      req.write(frameMessage(Buffer.alloc(4000)).subarray(0, n))
      return { req, status }
    }
    const whole = () =>
      new Promise<string | undefined>((resolve) => {
        const req = session.request(echoPost)
        req.on("error", () => {})
        let status: string | undefined
        req.on("trailers", (t) => {
          status = t["grpc-status"] as string | undefined
        })
        req.on("response", (h) => {
          status ??= h["grpc-status"] as string | undefined
        })
        req.on("close", () => resolve(status))
        req.resume()
        req.end(frameMessage(Buffer.alloc(2000)))
      })
    try {
      const first = partial(2000)
      // The server has read the first request's bytes once a PING sent after them is answered.
      await new Promise<void>((resolve) => session.ping(() => resolve()))
      expect(await partial(2000).status).toBe(String(grpc.status.RESOURCE_EXHAUSTED))
      // The first one gone, its 2,000 bytes are free again: a whole 2,000-byte request is served.
      first.req.close(http2.constants.NGHTTP2_CANCEL)
      await pollUntil("a request served once the first is gone", async () => (await whole()) === "0", 10_000, 10)
    } finally {
      session.close()
      small.destroy()
    }
  })

  /** An echo server with these bounds, a connection to it, and one whole request's grpc-status on it. */
  const budgetServer = async (maxReceiveMessageLength: number, maxArrivingBytes: number) => {
    const small = new Http2GrpcServer({ maxReceiveMessageLength, maxArrivingBytes })
    small.addService({ echo: service.echo }, {
      echo: (call: ServerCall<Buffer, Buffer>, done: Done) => done(null, call.request)
    } as unknown as grpc.UntypedServiceImplementation)
    const session = http2.connect(`http://127.0.0.1:${await small.listen("127.0.0.1", 0)}`)
    session.on("error", () => {})
    const send = (body: Uint8Array) =>
      new Promise<string | undefined>((resolve) => {
        const req = session.request({ ":method": "POST", ":path": "/t.T/Echo", "content-type": "application/grpc" })
        req.on("error", () => {})
        let status: string | undefined
        const take = (h: http2.IncomingHttpHeaders) => {
          status ??= h["grpc-status"] as string | undefined
        }
        req.on("response", take)
        req.on("trailers", take)
        req.resume()
        req.on("close", () => resolve(status))
        req.end(body)
      })
    const close = () => {
      session.destroy()
      small.destroy()
    }
    return { send, close }
  }

  it("a request refused before its handler (message too large) gives its arriving bytes back", async () => {
    // Server.ts: what a request holds of the arriving budget "is given back at the handler or at that end"; kept,
    // refusals would use the budget up and every later request be refused requests_over_budget until a restart.
    const { send, close } = await budgetServer(16, 100)
    try {
      const tooLarge = frameMessage(Buffer.alloc(40)) // 45 bytes, over the 16-byte message limit
      for (let i = 0; i < 4; i++) expect(await send(tooLarge)).toBe(String(grpc.status.RESOURCE_EXHAUSTED))
      expect(await send(frameMessage(Buffer.from("abcdefghijk")))).toBe("0") // 16 bytes: more than 4 x 45 would leave
    } finally {
      close()
    }
  })

  it("a request of exactly the arriving-bytes budget is taken (the budget is what may arrive, not one byte less)", async () => {
    const { send, close } = await budgetServer(95, 100)
    try {
      expect(await send(frameMessage(Buffer.alloc(95)))).toBe("0")
    } finally {
      close()
    }
  })

  it("a refusal before the handler sends what onRejected returns (an SGLang prefill node's Generate: retry the pair)", async () => {
    // The gRPC layer's rule (GrpcServer.ts: GenerateCall.ts rejected), here by path: the transport knows no method.
    const refusal = async (boundPath: string | undefined) => {
      const small = new Http2GrpcServer({
        maxReceiveMessageLength: 8192,
        maxArrivingBytes: 3000,
        onRejected: (path, f) => (path === boundPath ? { ...f, pairBound: true } : f)
      })
      small.addService({ echo: service.echo }, {
        echo: (call: ServerCall<Buffer, Buffer>, done: Done) => done(null, call.request)
      } as unknown as grpc.UntypedServiceImplementation)
      const session = http2.connect(`http://127.0.0.1:${await small.listen("127.0.0.1", 0)}`)
      session.on("error", () => {})
      const post = { ":method": "POST", ":path": "/t.T/Echo", "content-type": "application/grpc", te: "trailers" }
      try {
        const first = session.request(post)
        first.on("error", () => {})
        first.write(frameMessage(Buffer.alloc(4000)).subarray(0, 2000))
        await new Promise<void>((resolve) => session.ping(() => resolve()))
        const second = session.request(post)
        second.on("error", () => {})
        const head = new Promise<http2.IncomingHttpHeaders>((resolve) => second.on("response", resolve))
        second.write(frameMessage(Buffer.alloc(4000)).subarray(0, 2000))
        const h = await head
        return [h["grpc-status"], h["cgn-reason"], h["cgn-retryable"], h["cgn-retry-pair"]]
      } finally {
        session.close()
        small.destroy()
      }
    }
    const exhausted = String(grpc.status.RESOURCE_EXHAUSTED)
    expect(await refusal(undefined)).toEqual([exhausted, "requests_over_budget", "true", undefined])
    expect(await refusal("/t.T/Echo")).toEqual([exhausted, "requests_over_budget", "false", "true"])
    expect(await refusal("/t.T/Other")).toEqual([exhausted, "requests_over_budget", "true", undefined])
  })

  it("decodes gzip and deflate requests", async () => {
    for (const [encoding, how] of [
      ["gzip", zlib.gzipSync],
      ["deflate", zlib.deflateSync]
    ] as const) {
      const r = await rawCall({ ":path": "/t.T/Echo", "grpc-encoding": encoding }, [
        compressed(Buffer.from(encoding), how)
      ])
      expect(r.grpcStatus).toBe("0")
      expect(r.data.subarray(5).toString()).toBe(encoding)
      // the limit (1024 here) is the decompressed message's: exactly the limit is taken, a byte more is not
      const full = await rawCall({ ":path": "/t.T/Echo", "grpc-encoding": encoding }, [
        compressed(Buffer.alloc(1024, 0x61), how)
      ])
      expect({ encoding, status: full.grpcStatus, length: full.data.length }).toEqual({
        encoding,
        status: "0",
        length: 5 + 1024
      })
      const over = await rawCall({ ":path": "/t.T/Echo", "grpc-encoding": encoding }, [
        compressed(Buffer.alloc(1025, 0x61), how)
      ])
      expect({ encoding, status: over.grpcStatus }).toEqual({
        encoding,
        status: String(grpc.status.RESOURCE_EXHAUSTED)
      })
      expect(over.grpcMessage).toContain("(1025 vs 1024)")
    }
  })

  it("ends a call at its grpc-timeout with DEADLINE_EXCEEDED, and its handler sees 'cancelled'", async () => {
    const before = cancelled
    const r = await rawCall({ ":path": "/t.T/Hang", "grpc-timeout": "50m" }, [frameMessage(Buffer.from("x"))])
    expect(r.grpcStatus).toBe(String(grpc.status.DEADLINE_EXCEEDED))
    expect(r.data.subarray(5).toString()).toBe("open")
    expect(cancelled).toBe(before + 1)
  })

  it(`a burst of ${STREAM_RESET_BURST / 5} cancels on one connection: each is CANCELLED, the connection's other calls are untouched`, async () => {
    const c = new grpc.Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure())
    const n = STREAM_RESET_BURST / 5 // 2000, twice Node's default burst
    const keep = 200
    const before = cancelled
    const calls = Array.from({ length: n + keep }, () => {
      const call = c.makeServerStreamRequest("/t.T/Hang", raw, raw, Buffer.from("x"))
      const opened = new Promise<void>((resolve) => call.once("data", () => resolve()))
      const status = new Promise<number>((resolve) => call.on("status", (s: grpc.StatusObject) => resolve(s.code)))
      call.on("error", () => {})
      return { call, opened, status }
    })
    await Promise.all(calls.map((x) => x.opened))
    for (const x of calls.slice(0, n)) x.call.cancel()
    await pollUntil("the server to see every cancel", () => cancelled - before >= n, 30_000)
    expect(cancelled - before).toBe(n)
    // The rest end normally, from the server: none was cut by a GOAWAY.
    expect(open.size).toBe(keep)
    for (const call of open) call.end()
    const codes = await Promise.all(calls.map((x) => x.status))
    const count = (code: number) => codes.filter((k) => k === code).length
    expect({ cancelled: count(grpc.status.CANCELLED), ok: count(grpc.status.OK) }).toEqual({ cancelled: n, ok: keep })
    expect((await unary("/t.T/Echo", Buffer.from("still up"), c)).value?.toString()).toBe("still up")
    c.close()
  }, 60_000)

  it("close() lets a running call finish and takes no new call; destroy() cancels what is left", async () => {
    const s = new Http2GrpcServer({ maxReceiveMessageLength: 1024 })
    const calls: Array<ServerCall<Buffer, Buffer>> = []
    let gone = 0
    s.addService({ hang: service.hang }, {
      hang: (call: ServerCall<Buffer, Buffer>) => {
        calls.push(call)
        call.on("cancelled", () => gone++)
        call.write(Buffer.from("open"))
      }
    } as unknown as grpc.UntypedServiceImplementation)
    const p = await s.listen("127.0.0.1", 0)
    const c = new grpc.Client(`127.0.0.1:${p}`, grpc.credentials.createInsecure())
    const start = () => {
      const call = c.makeServerStreamRequest("/t.T/Hang", raw, raw, Buffer.from("x"))
      call.on("error", () => {})
      return {
        opened: new Promise<void>((resolve) => call.once("data", () => resolve())),
        status: new Promise<number>((resolve) => call.on("status", (st: grpc.StatusObject) => resolve(st.code)))
      }
    }
    const first = start()
    const second = start()
    await Promise.all([first.opened, second.opened])
    let closed = false
    const closing = s.close().then(() => {
      closed = true
    })
    const lateClient = new grpc.Client(`127.0.0.1:${p}`, grpc.credentials.createInsecure())
    const late = await unary("/t.T/Hang", Buffer.from("x"), lateClient)
    lateClient.close()
    expect(late.code).toBe(grpc.status.UNAVAILABLE)
    expect(closed).toBe(false)
    calls[0]!.end()
    expect(await first.status).toBe(grpc.status.OK)
    s.destroy()
    await closing
    expect(await second.status).not.toBe(grpc.status.OK)
    expect(gone).toBe(1)
    c.close()
  })
  it("close(): a connection still in its TLS handshake is closed at once (ended after close() began, it took new calls and held close() until destroy)", async () => {
    const pki = makeTestPki()
    const material = { ca: pki.ca.cert, cert: pki.server.cert, key: pki.server.key }
    const s = new Http2GrpcServer({
      maxReceiveMessageLength: 1024,
      tls: { current: () => material, subscribe: () => () => {} }
    })
    s.addService({ echo: service.echo }, {
      echo: (call: ServerCall<Buffer, Buffer>, done: Done) => done(null, call.request)
    } as unknown as grpc.UntypedServiceImplementation)
    const p = await s.listen("127.0.0.1", 0)
    // The client's TLS bytes go through `pipe`: once the server has answered its hello (so the server has the
    // connection), what the client sends next (its certificate, Finished, then HTTP/2) waits until close().
    const socket = net.connect(p, "127.0.0.1")
    socket.on("error", () => {})
    const held: Array<Buffer> = []
    let holding = false
    const answered = new Promise<void>((resolve) => {
      socket.once("data", () => {
        holding = true
        resolve()
      })
    })
    const pipe = new Duplex({
      write(chunk: Buffer, _encoding, callback) {
        if (holding) held.push(chunk)
        else socket.write(chunk)
        callback()
      },
      read() {}
    })
    socket.on("data", (d) => pipe.push(d))
    socket.on("end", () => pipe.push(null))
    socket.on("close", () => pipe.destroy())
    const release = () => {
      holding = false
      for (const c of held.splice(0)) socket.write(c)
    }
    const session = http2.connect(`https://127.0.0.1:${p}`, {
      createConnection: () =>
        tls.connect({
          socket: pipe,
          ca: pki.ca.cert,
          cert: pki.client.cert,
          key: pki.client.key,
          servername: "localhost",
          ALPNProtocols: ["h2"]
        })
    })
    session.on("error", () => {})
    try {
      await answered
      let closed = false
      const closing = s.close().then(() => {
        closed = true
      })
      release()
      // A call on that connection: refused (the connection closed), not served.
      const late = await new Promise<string>((resolve) => {
        try {
          const req = session.request({
            ":method": "POST",
            ":path": "/t.T/Echo",
            "content-type": "application/grpc",
            te: "trailers"
          })
          let status = "none"
          req.on("trailers", (t) => {
            status = String(t["grpc-status"])
          })
          req.on("error", () => {})
          req.on("close", () => resolve(req.rstCode === http2.constants.NGHTTP2_NO_ERROR ? status : "refused"))
          req.resume()
          req.end(frameMessage(Buffer.from("late")))
        } catch {
          resolve("refused")
        }
      })
      expect(late).toBe("refused")
      // And close() ends with it, without destroy().
      await closing
      expect(closed).toBe(true)
    } finally {
      session.destroy()
      s.destroy()
      pki.cleanup()
    }
  })

  it("a listen that fails (address in use) ends the certificate subscription it took: nothing will close that server", async () => {
    const pki = makeTestPki()
    const holder = net.createServer()
    try {
      const material = { ca: pki.ca.cert, cert: pki.server.cert, key: pki.server.key }
      let subscribed = 0
      const s = new Http2GrpcServer({
        maxReceiveMessageLength: 1024,
        tls: {
          current: () => material,
          subscribe: () => {
            subscribed++
            return () => void subscribed--
          }
        }
      })
      await new Promise<void>((resolve) => holder.listen(0, "127.0.0.1", resolve))
      const taken = (holder.address() as net.AddressInfo).port
      await expect(s.listen("127.0.0.1", taken)).rejects.toMatchObject({ code: "EADDRINUSE" })
      expect(subscribed).toBe(0)
    } finally {
      holder.close()
      pki.cleanup()
    }
  })
})
