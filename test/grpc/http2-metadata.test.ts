// Request metadata on the agent's gRPC server (layers/grpc/http2): limited on bytes, as HTTP/2's
// SETTINGS_MAX_HEADER_LIST_SIZE counts them (name + value + 32 per field), never on a field count. Node's
// default, 128 fields, reset a call with 125 metadata entries (RST_STREAM ENHANCE_YOUR_CALM) before the server
// saw it: grpc-js reported RESOURCE_EXHAUSTED "Bandwidth exhausted or memory limit exceeded". Past the byte
// limit (headerLimits.ts) that one stream is reset, the connection's other calls go on, and the limit is
// advertised in SETTINGS so that a client can keep to it.

import * as http2 from "node:http2"
import * as grpc from "@grpc/grpc-js"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { ServerCall } from "../../src/layers/grpc/http2/Call.ts"
import { MAX_HEADER_LIST_BYTES } from "../../src/layers/grpc/http2/headerLimits.ts"
import { Http2GrpcServer } from "../../src/layers/grpc/http2/Server.ts"
import { frameMessage } from "../../src/services/grpc/Wire.ts"

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
type Done = (e: null, v: Buffer) => void
/** Per call the handler ran: the value of the last metadata entry the test sent (`x-md-last`). */
const seen: Array<string | undefined> = []
const rejected: Array<[string, number]> = []
const server = new Http2GrpcServer({
  maxReceiveMessageLength: 1024,
  onRejected: (p, f) => {
    rejected.push([p, f.code])
    return f
  }
})
server.addService({ echo }, {
  echo: (call: ServerCall<Buffer, Buffer>, done: Done) => {
    seen.push(call.metadata.get("x-md-last").map(String)[0])
    done(null, call.request)
  }
} as unknown as grpc.UntypedServiceImplementation)

let port = 0
let authority = ""
let session: http2.ClientHttp2Session
let client: grpc.Client
beforeAll(async () => {
  port = await server.listen("127.0.0.1", 0)
  authority = `127.0.0.1:${port}`
  // Node's client refuses, on its side, to send a header block over 64,000 bytes unless told otherwise.
  session = http2.connect(`http://${authority}`, { maxSendHeaderBlockLength: 1 << 20 })
  session.on("error", () => {})
  await new Promise((resolve) => session.once("remoteSettings", resolve))
  client = new grpc.Client(authority, grpc.credentials.createInsecure())
})
afterAll(() => {
  client?.close()
  session?.destroy()
  server.destroy()
})

/** `n` metadata entries `x-md-<i>: v`, the last named `x-md-last`. */
const entries = (n: number): Record<string, string> =>
  Object.fromEntries(Array.from({ length: n }, (_, i) => [i === n - 1 ? "x-md-last" : `x-md-${i}`, "v"]))

/** Every field of a request, pseudo-headers included, as the client sends it. */
const request = (metadata: Record<string, string>): Record<string, string> => ({
  ":method": "POST",
  ":scheme": "http",
  ":authority": authority,
  ":path": "/t.T/Echo",
  "content-type": "application/grpc",
  te: "trailers",
  ...metadata
})

/** The size SETTINGS_MAX_HEADER_LIST_SIZE counts (RFC 9113 §6.5.2): each field's name and value plus 32. */
const listSize = (headers: Record<string, string>): number =>
  Object.entries(headers).reduce((n, [k, v]) => n + k.length + v.length + 32, 0)

/** One unary call on the shared raw session: its grpc-status, or the code the stream was reset with. */
const rawCall = (headers: Record<string, string>) =>
  new Promise<{ status: string | undefined; rstCode: number }>((resolve) => {
    const req = session.request(headers)
    req.on("error", () => {})
    let status: string | undefined
    req.on("response", (h) => {
      status ??= h["grpc-status"] as string | undefined
    })
    req.on("trailers", (t) => {
      status = t["grpc-status"] as string | undefined
    })
    req.on("close", () => resolve({ status, rstCode: req.rstCode ?? 0 }))
    req.resume()
    req.end(frameMessage(Buffer.from("hi")))
  })

const grpcJsCall = (metadata: Record<string, string>) => {
  const md = new grpc.Metadata()
  for (const [k, v] of Object.entries(metadata)) md.set(k, v)
  return new Promise<{ code: number; details: string }>((resolve) =>
    client.makeUnaryRequest("/t.T/Echo", raw, raw, Buffer.from("x"), md, (err) =>
      resolve(err ? { code: err.code, details: err.details } : { code: 0, details: "" })
    )
  )
}

/** `metadata` with `x-md-last` padded so that the whole request counts exactly `size` bytes. */
const sized = (size: number): Record<string, string> => {
  const base = listSize(request({ "x-md-last": "" }))
  return { "x-md-last": "w".repeat(size - base) }
}

describe("request metadata: a limit on bytes, not on fields", () => {
  it("serves a call with 200 metadata entries, raw and from grpc-js (Node's default reset it: more than 128 fields)", async () => {
    expect(await rawCall(request(entries(200)))).toEqual({ status: "0", rstCode: 0 })
    expect(seen.at(-1)).toBe("v")
    expect(await grpcJsCall(entries(200))).toEqual({ code: 0, details: "" })
    expect(seen.at(-1)).toBe("v")
    // As many fields as the byte limit allows: 1,500 entries of ~41 bytes each.
    const many = request(entries(1500))
    expect(listSize(many)).toBeLessThan(MAX_HEADER_LIST_BYTES)
    expect(await rawCall(many)).toEqual({ status: "0", rstCode: 0 })
  })

  it("advertises the byte limit in SETTINGS: a request of exactly that size is served, one byte more is reset", async () => {
    expect(session.remoteSettings.maxHeaderListSize).toBe(MAX_HEADER_LIST_BYTES)
    const atLimit = request(sized(MAX_HEADER_LIST_BYTES))
    expect(listSize(atLimit)).toBe(MAX_HEADER_LIST_BYTES)
    expect(await rawCall(atLimit)).toEqual({ status: "0", rstCode: 0 })
    expect(seen.at(-1)).toBe(atLimit["x-md-last"])
    const handled = seen.length
    const before = rejected.length
    const over = await rawCall(request(sized(MAX_HEADER_LIST_BYTES + 1)))
    expect(over).toEqual({ status: undefined, rstCode: http2.constants.NGHTTP2_ENHANCE_YOUR_CALM })
    // Reset by Node before the server saw the call: no handler ran, nothing was rejected by the server.
    expect(seen.length).toBe(handled)
    expect(rejected.length).toBe(before)
  })

  it("past the limit only that call fails (RESOURCE_EXHAUSTED in grpc-js); the connection's other calls go on", async () => {
    // Two 40,000-byte fields: 80 KB, past the limit, each field short of nghttp2's 64 KiB per-field bound.
    const big = { "x-md-a": "a".repeat(40_000), "x-md-last": "b".repeat(40_000) }
    const inFlight = rawCall(request(entries(3)))
    expect((await rawCall(request(big))).rstCode).toBe(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM)
    expect(await inFlight).toEqual({ status: "0", rstCode: 0 })
    expect(await rawCall(request(entries(3)))).toEqual({ status: "0", rstCode: 0 })
    expect(session.closed || session.destroyed).toBe(false)
    expect((await grpcJsCall(big)).code).toBe(grpc.status.RESOURCE_EXHAUSTED)
    expect(await grpcJsCall(entries(3))).toEqual({ code: 0, details: "" })
  })
})
