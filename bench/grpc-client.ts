// The bench's lean gRPC client for Agent.Generate: one node:http2 session, the request framed by hand, each
// response message decoded with the generated decoder. It does what a router must (send the request, decode every
// message, read the status trailer) and nothing a library adds on top (channel state machine, interceptors,
// per-call abort plumbing, async iterators). It is the gRPC counterpart of the direct phase's undici client, so
// the agent's row is not charged for a client library's per-call cost: the load generator shares its core with
// the simulator, and nice-grpc over grpc-js costs several times more per call than undici (docs/bench.md, fifth
// session). `--grpc-client nice` keeps the library client to compare.
import * as http2 from "node:http2"
import { AgentDefinition, GenerateRequest, GenerateResponse } from "../src/gen/cgn/agent/v1/agent.ts"
import { frameMessage, MessageReader } from "../src/services/grpc/Wire.ts"

const PATH = `/${AgentDefinition.fullName}/${AgentDefinition.methods.generate.name}`

export interface LeanClient {
  /** One Generate call; `onMessage` sees each response in order; resolves at the trailers, rejects on a non-OK status. */
  generate(req: GenerateRequest, onMessage: (m: GenerateResponse) => void): Promise<void>
  close(): void
}

/** `settings`: the session's own, for a test to make them tight (bench/floor.ts's flow control). */
export const leanClient = (address: string, settings?: http2.Settings): LeanClient => {
  // Node's default HTTP/2 windows (64 KiB), as grpc-js's client: how much the agent may have in flight per stream.
  const session = http2.connect(`http://${address}`, settings === undefined ? {} : { settings })
  session.on("error", () => undefined)
  return {
    generate: (req, onMessage) =>
      new Promise((resolve, reject) => {
        const stream = session.request({
          ":method": "POST",
          ":path": PATH,
          "content-type": "application/grpc",
          te: "trailers"
        })
        const reader = new MessageReader(64 << 20)
        let status: string | undefined
        let message = ""
        stream.on("response", (headers) => {
          // A trailers-only response carries the status in the head.
          if (headers["grpc-status"] !== undefined) status = String(headers["grpc-status"])
        })
        stream.on("trailers", (trailers) => {
          status = String(trailers["grpc-status"])
          message = String(trailers["grpc-message"] ?? "")
        })
        stream.on("data", (chunk: Buffer) => {
          const out = reader.push(chunk)
          if (!Array.isArray(out)) return stream.close(http2.constants.NGHTTP2_CANCEL)
          for (const m of out) onMessage(GenerateResponse.decode(m.body))
        })
        stream.on("error", reject)
        stream.on("close", () =>
          status === "0" ? resolve() : reject(new Error(`grpc-status ${status ?? "none"} ${message}`))
        )
        stream.end(frameMessage(GenerateRequest.encode(req).finish()))
      }),
    close: () => session.close()
  }
}
