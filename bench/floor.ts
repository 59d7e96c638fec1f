// The floor: the least a Node gRPC-in, SSE-out relay must do, to read the agent's bench figures against
// (`node bench/relay.ts --agent-impl floor`). One grpc-js server with Agent.Generate only (the same generated
// protobuf encoders and grpc-js options as the agent), one undici Agent driven through `dispatch` (as the agent's
// EngineClient), SSE split on "\n", `JSON.parse` of each `data:` line, `choices[0].text` written as one delta per
// read, then a final message. Nothing else: no config, admission, metrics, spans, logs, watchdog, errors mapped
// or back-pressure. Whatever CPU or RSS the agent spends above this is the agent's own; what this spends above
// nginx is Node, grpc-js and undici.
// Usage: node bench/floor.ts --grpc PORT --admin PORT --engine URL   (GET /readyz on the admin port answers 200)
import { createServer } from "node:http"
import { parseArgs } from "node:util"
import * as grpc from "@grpc/grpc-js"
import { Agent, type Dispatcher } from "undici"
import { AgentDefinition, GenerateRequest, GenerateResponse } from "../src/gen/cgn/agent/v1/agent.ts"

const { values } = parseArgs({
  options: { grpc: { type: "string" }, admin: { type: "string" }, engine: { type: "string" } }
})
const engine = new URL(values.engine ?? "http://127.0.0.1:8000")
const pool = new Agent({ connections: null, pipelining: 1 })
const bytes = (u: Uint8Array): Buffer => Buffer.from(u.buffer, u.byteOffset, u.byteLength)

type Call = grpc.ServerWritableStream<GenerateRequest, GenerateResponse>

/** One engine stream relayed to one call: the undici handler. */
class Relay implements Dispatcher.DispatchHandler {
  private pending = ""
  private finish = "stop"
  private controller: Dispatcher.DispatchController | undefined
  private readonly call: Call
  constructor(call: Call) {
    this.call = call
    call.once("cancelled", () => this.controller?.abort(new Error("cancelled")))
  }
  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.controller = controller
  }
  onResponseStart(): void {}
  onResponseData(_c: Dispatcher.DispatchController, chunk: Buffer): void {
    this.pending += chunk.toString("utf8")
    let text = ""
    let tokens = 0
    let start = 0
    for (let nl = this.pending.indexOf("\n"); nl >= 0; nl = this.pending.indexOf("\n", start)) {
      const line = this.pending.slice(start, nl)
      start = nl + 1
      if (!line.startsWith("data: ") || line === "data: [DONE]") continue
      const choice = (JSON.parse(line.slice(6)) as { choices?: Array<{ text?: string; finish_reason?: string }> })
        .choices?.[0]
      if (choice?.finish_reason) this.finish = choice.finish_reason
      if (choice?.text) {
        text += choice.text
        tokens++
      }
    }
    this.pending = this.pending.slice(start)
    if (tokens > 0) this.call.write({ delta: { text, index: 0, tokens } })
  }
  onResponseEnd(): void {
    this.call.write({ final: { finishReason: this.finish, nodeId: "floor", requestId: "" } })
    this.call.end()
  }
  onResponseError(_c: Dispatcher.DispatchController, error: Error): void {
    this.call.destroy(error)
  }
}

const generate = (call: Call): void => {
  const body = JSON.stringify({
    model: call.request.model || "m",
    prompt: call.request.prompt,
    max_tokens: call.request.sampling?.maxTokens ?? 16,
    stream: true
  })
  pool.dispatch(
    {
      origin: engine.origin,
      path: "/v1/completions",
      method: "POST",
      headers: { "content-type": "application/json", accept: "text/event-stream" },
      body
    },
    new Relay(call)
  )
}

const server = new grpc.Server()
server.addService(
  {
    generate: {
      path: `/${AgentDefinition.fullName}/${AgentDefinition.methods.generate.name}`,
      requestStream: false,
      responseStream: true,
      requestSerialize: (m: GenerateRequest) => bytes(GenerateRequest.encode(m).finish()),
      requestDeserialize: (b: Buffer) => GenerateRequest.decode(b),
      responseSerialize: (m: GenerateResponse) => bytes(GenerateResponse.encode(m).finish()),
      responseDeserialize: (b: Buffer) => GenerateResponse.decode(b)
    }
  },
  { generate }
)
server.bindAsync(`127.0.0.1:${values.grpc}`, grpc.ServerCredentials.createInsecure(), (err) => {
  if (err !== null) throw err
  createServer((_req, res) => res.end("ok")).listen(Number(values.admin), "127.0.0.1")
})
process.once("SIGTERM", () => server.tryShutdown(() => process.exit(0)))
