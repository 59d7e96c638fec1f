// The live gRPC server (layers/grpc/GrpcServer.ts) at the edges a chaos soak found, with raw node:http2 and TCP
// clients: a caller's cancel while its request is still arriving is counted CANCELLED (it was INTERNAL, which
// inflates the node-side failure alert), and a shutdown does not wait its grace for connections that run no
// call (ones that never spoke HTTP/2 held it 5 s), and says what the grace cut when it cuts.

import * as http from "node:http"
import * as http2 from "node:http2"
import type { AddressInfo } from "node:net"
import * as grpc from "@grpc/grpc-js"
import { Effect, Layer, Logger, ManagedRuntime } from "effect"
import { afterEach, describe, expect, it } from "vitest"
import { GenerateRequest } from "../../src/gen/cgn/agent/v1/agent.ts"
import { layerWith as grpcLayerWith } from "../../src/layers/grpc/GrpcServer.ts"
import { GrpcServer } from "../../src/services/grpc/GrpcServer.ts"
import { frameMessage } from "../../src/services/grpc/Wire.ts"
import { Metrics } from "../../src/services/observability/Metrics.ts"
import { layerTest as metricsLayerTest } from "../../src/testing/Metrics.ts"
import { agentDeps } from "../support/agentDeps.ts"
import { pollUntil } from "../support/poll.ts"
import { type StalledKind, stalledClient } from "../support/stalledClients.ts"

const GENERATE = "/cgn.agent.v1.Agent/Generate"
const request = () => Buffer.from(GenerateRequest.encode(GenerateRequest.fromPartial({ prompt: "x" })).finish())

const cleanups: Array<() => Promise<void> | void> = []
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c()
})

/** An engine that takes requests and never answers: a Generate on it runs until cut. */
const hangingEngine = async () => {
  const received: Array<http.IncomingMessage> = []
  const server = http.createServer((req) => received.push(req))
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  cleanups.push(() => {
    server.closeAllConnections()
    server.close()
  })
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, received }
}

const startAgent = async (
  engineUrl: string,
  shutdownGraceMs: number,
  agent?: { readonly max_inflight: number; readonly max_queue: number }
) => {
  const logs: Array<string> = []
  const logger = Logger.make(({ logLevel, message }) =>
    logs.push(
      `${logLevel} ${[message]
        .flat()
        .map((m) => (typeof m === "string" ? m : JSON.stringify(m)))
        .join(" ")}`
    )
  )
  const { deps } = agentDeps(engineUrl, agent ? { agent } : {})
  const rt = ManagedRuntime.make(
    grpcLayerWith({ address: "127.0.0.1:0", shutdownGraceMs }).pipe(
      Layer.provideMerge(Layer.mergeAll(deps, metricsLayerTest)),
      Layer.provide(Logger.layer([logger]))
    )
  )
  let disposed = false
  const dispose = async () => {
    if (disposed) return
    disposed = true
    await rt.dispose()
  }
  cleanups.push(dispose)
  const { address } = await rt.runPromise(GrpcServer)
  const port = Number(address.split(":").at(-1))
  const requests = () =>
    rt.runPromise(
      Effect.flatMap(Metrics, (m) =>
        Effect.promise(async () => {
          const out: Record<string, number> = {}
          for (const v of (await m.requests.get()).values)
            out[String(v.labels.grpc_code)] = (out[String(v.labels.grpc_code)] ?? 0) + v.value
          return out
        })
      )
    )
  return { address, port, logs, requests, dispose }
}

/**
 * A Generate on its own connection whose request is left open (`body`, then nothing) and reset with
 * RST_STREAM CANCEL `resetAfterMs` after the server has its headers; resolves once the stream is closed.
 */
const cancelledMidRequest = (port: number, body: Uint8Array | undefined, resetAfterMs: number) =>
  new Promise<void>((resolve) => {
    const session = http2.connect(`http://127.0.0.1:${port}`)
    session.on("error", () => {})
    const req = session.request({ ":method": "POST", ":path": GENERATE, "content-type": "application/grpc" })
    req.on("error", () => {})
    req.on("close", () => {
      session.close()
      resolve()
    })
    if (body !== undefined) req.write(body)
    // A PING's answer comes after the server read the frames sent before it.
    session.once("connect", () =>
      session.ping(() => setTimeout(() => req.close(http2.constants.NGHTTP2_CANCEL), resetAfterMs))
    )
  })

