// The engine's HTTP/1.1 client: the pure framing rules (table tests), then the pool against raw TCP servers
// that answer the way an engine may (byte by byte, HTTP/1.0 close-delimited, interim heads, trailers, an idle
// connection closed under it). The EngineClient tests (engine-client.test.ts) cover the exchanges on top of it.
import * as net from "node:net"
import { afterEach, describe, expect, it } from "vitest"
import { type Controller, type Handler, Http1Pool } from "../../src/layers/engine/http1.ts"
import { parseChunkSize, parseResponseHead, requestHead } from "../../src/services/engine/Http1Framing.ts"
import { pollUntil } from "../support/poll.ts"

describe("HTTP/1.1 framing", () => {
  const head = (...lines: Array<string>) => parseResponseHead(lines.join("\r\n"))

  it("reads status, body framing and keep-alive from a response head", () => {
    const cases: ReadonlyArray<[string, ReturnType<typeof parseResponseHead>]> = [
      [
        ["HTTP/1.1 200 OK", "Transfer-Encoding: chunked"].join("\r\n"),
        { status: 200, framing: { kind: "chunked" }, keepAlive: true }
      ],
      [
        ["HTTP/1.1 400 Bad Request", "Content-Length: 12", "Connection: keep-alive"].join("\r\n"),
        { status: 400, framing: { kind: "length", length: 12 }, keepAlive: true }
      ],
      [
        ["HTTP/1.1 200 OK", "content-length: 5", "connection: close"].join("\r\n"),
        { status: 200, framing: { kind: "length", length: 5 }, keepAlive: false }
      ],
      // Neither length nor chunked: the body runs to the end of the connection, which cannot be reused.
      ["HTTP/1.1 200 OK", { status: 200, framing: { kind: "close" }, keepAlive: false }],
      [
        ["HTTP/1.0 200 OK", "Content-Length: 2"].join("\r\n"),
        { status: 200, framing: { kind: "length", length: 2 }, keepAlive: false }
      ],
      [
        ["HTTP/1.0 200 OK", "Content-Length: 2", "Connection: Keep-Alive"].join("\r\n"),
        { status: 200, framing: { kind: "length", length: 2 }, keepAlive: true }
      ],
      // chunked wins over a length (RFC 9112 6.3), and only as the last coding.
      [
        ["HTTP/1.1 200 OK", "Content-Length: 9", "Transfer-Encoding: gzip, chunked"].join("\r\n"),
        { status: 200, framing: { kind: "chunked" }, keepAlive: true }
      ],
      ["HTTP/1.1 204 No Content", { status: 204, framing: { kind: "length", length: 0 }, keepAlive: true }],
      ["HTTP/1.1 100 Continue", { status: 100, framing: { kind: "length", length: 0 }, keepAlive: true }]
    ]
    for (const [text, want] of cases) expect(parseResponseHead(text), text).toEqual(want)
  })

  it("refuses what is not a response head, and lengths that disagree", () => {
    expect(head("SSH-2.0-OpenSSH_9.2")).toEqual({ invalid: expect.stringMatching(/not an HTTP\/1.x status line/) })
    expect(head("HTTP/1.1 200 OK", "Content-Length: -1")).toEqual({ invalid: expect.stringMatching(/content-length/) })
    expect(head("HTTP/1.1 200 OK", "Content-Length: 3", "Content-Length: 4")).toEqual({
      invalid: expect.stringMatching(/content-length/)
    })
  })

  it("reads chunk sizes, with extensions", () => {
    expect([parseChunkSize("1a"), parseChunkSize("1A;name=x"), parseChunkSize("0"), parseChunkSize(" 10 ")]).toEqual([
      26, 26, 0, 16
    ])
    expect([parseChunkSize(""), parseChunkSize("zz"), parseChunkSize("-1"), parseChunkSize("1".repeat(13))]).toEqual([
      undefined,
      undefined,
      undefined,
      undefined
    ])
  })

  it("writes the request head with the body's byte length, and refuses a header that could end it", () => {
    const r = requestHead({ method: "POST", path: "/v1/x", host: "h:1", headers: { a: "b" }, body: "é" })
    expect(r).toEqual({ text: "POST /v1/x HTTP/1.1\r\nhost: h:1\r\na: b\r\ncontent-length: 2\r\n\r\né" })
    const bad = requestHead({
      method: "GET",
      path: "/",
      host: "h",
      headers: { "x-request-id": "a\r\nb: c" },
      body: null
    })
    expect(bad).toEqual({ invalid: expect.stringMatching(/"x-request-id" has a line break/) })
  })
})

// ---------------------------------------------------------------------------------------------------------

interface Seen {
  status: number
  body: string
  end?: true
  error?: Error
}

/** Records what the pool hands a handler; `done` resolves at the end or the error. */
const recorder = (onData?: (c: Controller, seen: Seen) => void) => {
  const seen: Seen = { status: 0, body: "" }
  let settle: () => void = () => undefined
  const done = new Promise<Seen>((resolve) => {
    settle = () => resolve(seen)
  })
  const handler: Handler = {
    onRequestStart: () => undefined,
    onResponseStart: (_c, status) => {
      seen.status = status
    },
    onResponseData: (c, chunk) => {
      seen.body += chunk.toString("utf8")
      onData?.(c, seen)
    },
    onResponseEnd: () => {
      seen.end = true
      settle()
    },
    onResponseError: (_c, e) => {
      seen.error = e
      settle()
    }
  }
  return { handler, done }
}

