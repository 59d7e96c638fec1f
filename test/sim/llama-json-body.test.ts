// The simulator's reading of a POST body (src/sim/jsonBody.ts) held to what the real llama-server was measured to
// answer (test/support/llamaBodyFacts.ts, measured with test/real/sim-differential-7.test.ts): cpp-httplib's bare 400
// for a multipart/form-data type without a usable boundary, nlohmann's 500 for a lone low surrogate escape. vLLM and
// SGLang read the body with Python's json, which takes a lone surrogate: the check is llama_cpp's alone.
import * as net from "node:net"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { BARE_400_TYPES, COMPLETION_BODY, JSON_READ_TYPES, LONE_LOW_SURROGATES } from "../support/llamaBodyFacts.ts"
import { errorText } from "../support/llamaChatFacts.ts"
import { getJson, pollUntil, type SimHandle, startSim } from "../support/sim.ts"
import { simGguf } from "../support/simModel.ts"

const ROUTES = ["/v1/completions", "/tokenize"]

const post = async (base: string, p: string, type: string, body: string) => {
  const r = await fetch(`${base}${p}`, { method: "POST", headers: { "content-type": type }, body })
  const h = r.headers
  return {
    status: r.status,
    type: h.get("content-type"),
    length: h.get("content-length"),
    connection: h.get("connection"),
    text: await r.text()
  }
}

describe("llama_cpp: a body it cannot read", () => {
  let sim: SimHandle
  beforeAll(async () => {
    sim = await startSim({ flavor: "llama_cpp", args: ["-m", simGguf("tiny.gguf"), "--sim-mode", "random"] })
  })
  afterAll(async () => {
    await sim?.stop()
  })

  it.each(BARE_400_TYPES)("%s: cpp-httplib's bare 400, the connection closed", async (type) => {
    for (const p of ROUTES)
      expect([p, await post(sim.url, p, type, COMPLETION_BODY)]).toEqual([
        p,
        { status: 400, type: null, length: "0", connection: "close", text: "" }
      ])
  })

  it.each(JSON_READ_TYPES)("%s: read as JSON (the media type matched case-sensitively)", async (type) => {
    for (const p of ROUTES) expect([p, (await post(sim.url, p, type, COMPLETION_BODY)).status]).toEqual([p, 200])
  })

  it("after the bare 400 the server closes the socket, though the request asked to keep it", async () => {
    const socket = net.connect(sim.port, "127.0.0.1")
    const closed = new Promise<void>((r) => socket.on("close", () => r()))
    let answer = ""
    socket.on("data", (d) => {
      answer += d.toString()
    })
    socket.write(
      `POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\nContent-Type: ${BARE_400_TYPES[0]}\r\nContent-Length: ${COMPLETION_BODY.length}\r\n\r\n${COMPLETION_BODY}`
    )
    await closed
    expect(answer).toMatch(/^HTTP\/1\.1 400 /)
  })

  it.each(LONE_LOW_SURROGATES.map((f) => [f.body, f] as const))("%s: nlohmann's 500, word for word", async (_, f) => {
    for (const p of ROUTES)
      expect([p, await post(sim.url, p, "application/json", f.body)]).toMatchObject([
        p,
        { status: 500, connection: "close", text: errorText(500, f.message) }
      ])
  })
})

describe("vLLM and SGLang read a lone surrogate (Python's json.loads takes it): nlohmann's check is llama_cpp's", () => {
  const body = (model: string) => `{"model":"${model}","prompt":"a \\udc00 \\ud800","max_tokens":2}`
  it.each([
    ["vllm", ["serve", "org/m"], "org/m"],
    ["sglang", ["--model-path", "org/sg"], "org/sg"]
  ] as const)("%s", async (flavor, args, model) => {
    const sim = await startSim({ flavor, args })
    try {
      await pollUntil(
        async () => ((await getJson(`${sim.url}/sim/state`)).json as { ready: boolean }).ready || undefined
      )
      const r = await post(sim.url, "/v1/completions", "application/json", body(model))
      expect([r.status, r.text]).toEqual([200, expect.stringContaining('"choices"')])
    } finally {
      await sim.stop()
    }
  })
})
