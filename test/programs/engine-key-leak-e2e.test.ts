// The built agent (`node dist/main.js run`), openai_compat with engine.api_key, in front of a server of this test's own
// that answers every completion 401 with "Incorrect API key provided: <the key>" (OpenAI's words; a hostile or
// echoing server): the key was in the call's gRPC status message and cgn-engine-message trailer, /readyz (open without
// the admin token), /status's health (NodeHealth) and the warnings of the agent's test completion. The engine's words
// are scrubbed where the EngineError is made (services/engine/EngineErrors.ts engineWords): the key is in none of
// them, the rest of the engine's words are. Requires dist/ (`npm run build`).
import * as http from "node:http"
import * as http2 from "node:http2"
import type { AddressInfo } from "node:net"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { GenerateRequest } from "../../src/gen/cgn/agent/v1/agent.ts"
import { type AgentHandle, killAllAgents, requireDist, startAgent } from "../support/agent.ts"
import { pollUntil } from "../support/poll.ts"
import { freePorts } from "../support/ports.ts"

const KEY = "sk-SUPERSECRETKEY-1234567890"
/** The key, and its first part (what a cut inside it would show). */
const LEAKS = [KEY, KEY.slice(0, 8)]
const WORDS = "Incorrect API key provided: <redacted>"

let engine: http.Server
let agent: AgentHandle

beforeAll(async () => {
  requireDist()
  engine = http.createServer((req, res) => {
    req.resume()
    req.on("end", () => {
      res.writeHead(req.url === "/v1/models" ? 200 : 401, { "content-type": "application/json" })
      res.end(
        JSON.stringify(
          req.url === "/v1/models"
            ? { object: "list", data: [{ id: "m", object: "model" }] }
            : {
                error: {
                  message: `Incorrect API key provided: ${KEY}. You can find your API key at https://example/keys.`,
                  type: "invalid_request_error",
                  code: "invalid_api_key"
                }
              }
        )
      )
    })
  })
  await new Promise<void>((resolve) => engine.listen(0, "127.0.0.1", resolve))
  const [grpcPort, adminPort] = (await freePorts(2)) as [number, number]
  agent = await startAgent({
    config: {
      agent: {
        listen_grpc: `127.0.0.1:${grpcPort}`,
        listen_admin: `127.0.0.1:${adminPort}`,
        node_id: "leak-1",
        state_dir: "state"
      },
      engine: {
        kind: "openai_compat",
        url: `http://127.0.0.1:${(engine.address() as AddressInfo).port}`,
        api_key: KEY,
        failed_calls_unhealthy: 2,
        stream_idle_timeout: "1s"
      },
      models: { m: { hf_repo: "org/m" } }
    }
  })
})

afterAll(async () => {
  await killAllAgents()
  engine.closeAllConnections()
  await new Promise<void>((resolve) => engine.close(() => resolve()))
})

/** One Generate over raw HTTP/2: the response headers and trailers as they came (every text the caller is sent). */
const generateRaw = (address: string): Promise<Record<string, unknown>> => {
  const msg = GenerateRequest.encode(GenerateRequest.fromPartial({ prompt: "a b c" })).finish()
  const frame = Buffer.alloc(5 + msg.length)
  frame.writeUInt32BE(msg.length, 1)
  frame.set(msg, 5)
  const session = http2.connect(`http://${address}`)
  return new Promise<Record<string, unknown>>((resolve, reject) => {
    const req = session.request({
      ":method": "POST",
      ":path": "/cgn.agent.v1.Agent/Generate",
      "content-type": "application/grpc",
      te: "trailers"
    })
    const seen: Record<string, unknown> = {}
    req.on("response", (h) => Object.assign(seen, h))
    req.on("trailers", (t) => Object.assign(seen, t))
    req.on("data", () => undefined)
    req.on("error", reject)
    req.on("close", () => resolve(seen))
    req.end(frame)
  }).finally(() => session.close())
}

const expectNoKey = (what: string, text: string) => {
  for (const leak of LEAKS) expect(text, `${what}: ${text}`).not.toContain(leak)
}

describe("an engine that answers 401 with the key in its message", () => {
  it("the key reaches no caller, /readyz, /status nor the log; the engine's other words do", async () => {
    for (let i = 0; i < 2; i++) {
      const end = await generateRaw(agent.grpcAddress)
      const message = decodeURIComponent(String(end["grpc-message"]))
      expect(end["grpc-status"], agent.tail()).toBe("13")
      expectNoKey("the call's status and trailers", `${JSON.stringify(end)} ${message}`)
      expect(message).toContain(WORDS)
      expect(String(end["cgn-engine-message"])).toContain(WORDS)
    }
    const readyz = await pollUntil(
      "/readyz says the engine fails calls",
      async () => {
        const res = await fetch(`${agent.adminUrl}/readyz`)
        const text = await res.text()
        return res.status === 503 && text.includes("engine failing calls") ? text : undefined
      },
      10_000
    )
    expectNoKey("/readyz", readyz)
    expect(readyz).toContain(WORDS)
    const status = await (await fetch(`${agent.adminUrl}/status`)).text()
    expectNoKey("/status", status)
    expect(status).toContain(WORDS)
    // the test completion the idle node sends (stream_idle_timeout) fails as the calls did, and says so
    await agent.waitForLine((l) => l.includes("the engine failed a test request") && l.includes(WORDS), 15_000)
    expectNoKey("the log", agent.stderrLines.join("\n"))
    expect((await agent.stop()).code).toBe(0)
  }, 60_000)
})