/** A raw TCP server: `answer` gets each connection's socket and the request text read so far. */
const servers: Array<net.Server> = []
const rawServer = async (answer: (socket: net.Socket, request: string, connection: number) => void) => {
  let connections = 0
  const closed: Array<number> = []
  const server = net.createServer((socket) => {
    const id = ++connections
    let text = ""
    socket.on("data", (d) => {
      text += d.toString("latin1")
      // One request per head here (GET, or a body with its length): answer once the head and body are in.
      const end = text.indexOf("\r\n\r\n")
      if (end < 0) return
      const length = Number(/content-length: (\d+)/i.exec(text.slice(0, end))?.[1] ?? 0)
      if (text.length < end + 4 + length) return
      const request = text.slice(0, end + 4 + length)
      text = text.slice(end + 4 + length)
      answer(socket, request, id)
    })
    socket.on("error", () => undefined)
    socket.on("close", () => closed.push(id))
  })
  servers.push(server)
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r))
  const port = (server.address() as net.AddressInfo).port
  return { origin: `http://127.0.0.1:${port}`, connections: () => connections, closed }
}

const get = (origin: string, path = "/") => ({
  origin,
  path,
  method: "GET" as const,
  headers: {},
  body: null,
  headersTimeout: 5_000,
  bodyTimeout: 0
})

/** Writes `text` one byte per write. */
const byteByByte = (socket: net.Socket, text: string) => {
  for (const b of Buffer.from(text)) socket.write(Buffer.from([b]))
}

describe("Http1Pool against raw servers", () => {
  const pools: Array<Http1Pool> = []
  const pool = (keepAliveTimeoutMs?: number) => {
    const p = new Http1Pool({
      connectTimeoutMs: 5_000,
      ...(keepAliveTimeoutMs === undefined ? {} : { keepAliveTimeoutMs })
    })
    pools.push(p)
    return p
  }
  afterEach(async () => {
    for (const p of pools.splice(0)) p.close()
    for (const s of servers.splice(0)) await new Promise((r) => s.close(r))
  })

  it("a chunked body sent byte by byte, with extensions and trailers, arrives whole; the connection is reused", async () => {
    const srv = await rawServer((socket) =>
      byteByByte(
        socket,
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=1\r\nhello\r\n7\r\n, world\r\n0\r\nx-trailer: t\r\n\r\n"
      )
    )
    const p = pool()
    for (let i = 0; i < 3; i++) {
      const r = recorder()
      p.dispatch(get(srv.origin), r.handler)
      expect(await r.done).toEqual({ status: 200, body: "hello, world", end: true })
    }
    expect(srv.connections()).toBe(1)
  })

  it("a close-delimited (HTTP/1.0) body ends with the connection, which is not reused", async () => {
    const srv = await rawServer((socket) => {
      socket.write("HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: a\n\n")
      socket.end("data: [DONE]\n\n")
    })
    const p = pool()
    for (let i = 0; i < 2; i++) {
      const r = recorder()
      p.dispatch(get(srv.origin), r.handler)
      expect(await r.done).toEqual({ status: 200, body: "data: a\n\ndata: [DONE]\n\n", end: true })
    }
    expect(srv.connections()).toBe(2)
  })

  it("an interim 100 Continue head is skipped: the handler sees the final status only", async () => {
    const srv = await rawServer((socket) =>
      socket.write("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok")
    )
    const r = recorder()
    pool().dispatch(get(srv.origin), r.handler)
    expect(await r.done).toEqual({ status: 201, body: "ok", end: true })
  })

  it("an idle connection the engine closes is dropped: the next request opens a new one", async () => {
    const srv = await rawServer((socket, _req, id) => {
      if (id === 1) socket.end("HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n1")
      else socket.write("HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n2")
    })
    const p = pool()
    const first = recorder()
    p.dispatch(get(srv.origin), first.handler)
    expect((await first.done).body).toBe("1")
    await pollUntil("the first connection closed", () => srv.closed.includes(1))
    const second = recorder()
    p.dispatch(get(srv.origin), second.handler)
    expect(await second.done).toEqual({ status: 200, body: "2", end: true })
    expect(srv.connections()).toBe(2)
  })

  it("an idle connection is closed after the keep-alive time", async () => {
    const srv = await rawServer((socket) => socket.write("HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx"))
    const r = recorder()
    pool(50).dispatch(get(srv.origin), r.handler)
    expect((await r.done).end).toBe(true)
    await pollUntil("the pool closed the idle connection", () => srv.closed.includes(1))
  })

  it("a paused exchange gets the rest after resume, in order", async () => {
    const srv = await rawServer((socket) =>
      socket.write("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n1\r\nb\r\n1\r\nc\r\n0\r\n\r\n")
    )
    let paused: Controller | undefined
    const r = recorder((c, seen) => {
      if (seen.body === "a") {
        c.pause()
        paused = c
      }
    })
    pool().dispatch(get(srv.origin), r.handler)
    const c = await pollUntil("the first byte, then a pause", () => paused)
    expect(c.paused).toBe(true)
    c.resume()
    expect(await r.done).toEqual({ status: 200, body: "abc", end: true })
  })

  it("what is not HTTP fails the exchange with PROTOCOL", async () => {
    const srv = await rawServer((socket) => socket.write("SSH-2.0-OpenSSH_9.2\r\n\r\n"))
    const r = recorder()
    pool().dispatch(get(srv.origin), r.handler)
    const seen = await r.done
    expect((seen.error as { code?: string } | undefined)?.code).toBe("PROTOCOL")
  })

  it("a header with a line break is refused before anything is written", async () => {
    const srv = await rawServer((socket) => socket.write("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"))
    const r = recorder()
    pool().dispatch({ ...get(srv.origin), headers: { "x-request-id": "a\r\nx: y" } }, r.handler)
    const seen = await r.done
    expect((seen.error as { code?: string } | undefined)?.code).toBe("INVALID_HEADER")
    expect(seen.status).toBe(0)
  })
})
