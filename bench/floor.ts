// The floor: the least a Node gRPC-in, SSE-out relay must do, to read the agent's bench figures against
// (`node bench/relay.ts --agent-root floor`, `node bench/per-call.ts --agent-root floor`). It serves
// Agent.Generate only, with the same generated protobuf encoders as the agent, reads the engine's SSE, splits
// lines, `JSON.parse`s each `data:` event, writes `choices[0].text` as one delta per read, then a final message.
// Nothing else: no config, admission, metrics, spans, logs, watchdog, error mapping or back-pressure. Whatever
// CPU or RSS the agent spends above this is the agent's own; what this spends above nginx is the stack's.
// The stack is chosen by environment, to measure what another one would give:
//   FLOOR_SERVER=grpc-js (default: grpc-js's Server, as the agent) | http2 (node:http2 with gRPC framing by hand)
//                | net-h2 (HTTP/2 itself framed by hand on node:net: what node:http2's own path costs; enough for
//                the bench's clients only, see serveNetH2)
//   FLOOR_CLIENT=undici  (default: undici's dispatch, as the agent) | net (HTTP/1.1 over node:net by hand:
//                keep-alive sockets, chunked bodies only; enough for the simulator, not a client for production)
//   FLOOR_RELAY=parsed (default: SSE lines split, each event JSON-parsed, deltas encoded) | raw (nothing parsed:
//                one fixed one-token message written per engine read, so what is left is the transport alone)
// Usage: node bench/floor.ts --grpc PORT --admin PORT --engine URL   (GET /readyz on the admin port answers 200,
// its body the floor's pid: a caller can tell its own floor from another process that holds the port)
import { createServer } from "node:http"
import * as http2 from "node:http2"
import * as net from "node:net"
import { parseArgs } from "node:util"
import * as grpc from "@grpc/grpc-js"
import { Agent, type Dispatcher } from "undici"
import { AgentDefinition, GenerateRequest, GenerateResponse } from "../src/gen/cgn/agent/v1/agent.ts"

const { values } = parseArgs({
  options: { grpc: { type: "string" }, admin: { type: "string" }, engine: { type: "string" } }
})
const engine = new URL(values.engine ?? "http://127.0.0.1:8000")
const serverKind = process.env.FLOOR_SERVER ?? "grpc-js"
const clientKind = process.env.FLOOR_CLIENT ?? "undici"
const bytes = (u: Uint8Array): Buffer => Buffer.from(u.buffer, u.byteOffset, u.byteLength)

/** The call side as the relay sees it, whichever server holds the call. */
interface Out {
  write(m: GenerateResponse): void
  end(): void
  fail(e: Error): void
}

/** The engine side's events, whichever client reads the engine. */
interface Sink {
  data(chunk: Buffer): void
  end(): void
  error(e: Error): void
}

/** `FLOOR_RELAY=raw`: the engine's bytes read and dropped, one fixed one-token delta written per read. */
const ONE_TOKEN: GenerateResponse = { delta: { text: "x", index: 0, tokens: 1 } }
const rawTo = (out: Out): Sink => ({
  data: () => out.write(ONE_TOKEN),
  end() {
    out.write({ final: { finishReason: "stop", nodeId: "floor", requestId: "", stopSequence: "" } })
    out.end()
  },
  error: (e) => out.fail(e)
})

/** SSE to deltas: one delta per read, the final message at the end of the body. */
const parsedTo = (out: Out): Sink => {
  let pending = ""
  let finish = "stop"
  return {
    data(chunk) {
      pending += chunk.toString("utf8")
      let text = ""
      let tokens = 0
      let start = 0
      for (let nl = pending.indexOf("\n"); nl >= 0; nl = pending.indexOf("\n", start)) {
        const line = pending.slice(start, nl)
        start = nl + 1
        if (!line.startsWith("data: ") || line === "data: [DONE]") continue
        const choice = (JSON.parse(line.slice(6)) as { choices?: Array<{ text?: string; finish_reason?: string }> })
          .choices?.[0]
        if (choice?.finish_reason) finish = choice.finish_reason
        if (choice?.text) {
          text += choice.text
          tokens++
        }
      }
      pending = pending.slice(start)
      if (tokens > 0) out.write({ delta: { text, index: 0, tokens } })
    },
    end() {
      out.write({ final: { finishReason: finish, nodeId: "floor", requestId: "", stopSequence: "" } })
      out.end()
    },
    error: (e) => out.fail(e)
  }
}

const relayTo = process.env.FLOOR_RELAY === "raw" ? rawTo : parsedTo

// ---------------------------------------------------------------------------------------------------------
// Engine clients: start a streamed completion; the returned function aborts it.

