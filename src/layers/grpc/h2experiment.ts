// EXPERIMENT (not for commit): Generate served on node:http2 with hand-written gRPC framing, to measure what
// grpc-js's server costs inside the agent.
import { EventEmitter } from "node:events"
import * as http2 from "node:http2"
import { GenerateRequest, GenerateResponse } from "../../gen/cgn/agent/v1/agent.ts"

const frame = (m: GenerateResponse): Buffer => {
  const body = GenerateResponse.encode(m).finish()
  const out = Buffer.allocUnsafe(5 + body.length)
  out[0] = 0
  out.writeUInt32BE(body.length, 1)
  out.set(body, 5)
  return out
}

class H2Call extends EventEmitter {
  cancelled = false
  private ended = false
  private status: { code: number; details?: string; metadata?: { getMap(): Record<string, unknown> } } = { code: 0 }
  readonly metadata: { get(k: string): Array<string> }
  private readonly stream: http2.ServerHttp2Stream
  readonly request: GenerateRequest
  constructor(stream: http2.ServerHttp2Stream, request: GenerateRequest, headers: http2.IncomingHttpHeaders) {
    super()
    this.stream = stream
    this.request = request
    this.metadata = { get: (k) => (typeof headers[k] === "string" ? [headers[k] as string] : []) }
    stream.on("drain", () => super.emit("drain"))
    stream.on("wantTrailers", () => {
      const t: Record<string, string> = { "grpc-status": String(this.status.code) }
      if (this.status.details) t["grpc-message"] = encodeURIComponent(this.status.details)
      const m = this.status.metadata?.getMap() ?? {}
      for (const k in m) t[k] = String(m[k])
      stream.sendTrailers(t)
    })
    stream.on("close", () => {
      if (!this.ended) {
        this.cancelled = true
        super.emit("cancelled", "cancelled")
      }
    })
  }
  write(m: GenerateResponse): boolean {
    return this.stream.write(frame(m))
  }
  end(): void {
    this.ended = true
    this.stream.end()
  }
  override emit(event: string | symbol, ...args: Array<unknown>): boolean {
    if (event === "error") {
      this.status = args[0] as never
      this.end()
      return true
    }
    return super.emit(event, ...args)
  }
}

export const serveH2 = (port: number, host: string, generate: (call: never) => void): http2.Http2Server => {
  const server = http2.createServer()
  server.on("stream", (stream, headers) => {
    const parts: Array<Buffer> = []
    stream.on("data", (c: Buffer) => parts.push(c))
    stream.once("end", () => {
      const req = GenerateRequest.decode(Buffer.concat(parts).subarray(5))
      stream.respond({ ":status": 200, "content-type": "application/grpc" }, { waitForTrailers: true })
      generate(new H2Call(stream, req, headers) as never)
    })
  })
  server.listen(port, host)
  return server
}
