// The keep-alive race of an engine that closes a streamed answer's connection without saying so (llama-server, as an
// unnamed openai_compat engine): undici reuses the idle connection and writes the next request before the engine's
// FIN arrives. Made certain here by a node:net server that answers the first request on a connection and closes the
// connection, unanswered, at the next request on it. The client sends such a request once more, on a new connection
// (golang/go src/net/http/transport.go shouldRetryRequest), and asks for `connection: close` on every later stream;
// a fresh connection closed without an answer is the engine's failure, not sent again.
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

/**
 * The server's log read against the calls made (their ids, in order): each request met by the race (`nth` > 1: a
 * reused connection, closed unanswered) is followed at once by the same call on a connection new to the log; every
 * other request is the next call. Which call meets the race is undici's pool's choice (a call made as the one before
 * it ends may find that one's connection still busy and open another), so it is read, not assumed: the indexes in
 * the log of the requests it met.
 */
const races = (ids: ReadonlyArray<string>): Array<number> => {
  const met: Array<number> = []
  let next = 0
  let newest = 0
  for (let k = 0; k < seen.length; k++) {
    const s = seen[k] as Seen
    if (s.nth > 1) {
      expect(s.id, `request ${k}`).toBe(ids[next++])
      const again = seen[k + 1]
      expect(again?.id, `the call after request ${k}`).toBe(s.id)
      expect(again?.nth, `request ${k + 1}`).toBe(1)
      expect(again?.conn, `request ${k + 1}: a connection new to the log`).toBeGreaterThan(newest)
      met.push(k)
    } else {
      if (seen[k - 1]?.nth !== undefined && (seen[k - 1] as Seen).nth > 1) {
        newest = Math.max(newest, s.conn)
        continue
      }
      expect(s.id, `request ${k}`).toBe(ids[next++])
    }
    newest = Math.max(newest, s.conn)
  }
  expect(next, "every call reached the server").toBe(ids.length)
  return met
}

describe("openai_compat unnamed: a request a reused connection lost before any answer is sent again", () => {
  it("a stream: sent once more on a new connection, each chunk and onSent once; later streams ask for close", async () => {
    fromHere()
    const ids = ["a", "b", "c", "d"]
    const out = await calls(ids.map((id) => [id, true] as const))
    expect(out.map((o) => o.error?.message)).toEqual(ids.map(() => undefined))
    for (const o of out) expect([o.took.chunks, o.took.sent]).toEqual([[chunk], 1])
    // from the request sent again on, every stream asks for close: the connections they open are not reused (one
    // left idle before, which the engine closed too, would meet the race once more, and be sent again so)
    const met = races(ids)
    expect(met.length).toBeGreaterThan(0)
    const at = met[0] as number
    expect(seen.slice(0, at + 1).map((s) => s.connection)).toEqual(seen.slice(0, at + 1).map(() => "keep-alive"))
    expect(seen.slice(at + 1).map((s) => s.connection)).toEqual(seen.slice(at + 1).map(() => "close"))
    expect(seen.length).toBe(ids.length + met.length)
  })

  it("a whole answer: sent once more on a new connection; later streams ask for close", async () => {
    fromHere()
    const list = [
      ["a", false],
      ["b", false],
      ["c", false],
      ["s", true]
    ] as const
    const out = await calls(list)
    expect(out.map((o) => o.error?.message)).toEqual(list.map(() => undefined))
    expect(out.map((o) => [o.took.chunks.length, o.took.sent])).toEqual(list.map(([, stream]) => [1, stream ? 1 : 0]))
    const met = races(list.map(([id]) => id))
    expect(met.length).toBeGreaterThan(0)
    // whole answers keep their connections; the stream after the race asks for close
    expect(seen.map((s) => [s.id, s.connection])).toEqual(
      seen.map((s) => [s.id, s.id === "s" ? "close" : "keep-alive"])
    )
  })

  it("a fresh connection closed without an answer is the engine's failure: UNAVAILABLE, not sent again", async () => {
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