const requestBody = (req: GenerateRequest): string =>
  JSON.stringify({
    model: req.model || "m",
    prompt: req.prompt,
    max_tokens: req.sampling?.maxTokens ?? 16,
    stream: true
  })

const pool = new Agent({ connections: null, pipelining: 1 })
const viaUndici = (body: string, sink: Sink): (() => void) => {
  let controller: Dispatcher.DispatchController | undefined
  pool.dispatch(
    {
      origin: engine.origin,
      path: "/v1/completions",
      method: "POST",
      headers: { "content-type": "application/json", accept: "text/event-stream" },
      body,
      // As the agent's EngineClient streams: no body timer (a timer refreshed per read costs), headers in 60 s.
      headersTimeout: 60_000,
      bodyTimeout: 0,
      blocking: false
    },
    {
      onRequestStart: (c) => {
        controller = c
      },
      onResponseStart: () => undefined,
      onResponseData: (_c, chunk) => sink.data(chunk),
      onResponseEnd: () => sink.end(),
      onResponseError: (_c, e) => sink.error(e)
    }
  )
  return () => controller?.abort(new Error("cancelled"))
}

/** Idle keep-alive sockets to the engine. */
const idle: Array<net.Socket> = []
/** A new connection; while idle, an error or the engine closing it only drops it from `idle`. */
const connect = (): net.Socket => {
  const socket = net.connect({ host: engine.hostname, port: Number(engine.port) }).setNoDelay(true)
  socket.on("error", () => undefined) // each request listens for its own errors; this one keeps an idle error quiet
  socket.once("close", () => {
    const i = idle.indexOf(socket)
    if (i >= 0) idle.splice(i, 1)
  })
  return socket
}
const viaNet = (body: string, sink: Sink): (() => void) => {
  const socket = idle.pop() ?? connect()
  let head = true
  let buf: Buffer = Buffer.alloc(0)
  let done = false
  const finish = (ok: boolean) => {
    done = true
    socket.off("data", onData)
    socket.off("error", onError)
    socket.off("close", onClose)
    if (ok) {
      idle.push(socket)
      sink.end()
    } else socket.destroy()
  }
  // Response head, then the chunked body: "<hex size>\r\n<data>\r\n" ... "0\r\n\r\n".
  const onData = (chunk: Buffer) => {
    buf = buf.length === 0 ? chunk : Buffer.concat([buf, chunk])
    if (head) {
      const end = buf.indexOf("\r\n\r\n")
      if (end < 0) return
      head = false
      buf = buf.subarray(end + 4)
    }
    for (;;) {
      const eol = buf.indexOf("\r\n")
      if (eol < 0) return
      const size = Number.parseInt(buf.toString("latin1", 0, eol), 16)
      if (size === 0) return finish(true)
      if (buf.length < eol + 2 + size + 2) return
      sink.data(buf.subarray(eol + 2, eol + 2 + size))
      buf = buf.subarray(eol + 2 + size + 2)
    }
  }
  const onError = (e: Error) => {
    if (!done) sink.error(e)
    finish(false)
  }
  // The engine closing the connection before the body ended fails the call instead of leaving it open.
  const onClose = () => onError(new Error("the engine closed the connection mid-response"))
  socket.on("data", onData)
  socket.on("error", onError)
  socket.on("close", onClose)
  socket.write(
    `POST /v1/completions HTTP/1.1\r\nhost: ${engine.host}\r\ncontent-type: application/json\r\n` +
      `accept: text/event-stream\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`
  )
  return () => {
    if (!done) finish(false)
  }
}

const startEngine = clientKind === "net" ? viaNet : viaUndici

// ---------------------------------------------------------------------------------------------------------
// gRPC servers

const generatePath = `/${AgentDefinition.fullName}/${AgentDefinition.methods.generate.name}`

const serveGrpcJs = (port: number, ready: () => void): (() => void) => {
  type Call = grpc.ServerWritableStream<GenerateRequest, GenerateResponse>
  const server = new grpc.Server()
  server.addService(
    {
      generate: {
        path: generatePath,
        requestStream: false,
        responseStream: true,
        requestSerialize: (m: GenerateRequest) => bytes(GenerateRequest.encode(m).finish()),
        requestDeserialize: (b: Buffer) => GenerateRequest.decode(b),
        responseSerialize: (m: GenerateResponse) => bytes(GenerateResponse.encode(m).finish()),
        responseDeserialize: (b: Buffer) => GenerateResponse.decode(b)
      }
    },
    {
      generate: (call: Call) => {
        const abort = startEngine(
          requestBody(call.request),
          relayTo({
            write: (m) => call.write(m),
            end: () => call.end(),
            fail: (e) => call.destroy(e)
          })
        )
        call.once("cancelled", abort)
      }
    }
  )
  server.bindAsync(`127.0.0.1:${port}`, grpc.ServerCredentials.createInsecure(), (err) => {
    if (err !== null) throw err
    ready()
  })
  return () => server.tryShutdown(() => process.exit(0))
}

