// agent.request_read_timeout on the agent's gRPC server (layers/grpc/http2/Server.ts, requestReadTimeoutMs), with raw
// node:http2 requests over loopback: a request that has not arrived whole within the bound of its headers (one that
// dribbles bytes, as a slowloris client does) is ended RESOURCE_EXHAUSTED before its handler runs; one that arrives
// whole is served and its call is not ended later by the bound; 0 never ends one.

import * as http2 from "node:http2"
import * as grpc from "@grpc/grpc-js"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { ServerCall } from "../../src/layers/grpc/http2/Call.ts"
import { Http2GrpcServer } from "../../src/layers/grpc/http2/Server.ts"
import { frameMessage } from "../../src/services/grpc/Wire.ts"
import { startAgent } from "../support/grpcAgent.ts"

const BOUND_MS = 200
const raw = (b: Buffer) => b
const method = (name: string, responseStream: boolean): grpc.MethodDefinition<Buffer, Buffer> => ({
  path: `/t.T/${name}`,
  requestStream: false,
  responseStream,
  requestSerialize: raw,
  requestDeserialize: raw,
  responseSerialize: raw,
  responseDeserialize: raw
})
const service = { echo: method("Echo", false), hang: method("Hang", true) } satisfies grpc.ServiceDefinition
type Done = (e: null, v?: Buffer) => void

/** A server with the bound at `ms`; what its handlers ran and what it ended before them. */
const start = async (ms: number) => {
  const handled: Array<string> = []
  const rejected: Array<[string, number]> = []
  const hanging = new Set<ServerCall>()
  const server = new Http2GrpcServer({
    maxReceiveMessageLength: 8192,
    requestReadTimeoutMs: ms,
    onRejected: (path, f) => {
      rejected.push([path, f.code])
      return f
    }
  })
  server.addService(service, {
    echo: (call: ServerCall<Buffer, Buffer>, done: Done) => {
      handled.push("echo")
      done(null, call.request)
    },
    // Runs until the test ends it: a call whose request arrived, open past the bound.
    hang: (call: ServerCall) => {
      handled.push("hang")
      hanging.add(call)
      call.on("cancelled", () => hanging.delete(call))
    }
  } as unknown as grpc.UntypedServiceImplementation)
  const port = await server.listen("127.0.0.1", 0)
  const session = http2.connect(`http://127.0.0.1:${port}`)
  session.on("error", () => {})
  return { server, session, handled, rejected, hanging }
}

interface Ended {
  readonly status: string | undefined
  readonly reason: string | undefined
  readonly afterMs: number
}

/** A request on `session`: its status (response headers or trailers) and when it came, once the stream closes. */
const request = (session: http2.ClientHttp2Session, path: string, headers: http2.OutgoingHttpHeaders = {}) => {
  const startedAt = performance.now()
  const req = session.request({ ":method": "POST", ":path": path, "content-type": "application/grpc", ...headers })
  req.on("error", () => {})
  let status: string | undefined
  let reason: string | undefined
  let statusAt: number | undefined
  const take = (h: http2.IncomingHttpHeaders): void => {
    if (h["grpc-status"] === undefined || status !== undefined) return
    status = h["grpc-status"] as string
    reason = h["cgn-reason"] as string | undefined
    statusAt = performance.now()
  }
  req.on("response", take)
  req.on("trailers", take)
  req.resume()
  const ended = new Promise<Ended>((resolve) =>
    req.on("close", () => resolve({ status, reason, afterMs: (statusAt ?? performance.now()) - startedAt }))
  )
  return { req, ended, status: () => status }
}

