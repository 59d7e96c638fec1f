// An engine that closes a connection under a request it had not begun to answer (llama-server closes a streamed
// answer's connection without saying so; behind an unnamed openai_compat, undici may reuse that connection before the
// FIN arrives): the call fails UNAVAILABLE, retryable by the router, and is never sent again by the agent. A closed
// connection with no answer cannot say whether the engine read the request: a whole answer or a prefill leg sends
// nothing until it is done, and an engine that died working on it reads the same (Go's net/http sends a written POST
// again only with an Idempotency-Key, src/net/http/transport.go shouldRetryRequest). Made certain here by a node:net
// server that answers the first request on a connection and closes the connection, unanswered, at the next one.
import * as net from "node:net"
import { Cause, Effect, Exit } from "effect"
import { Status } from "nice-grpc-common"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { layerFromPlan } from "../../src/layers/engine/EngineClient.ts"
import type { LaunchPlan } from "../../src/services/engine/Engine.ts"
import { type ChunkSink, EngineClient, EngineError, type JsonObject } from "../../src/services/engine/EngineClient.ts"
import { engineFailure } from "../../src/services/grpc/GrpcStatus.ts"

/** One request the server read: its connection (numbered from 1 in accept order), its place on it, two headers. */
interface Seen {
  readonly conn: number
  readonly nth: number
  readonly connection: string | undefined
  readonly id: string | undefined
}

const chunk = { id: "c", choices: [{ index: 0, text: "a" }] }
const sse = (): string => {
  const events = `data: ${JSON.stringify(chunk)}\n\ndata: [DONE]\n\n`
  const size = Buffer.byteLength(events).toString(16)
  return `HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n${size}\r\n${events}\r\n0\r\n\r\n`
}
const whole = (): string => {
  const body = JSON.stringify({ id: "w", choices: [{ index: 0, text: "b" }] })
  return `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`
}

let server: net.Server
let port = 0
let conns = 0
const seen: Array<Seen> = []
const sockets = new Set<net.Socket>()

beforeAll(async () => {
  server = net.createServer((socket) => {
    const conn = ++conns
    let nth = 0
    let buf = Buffer.alloc(0)
    sockets.add(socket)
    socket.on("close", () => sockets.delete(socket))
    socket.on("error", () => undefined)
    socket.on("data", (d) => {
      buf = Buffer.concat([buf, d])
      for (;;) {
        const end = buf.indexOf("\r\n\r\n")
        if (end === -1) return
        const headers = new Map<string, string>()
        for (const line of buf.subarray(0, end).toString("latin1").split("\r\n").slice(1)) {
          const colon = line.indexOf(":")
          headers.set(line.slice(0, colon).trim().toLowerCase(), line.slice(colon + 1).trim())
        }
        const length = Number(headers.get("content-length") ?? "0")
        if (buf.length < end + 4 + length) return
        buf = buf.subarray(end + 4 + length)
        nth++
        const id = headers.get("x-request-id")
        seen.push({ conn, nth, connection: headers.get("connection"), id })
        // the race made certain: a later request on a connection finds it closed, nothing answered
        if (nth > 1 || id === "hangup") {
          socket.destroy()
          return
        }
        socket.write(headers.get("accept") === "text/event-stream" ? sse() : whole())
      }
    })
  })
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r))
  port = (server.address() as net.AddressInfo).port
})
afterAll(async () => {
  for (const s of sockets) s.destroy()
  await new Promise<void>((r) => server.close(() => r()))
})

const plan = (): LaunchPlan => {
  const base = `http://127.0.0.1:${port}`
  return {
    kind: "openai_compat",
    spawns: false,
    argv: [],
    env: {},
    baseUrl: base,
    host: "127.0.0.1",
    port,
    probe: { kind: "http", url: `${base}/health` },
    metrics: undefined,
    kvEvents: undefined,
    servedModel: "m",
    requestModel: "m"
  }
}

/** What one call gave its sink: the objects, and how many times it was told the request was written. */
interface Took {
  readonly chunks: Array<JsonObject>
  sent: number
}

/** Calls in order through one client (one Agent), each `[id, stream]`; each call's sink record and failure if any. */
const calls = (list: ReadonlyArray<readonly [string, boolean]>) =>
  Effect.runPromise(
    Effect.gen(function* () {
      const c = yield* EngineClient
      const out: Array<{ took: Took; error: EngineError | undefined }> = []
      for (const [id, stream] of list) {
        const took: Took = { chunks: [], sent: 0 }
        const sink: ChunkSink = {
          onChunks: (objects) => {
            took.chunks.push(...objects)
            return true
          },
          onSent: () => {
            took.sent++
          }
        }
        const exit = yield* Effect.exit(c.streamTo("/v1/completions", { prompt: "p" }, { requestId: id, stream }, sink))
        const error = Exit.isSuccess(exit) ? undefined : Cause.squash(exit.cause)
        if (error !== undefined && !(error instanceof EngineError)) throw error
        out.push({ took, error })
      }
      return out
    }).pipe(Effect.provide(layerFromPlan(plan())))
  )

const fromHere = () => {
  seen.length = 0
  conns = 0
}

describe("a request lost to a closed connection before any answer: failed, never sent again", () => {
  it("on a reused connection: UNAVAILABLE 'other side closed', nothing reached the sink, the server saw it once", async () => {
    fromHere()
    const ids = ["a", "b", "c", "d", "e", "f"]
    for (const stream of [true, false]) {
      fromHere()
      const out = await calls(ids.map((id) => [id, stream] as const))
      // every call reached the server exactly once, in order
      expect(
        seen.map((s) => s.id),
        `stream: ${stream}`
      ).toEqual(ids)
      // which calls met a reused, closed connection is undici's pool's choice: read from the server's log
      const lost = new Set(seen.filter((s) => s.nth > 1).map((s) => s.id))
      expect(lost.size, `stream: ${stream}`).toBeGreaterThan(0)
      out.forEach((o, i) => {
        const id = ids[i] as string
        if (lost.has(id)) {
          expect(o.error?.message, id).toContain("other side closed")
          expect(engineFailure(o.error as EngineError).code, id).toBe(Status.UNAVAILABLE)
          expect(o.took.chunks, id).toEqual([])
        } else {
          expect(o.error, id).toBeUndefined()
          expect(o.took.chunks.length, id).toBe(1)
        }
      })
    }
  })

  it("on a fresh connection: the same, the server saw it once", async () => {
    for (const stream of [true, false]) {
      fromHere()
      const [o] = await calls([["hangup", stream]])
      expect(o?.error?.message, `stream: ${stream}`).toContain("other side closed")
      expect(o?.took.chunks).toEqual([])
      expect(engineFailure(o?.error as EngineError).code, `stream: ${stream}`).toBe(Status.UNAVAILABLE)
      expect(seen, `stream: ${stream}`).toEqual([{ conn: 1, nth: 1, connection: "keep-alive", id: "hangup" }])
    }
  })
})
