// Idle connections as each engine's HTTP server keeps them (src/sim/keepAlive.ts): uvicorn (vLLM, SGLang) closes
// one timeout_keep_alive seconds after its last answer (vLLM: VLLM_HTTP_TIMEOUT_KEEP_ALIVE, default 5; SGLang 5)
// and says nothing of it in its headers; mlx-lm's http.server (HTTP/1.0) closes every connection after its answer.
import * as net from "node:net"
import { afterAll, describe, expect, it } from "vitest"
import { vllmKeepAliveS } from "../../src/sim/keepAlive.ts"
import { type SimHandle, startSim } from "../support/sim.ts"

const started: Array<SimHandle> = []
afterAll(() => Promise.all(started.map((s) => s.stop(200))))
const start = async (flavor: "vllm" | "sglang" | "mlx", args: Array<string>, env: Record<string, string> = {}) => {
  const s = await startSim({ flavor, args, env })
  started.push(s)
  return s
}

/** One request on a fresh connection: the answer's head, and when the server closed the connection after it. */
const exchange = (port: number, path: string, extra = ""): Promise<{ head: string; closedAfterMs: number }> =>
  new Promise((resolve, reject) => {
    const socket = net.connect(port, "127.0.0.1")
    let text = ""
    let answeredAt = 0
    socket.on("data", (d) => {
      text += d.toString()
      if (answeredAt === 0 && text.includes("\r\n\r\n")) answeredAt = performance.now()
    })
    socket.on("error", reject)
    socket.on("close", () =>
      resolve({ head: text.split("\r\n\r\n")[0] ?? "", closedAfterMs: performance.now() - answeredAt })
    )
    socket.write(`GET ${path} HTTP/1.1\r\nHost: x\r\n${extra}\r\n`)
  })

const headerNames = (head: string) =>
  head
    .split("\r\n")
    .slice(1)
    .map((l) => l.split(":")[0]?.toLowerCase())

describe("uvicorn's keep-alive", () => {
  it("vLLM: no Keep-Alive or Connection header; closed VLLM_HTTP_TIMEOUT_KEEP_ALIVE after the answer", async () => {
    const s = await start("vllm", ["serve", "m"], { VLLM_HTTP_TIMEOUT_KEEP_ALIVE: "1" })
    const { head, closedAfterMs } = await exchange(s.port, "/health")
    expect(head).toMatch(/^HTTP\/1\.1 200/)
    expect(headerNames(head)).not.toContain("keep-alive")
    expect(headerNames(head)).not.toContain("connection")
    expect(closedAfterMs).toBeGreaterThanOrEqual(950)
    expect(closedAfterMs).toBeLessThan(1_900)
  })

  it("SGLang: the same at its timeout_keep_alive=5", async () => {
    const s = await start("sglang", ["--model-path", "m"])
    const { head, closedAfterMs } = await exchange(s.port, "/v1/models")
    expect(head).toMatch(/^HTTP\/1\.1 200/)
    expect(headerNames(head)).not.toContain("keep-alive")
    expect(headerNames(head)).not.toContain("connection")
    expect(closedAfterMs).toBeGreaterThanOrEqual(4_950)
    expect(closedAfterMs).toBeLessThan(5_900)
  })

  it("a request that asks to close gets `connection: close` and a closed connection", async () => {
    const s = await start("vllm", ["serve", "m"])
    const { head, closedAfterMs } = await exchange(s.port, "/health", "Connection: close\r\n")
    expect(head.toLowerCase()).toContain("\r\nconnection: close")
    expect(closedAfterMs).toBeLessThan(500)
  })

  it("reads VLLM_HTTP_TIMEOUT_KEEP_ALIVE as vllm/envs.py does (default 5)", () => {
    expect([{}, { VLLM_HTTP_TIMEOUT_KEEP_ALIVE: "30" }].map(vllmKeepAliveS)).toEqual([5, 30])
  })
})

describe("mlx-lm's http.server", () => {
  it("closes the connection after its answer, saying so (HTTP/1.0's close, on node's HTTP/1.1 status line)", async () => {
    const s = await start("mlx", ["--model", "m"])
    const { head, closedAfterMs } = await exchange(s.port, "/health")
    expect(head).toMatch(/ 200 /)
    expect(headerNames(head)).not.toContain("keep-alive")
    // an HTTP/1.1 answer with no Connection header is one a client may send its next request on, where mlx-lm's
    // HTTP/1.0 answer is not
    expect(head.toLowerCase()).toContain("\r\nconnection: close")
    expect(closedAfterMs).toBeLessThan(500)
  })
})