/** `p`, or a failure naming `what` after 5 s: a bound that never ends the request fails fast, not at the test's timeout. */
const within = <A>(p: Promise<A>, what: string): Promise<A> => {
  let timer: NodeJS.Timeout | undefined
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not within 5 s`)), 5_000)
  })
  return Promise.race([p, late]).finally(() => clearTimeout(timer))
}

/** Writes one byte of `bytes` every 20 ms until the stream closes: a request that keeps arriving, never whole. */
const dribble = (req: http2.ClientHttp2Stream, bytes: Uint8Array): void => {
  let i = 0
  const tick = setInterval(() => {
    if (req.closed || req.destroyed || i >= bytes.length) clearInterval(tick)
    else req.write(bytes.subarray(i, ++i))
  }, 20)
  req.once("close", () => clearInterval(tick))
}

describe("agent.request_read_timeout (requestReadTimeoutMs)", () => {
  let bounded: Awaited<ReturnType<typeof start>>
  let never: Awaited<ReturnType<typeof start>>
  beforeAll(async () => {
    bounded = await start(BOUND_MS)
    never = await start(0)
  })
  afterAll(() => {
    for (const s of [bounded, never]) {
      s.session.destroy()
      s.server.destroy()
    }
  })

  it("ends a request that dribbles its bytes at the bound, RESOURCE_EXHAUSTED, before its handler runs", async () => {
    const before = bounded.rejected.length
    // A call whose request arrived whole, running before the slow one's headers and after its bound.
    const running = request(bounded.session, "/t.T/Hang")
    running.req.end(frameMessage(Buffer.from("whole")))
    // Not ended by the bound on the other server either: started first, still waiting once the bounded one ended.
    const unbounded = request(never.session, "/t.T/Echo")
    unbounded.req.write(frameMessage(Buffer.from("slow")).subarray(0, 3))
    const slow = request(bounded.session, "/t.T/Echo")
    dribble(slow.req, frameMessage(Buffer.alloc(1000, 1)))
    const ended = await within(slow.ended, "the dribbling request's end")
    expect(ended.status).toBe(String(grpc.status.RESOURCE_EXHAUSTED))
    expect(ended.reason).toBe("request_read_timeout")
    expect(ended.afterMs).toBeGreaterThanOrEqual(BOUND_MS - 5)
    expect(bounded.rejected.slice(before)).toEqual([["/t.T/Echo", grpc.status.RESOURCE_EXHAUSTED]])
    expect(bounded.handled.filter((h) => h === "echo")).toEqual([])
    // The call that arrived whole runs on: its handler ran, it is neither cancelled nor given a status.
    expect(bounded.handled).toContain("hang")
    expect(bounded.hanging.size).toBe(1)
    expect(running.status()).toBeUndefined()
    for (const call of bounded.hanging) call.end()
    expect((await running.ended).status).toBe("0")
    // 0: never. The request that stopped halfway is still waiting; its rest then makes it served.
    expect(unbounded.status()).toBeUndefined()
    expect(never.rejected).toEqual([])
    unbounded.req.end(frameMessage(Buffer.from("slow")).subarray(3))
    expect((await unbounded.ended).status).toBe("0")
    expect(never.handled).toEqual(["echo"])
  })

  it("serves a request that arrives whole", async () => {
    const r = request(bounded.session, "/t.T/Echo")
    r.req.end(frameMessage(Buffer.from("x")))
    expect((await r.ended).status).toBe("0")
  })

  it("leaves a caller's shorter grpc-timeout to end the call DEADLINE_EXCEEDED", async () => {
    const r = request(bounded.session, "/t.T/Echo", { "grpc-timeout": "50m" })
    r.req.write(frameMessage(Buffer.from("never whole")).subarray(0, 3))
    expect((await r.ended).status).toBe(String(grpc.status.DEADLINE_EXCEEDED))
  })
})

describe('a request_read_timeout past setTimeout\'s limit (2^31-1 ms; the config takes "30d")', () => {
  it("is no bound at all: Node would fire such a timer at once, ending every call as it began", async () => {
    const long = await start(30 * 24 * 3600 * 1000)
    try {
      const r = request(long.session, "/t.T/Echo")
      const body = frameMessage(Buffer.from("late"))
      r.req.write(body.subarray(0, 3))
      // a slow caller: the rest 50 ms later (an overflowed timer fires after 1 ms)
      setTimeout(() => r.req.end(body.subarray(3)), 50)
      expect((await within(r.ended, "the slow request's end")).status).toBe("0")
      expect(long.rejected).toEqual([])
    } finally {
      long.session.destroy()
      long.server.destroy()
    }
  })
})

describe("agent.request_read_timeout reaches the agent's own gRPC server (GrpcServer.ts)", () => {
  it("a Generate whose announced message never arrives ends RESOURCE_EXHAUSTED at the configured bound", async () => {
    // README: a request not arrived whole within [agent].request_read_timeout ends RESOURCE_EXHAUSTED
    // (request_read_timeout); without the key reaching the server such a caller holds its stream until its own deadline.
    const agent = await startAgent("http://127.0.0.1:9", "vllm", { role: "both", request_read_timeout: "300ms" })
    const session = http2.connect(`http://${agent.address}`)
    session.on("error", () => {})
    try {
      const r = request(session, "/cgn.agent.v1.Agent/Generate", { te: "trailers" })
      r.req.write(Buffer.from([0, 0, 0, 0, 10])) // a 10-byte message announced, never sent
      const ended = await within(r.ended, "the unfinished Generate's end")
      expect(ended.status).toBe(String(grpc.status.RESOURCE_EXHAUSTED))
      expect(ended.reason).toBe("request_read_timeout")
      // and said: no handler ran to log why (a soak saw refusals counted with nothing in the log)
      expect(agent.logs.filter((l) => l.message.startsWith("gRPC call refused before it ran"))).toEqual([
        {
          message: expect.stringContaining("gRPC call refused before it ran: "),
          fields: {
            method: "/cgn.agent.v1.Agent/Generate",
            code: "RESOURCE_EXHAUSTED",
            reason: "request_read_timeout",
            suppressed: 0
          }
        }
      ])
    } finally {
      session.destroy()
      await agent.close()
    }
  })
})