describe("a caller's cancel before its request is complete", () => {
  it("is counted CANCELLED, not INTERNAL: headers only, half a message reset after 50 ms, and after 3 s", async () => {
    const engine = await hangingEngine()
    const agent = await startAgent(engine.url, 1_000)
    const half = frameMessage(request()).subarray(0, 7)
    await Promise.all([
      cancelledMidRequest(agent.port, undefined, 50),
      cancelledMidRequest(agent.port, half, 50),
      cancelledMidRequest(agent.port, half, 3_000)
    ])
    const counted = await pollUntil("the three calls counted", async () => {
      const r = await agent.requests()
      return (r.CANCELLED ?? 0) + (r.INTERNAL ?? 0) >= 3 ? r : undefined
    })
    expect(counted).toEqual({ CANCELLED: 3 })
    expect(engine.received).toEqual([])
  }, 20_000)

  it("a request that really ends inside a message (no reset) is still INTERNAL, and counted so", async () => {
    const engine = await hangingEngine()
    const agent = await startAgent(engine.url, 1_000)
    const status = await new Promise<string | undefined>((resolve) => {
      const session = http2.connect(`http://127.0.0.1:${agent.port}`)
      session.on("error", () => {})
      const req = session.request({ ":method": "POST", ":path": GENERATE, "content-type": "application/grpc" })
      let code: string | undefined
      req.on("response", (h) => (code = h["grpc-status"] as string | undefined))
      req.on("error", () => {})
      req.on("close", () => {
        session.close()
        resolve(code)
      })
      req.end(frameMessage(request()).subarray(0, 7))
    })
    expect(status).toBe(String(grpc.status.INTERNAL))
    expect(await agent.requests()).toEqual({ INTERNAL: 1 })
  })
})

describe("the gRPC server's connections", () => {
  it("advertise a concurrent-stream limit of twice what admission holds (max_inflight + max_queue), at least 4096", async () => {
    const engine = await hangingEngine()
    const agent = await startAgent(engine.url, 1_000, { max_inflight: 1500, max_queue: 1000 })
    const session = http2.connect(`http://127.0.0.1:${agent.port}`)
    session.on("error", () => {})
    cleanups.push(() => session.destroy())
    await new Promise((resolve) => session.once("remoteSettings", resolve))
    expect(session.remoteSettings.maxConcurrentStreams).toBe(5000)
  })
})

describe("the gRPC server's shutdown", () => {
  it("takes well under its grace with connections that run no call open: never spoke HTTP/2, or idle, and not reading", async () => {
    const grace = 3_000
    const engine = await hangingEngine()
    const agent = await startAgent(engine.url, grace)
    const kinds: Array<StalledKind> = ["nothing", "half-preface", "settled"]
    const stalled = await Promise.all(Array.from({ length: 12 }, (_, i) => stalledClient(agent.port, kinds[i % 3]!)))
    for (const s of stalled) cleanups.push(() => void s.destroy())
    const idle = http2.connect(`http://127.0.0.1:${agent.port}`)
    idle.on("error", () => {})
    cleanups.push(() => idle.destroy())
    await new Promise((resolve) => idle.once("remoteSettings", resolve))
    const began = performance.now()
    await agent.dispose()
    expect(performance.now() - began).toBeLessThan(grace / 3)
    expect(agent.logs.filter((l) => l.includes("gRPC close"))).toEqual([])
  })

  it("logs what the grace cut: the sessions and the calls still running", async () => {
    const grace = 300
    const engine = await hangingEngine()
    const agent = await startAgent(engine.url, grace)
    const client = new grpc.Client(agent.address, grpc.credentials.createInsecure())
    cleanups.push(() => client.close())
    const call = client.makeServerStreamRequest(
      GENERATE,
      (b: Buffer) => b,
      (b) => b,
      request()
    )
    call.on("data", () => {})
    call.on("error", () => {})
    await pollUntil("the engine has the request", () => engine.received.length === 1, 10_000, 10)
    const began = performance.now()
    await agent.dispose()
    expect(performance.now() - began).toBeGreaterThanOrEqual(grace - 10)
    expect(agent.logs.filter((l) => l.includes("gRPC close"))).toEqual([
      `Warn gRPC close: connections still open after the grace; cut ${JSON.stringify({ grace_ms: grace, sessions: 1, calls: 1 })}`
    ])
  })
})