/** A length-prefixed gRPC message: flag 0 (not compressed), 4-byte big-endian length, the message. */
const frame = (m: GenerateResponse): Buffer => {
  const body = GenerateResponse.encode(m).finish()
  const out = Buffer.allocUnsafe(5 + body.length)
  out[0] = 0
  out.writeUInt32BE(body.length, 1)
  out.set(body, 5)
  return out
}

const serveHttp2 = (port: number, ready: () => void): (() => void) => {
  const server = http2.createServer()
  server.on("stream", (stream, headers) => {
    if (headers[":path"] !== generatePath) {
      stream.respond({ ":status": 200, "content-type": "application/grpc", "grpc-status": "12" }, { endStream: true })
      return
    }
    const parts: Array<Buffer> = []
    stream.on("data", (c: Buffer) => parts.push(c))
    stream.once("end", () => {
      const req = GenerateRequest.decode(Buffer.concat(parts).subarray(5))
      stream.respond({ ":status": 200, "content-type": "application/grpc" }, { waitForTrailers: true })
      stream.once("wantTrailers", () => stream.sendTrailers({ "grpc-status": "0" }))
      const abort = startEngine(
        requestBody(req),
        relayTo({
          write: (m) => stream.write(frame(m)),
          end: () => stream.end(),
          fail: () => stream.close(http2.constants.NGHTTP2_INTERNAL_ERROR)
        })
      )
      stream.once("aborted", abort)
    })
  })
  server.listen(port, "127.0.0.1", ready)
  return () => server.close(() => process.exit(0))
}

// FLOOR_SERVER=net-h2: HTTP/2 framed by hand on node:net (RFC 9113), to measure what node:http2's own per-stream
// and per-write path costs: a message written from the engine's read callback is one socket write there and then
// (node:http2 queues it for nghttp2 and sends from an immediate). Enough for the bench's clients, nothing more:
// no HPACK decoding (every stream is taken for a Generate), flow control only on what it sends (its own receive
// windows set near 2^31), no CONTINUATION, priority, limits or flood rules: not a server to expose.
const H2 = { DATA: 0, HEADERS: 1, RST_STREAM: 3, SETTINGS: 4, PING: 6, GOAWAY: 7, WINDOW_UPDATE: 8 } as const
const h2Frame = (type: number, flags: number, id: number, payload: Buffer): Buffer => {
  const b = Buffer.allocUnsafe(9 + payload.length)
  b.writeUIntBE(payload.length, 0, 3)
  b[3] = type
  b[4] = flags
  b.writeUInt32BE(id, 5)
  payload.copy(b, 9)
  return b
}
const u32 = (n: number): Buffer => {
  const b = Buffer.allocUnsafe(4)
  b.writeUInt32BE(n, 0)
  return b
}
// :status 200 (static index 8); content-type (static name 31) literal, not indexed; grpc-status 0, a new name.
const RESPONSE_HEAD = Buffer.from([0x88, 0x0f, 0x10, 16, ...Buffer.from("application/grpc")])
const TRAILERS_OK = Buffer.from([0x00, 11, ...Buffer.from("grpc-status"), 1, 0x30])
const BIG_WINDOW = 2 ** 31 - 1

