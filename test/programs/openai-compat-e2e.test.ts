// The built agent (`node dist/main.js run`) with `kind = "openai_compat"` in front of a small OpenAI-compatible SSE
// server of the test's own that ignores `stream_options.include_usage`, as some servers do:
// - the final message then carries no `usage` (proto3 presence): the agent has no tokenizer, so it reports no
//   counts of its own (it reported prompt_tokens 0 and its count of text chunks as completion_tokens);
// - a caller's grpc-timeout that the agent enforces itself (a raw HTTP/2 client that sends one and never cancels)
//   ends the call DEADLINE_EXCEEDED with `cgn-request-id` in its trailers, as every failure of an admitted call does.
// Requires dist/ (`npm run build`).
import * as http from "node:http"
import * as http2 from "node:http2"
import type { AddressInfo } from "node:net"
import type { Channel } from "nice-grpc"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { GenerateRequest, GenerateResponse } from "../../src/gen/cgn/agent/v1/agent.ts"
import { type AgentHandle, killAllAgents, requireDist, startAgent } from "../support/agent.ts"
import { agentClient, generate } from "../support/generate.ts"
import { pollUntil } from "../support/poll.ts"
import { freePorts } from "../support/ports.ts"

/** The prompt the test server answers with one chunk and then holds open (until the agent aborts it). */
const HOLD = "hold"
const chunk = (text: string, finish: string | null): string =>
  `data: ${JSON.stringify({ id: "c", object: "text_completion", model: "m", choices: [{ index: 0, text, finish_reason: finish }] })}\n\n`

let engine: http.Server
let agent: AgentHandle
const channels: Array<Channel> = []
/** The test server's engine requests: their bodies, and whether each one's response is over (ended or aborted). */
const requests: Array<{ body: Record<string, unknown>; closed: boolean }> = []

beforeAll(async () => {
  requireDist()
  engine = http.createServer((req, res) => {
    if (req.method === "GET" && req.url === "/v1/models") {
      res.writeHead(200, { "content-type": "application/json" })
      res.end(JSON.stringify({ object: "list", data: [{ id: "m", object: "model" }] }))
      return
    }
    let raw = ""
    req.on("data", (d: Buffer) => (raw += d.toString()))
    req.on("end", () => {
      const seen = { body: JSON.parse(raw) as Record<string, unknown>, closed: false }
      requests.push(seen)
      res.on("close", () => (seen.closed = true))
      res.writeHead(200, { "content-type": "text/event-stream" })
      if (seen.body.prompt === HOLD) {
        res.write(chunk("held", null))
        return
      }
      // No usage chunk, whatever stream_options asked for.
      res.end(`${chunk("one", null)}${chunk(" two", null)}${chunk(" three", "length")}data: [DONE]\n\n`)
    })
  })
  await new Promise<void>((resolve) => engine.listen(0, "127.0.0.1", resolve))
  const [grpcPort, adminPort] = (await freePorts(2)) as [number, number]
  agent = await startAgent({
    config: {
      agent: {
        listen_grpc: `127.0.0.1:${grpcPort}`,
        listen_admin: `127.0.0.1:${adminPort}`,
        node_id: "oc-1",
        state_dir: "state"
      },
      engine: { kind: "openai_compat", url: `http://127.0.0.1:${(engine.address() as AddressInfo).port}` },
      models: { m: { hf_repo: "org/m" } }
    }
  })
})

afterAll(async () => {
  for (const c of channels) c.close()
  await killAllAgents()
  engine.closeAllConnections()
  await new Promise<void>((resolve) => engine.close(() => resolve()))
})

describe("openai_compat in front of a server that reports no usage", () => {
  it("the final message carries no usage: the agent invents no counts", async () => {
    const { client, channel } = agentClient(agent.grpcAddress)
    channels.push(channel)
    const r = await generate(client, { prompt: "one two three four five", sampling: { maxTokens: 3 } }).done
    expect(r.error).toBeUndefined()
    expect(r.text()).toBe("one two three")
    // the agent asked for usage; the server ignored it
    expect(requests.at(-1)?.body.stream_options).toEqual({ include_usage: true })
    expect(r.final).toMatchObject({ finishReason: "length", nodeId: "oc-1" })
    expect(r.final?.usage).toBeUndefined()
    // an estimate of the completion remains the deltas' engine chunks (GenerateDelta.tokens)
    expect(r.tokens()).toBe(3)
    // and the operator sees such finals counted (the series is there from the start, at 0)
    const page = await (await fetch(`${agent.adminUrl}/metrics`)).text()
    expect(page).toMatch(/^cgn_agent_finals_without_usage_total\{model="m"\} 1$/m)
  })

  it("a grpc-timeout the agent enforces ends DEADLINE_EXCEEDED with the call's cgn-request-id in the trailers", async () => {
    const msg = GenerateRequest.encode(GenerateRequest.fromPartial({ prompt: HOLD, requestId: "r-deadline" })).finish()
    const frame = Buffer.alloc(5 + msg.length)
    frame.writeUInt32BE(msg.length, 1)
    frame.set(msg, 5)
    const session = http2.connect(`http://${agent.grpcAddress}`)
    try {
      const end = await new Promise<{ texts: Array<string>; trailers: http2.IncomingHttpHeaders | undefined }>(
        (resolve, reject) => {
          const req = session.request({
            ":method": "POST",
            ":path": "/cgn.agent.v1.Agent/Generate",
            "content-type": "application/grpc",
            te: "trailers",
            // This client never cancels: the deadline is the agent's to end.
            "grpc-timeout": "400m"
          })
          let buf = Buffer.alloc(0)
          const texts: Array<string> = []
          let trailers: http2.IncomingHttpHeaders | undefined
          req.on("data", (d: Buffer) => {
            buf = Buffer.concat([buf, d])
            while (buf.length >= 5 && buf.length >= 5 + buf.readUInt32BE(1)) {
              const n = buf.readUInt32BE(1)
              const m = GenerateResponse.decode(buf.subarray(5, 5 + n))
              if (m.delta !== undefined) texts.push(m.delta.text)
              buf = buf.subarray(5 + n)
            }
          })
          req.on("trailers", (t) => (trailers = t))
          req.on("error", reject)
          req.on("close", () => resolve({ texts, trailers }))
          req.end(frame)
        }
      )
      // it had streamed: the engine's first chunk went out before the deadline
      expect(end.texts).toEqual(["held"])
      expect(end.trailers).toMatchObject({
        "grpc-status": "4",
        "cgn-reason": "deadline_exceeded",
        "cgn-request-id": "r-deadline"
      })
      // and the engine request was aborted
      await pollUntil(
        "the held engine request to be aborted",
        () => requests.find((q) => q.body.prompt === HOLD)?.closed
      )
    } finally {
      session.close()
    }
  })
})