const serveNetH2 = (port: number, ready: () => void): (() => void) => {
  const server = net.createServer({ noDelay: true }, (socket) => {
    interface Stream {
      parts: Array<Buffer>
      window: number
      queue: Array<Buffer>
      ended: boolean
      abort?: () => void
    }
    const streams = new Map<number, Stream>()
    let buf: Buffer = Buffer.alloc(0)
    let preface = false
    let connWindow = 65535
    let initialWindow = 65535
    let received = 0
    socket.on("error", () => undefined)
    socket.on("close", () => {
      for (const s of streams.values()) s.abort?.()
      streams.clear()
    })
    const settings = Buffer.allocUnsafe(6)
    settings.writeUInt16BE(4, 0)
    settings.writeUInt32BE(BIG_WINDOW, 2)
    socket.write(
      Buffer.concat([h2Frame(H2.SETTINGS, 0, 0, settings), h2Frame(H2.WINDOW_UPDATE, 0, 0, u32(BIG_WINDOW - 65535))])
    )
    const finish = (id: number) => {
      socket.write(h2Frame(H2.HEADERS, 0x5, id, TRAILERS_OK))
      streams.delete(id)
    }
    // Sends what the windows let of each queued message, in DATA frames no larger than the peer's default
    // SETTINGS_MAX_FRAME_SIZE: a message larger than the stream's whole window goes in parts.
    const flush = (id: number, s: Stream) => {
      while (s.queue.length > 0) {
        const next = s.queue[0] as Buffer
        const n = Math.min(next.length, connWindow, s.window, 16_384)
        if (n <= 0) return
        connWindow -= n
        s.window -= n
        socket.write(h2Frame(H2.DATA, 0, id, next.subarray(0, n)))
        if (n === next.length) s.queue.shift()
        else s.queue[0] = next.subarray(n)
      }
      if (s.ended) finish(id)
    }
    const send = (id: number, s: Stream, m: GenerateResponse) => {
      const body = GenerateResponse.encode(m).finish()
      const out = Buffer.allocUnsafe(14 + body.length)
      out.writeUIntBE(5 + body.length, 0, 3)
      out[3] = H2.DATA
      out[4] = 0
      out.writeUInt32BE(id, 5)
      out[9] = 0
      out.writeUInt32BE(body.length, 10)
      out.set(body, 14)
      const len = 5 + body.length
      // the common case, one frame written at once; else the message waits its turn for the windows
      if (s.queue.length === 0 && len <= connWindow && len <= s.window && len <= 16_384) {
        connWindow -= len
        s.window -= len
        socket.write(out)
        return
      }
      s.queue.push(out.subarray(9))
      flush(id, s)
    }
    const onFrame = (type: number, flags: number, id: number, p: Buffer) => {
      switch (type) {
        case H2.SETTINGS: {
          if (flags & 0x1) return
          for (let i = 0; i + 6 <= p.length; i += 6) {
            if (p.readUInt16BE(i) !== 4) continue
            const next = p.readUInt32BE(i + 2)
            for (const s of streams.values()) s.window += next - initialWindow
            initialWindow = next
          }
          socket.write(h2Frame(H2.SETTINGS, 0x1, 0, Buffer.alloc(0)))
          return
        }
        case H2.PING:
          if (!(flags & 0x1)) socket.write(h2Frame(H2.PING, 0x1, 0, p))
          return
        case H2.HEADERS:
          streams.set(id, { parts: [], window: initialWindow, queue: [], ended: false })
          return
        case H2.DATA: {
          const s = streams.get(id)
          received += p.length
          if (received > 1 << 30) {
            socket.write(h2Frame(H2.WINDOW_UPDATE, 0, 0, u32(received)))
            received = 0
          }
          if (s === undefined) return
          s.parts.push(flags & 0x8 ? p.subarray(1, p.length - (p[0] as number)) : p)
          if (!(flags & 0x1)) return
          const req = GenerateRequest.decode(Buffer.concat(s.parts).subarray(5))
          s.parts = []
          socket.write(h2Frame(H2.HEADERS, 0x4, id, RESPONSE_HEAD))
          s.abort = startEngine(
            requestBody(req),
            relayTo({
              write: (m) => send(id, s, m),
              end: () => {
                s.ended = true
                if (s.queue.length === 0) finish(id)
              },
              fail: () => {
                socket.write(h2Frame(H2.RST_STREAM, 0, id, u32(2)))
                streams.delete(id)
              }
            })
          )
          return
        }
        case H2.RST_STREAM:
          streams.get(id)?.abort?.()
          streams.delete(id)
          return
        case H2.WINDOW_UPDATE: {
          const inc = p.readUInt32BE(0) & 0x7fffffff
          if (id === 0) {
            connWindow += inc
            for (const [sid, s] of streams) if (s.queue.length > 0) flush(sid, s)
          } else {
            const s = streams.get(id)
            if (s === undefined) return
            s.window += inc
            flush(id, s)
          }
          return
        }
        case H2.GOAWAY:
          socket.end()
          return
      }
    }
    socket.on("data", (chunk: Buffer) => {
      buf = buf.length === 0 ? chunk : Buffer.concat([buf, chunk])
      if (!preface) {
        if (buf.length < 24) return
        buf = buf.subarray(24)
        preface = true
      }
      while (buf.length >= 9) {
        const len = buf.readUIntBE(0, 3)
        if (buf.length < 9 + len) break
        const type = buf[3] as number
        const flags = buf[4] as number
        const id = buf.readUInt32BE(5) & 0x7fffffff
        const p = buf.subarray(9, 9 + len)
        buf = buf.subarray(9 + len)
        onFrame(type, flags, id, p)
      }
    })
  })
  server.listen(port, "127.0.0.1", ready)
  return () => server.close(() => process.exit(0))
}

const servers = { "grpc-js": serveGrpcJs, http2: serveHttp2, "net-h2": serveNetH2 } as const
const stop = (servers[serverKind as keyof typeof servers] ?? serveGrpcJs)(Number(values.grpc), () =>
  createServer((_req, res) => res.end(String(process.pid))).listen(Number(values.admin), "127.0.0.1")
)
process.once("SIGTERM", stop)
