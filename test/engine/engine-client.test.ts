// The live EngineClient over real loopback HTTP: first against a tiny node:http server this file controls
// (exact splits, resets, truncation, disconnect on abort), then against the engine simulator per flavor.
// The controlled server picks its behaviour from the request's X-Request-Id (the client sends it verbatim).
// First of all, `complete` as derived from the one primitive, and the tests' Stream reader (streamOf), on the
// scripted test double.
import { spawn } from "node:child_process"
import * as fs from "node:fs"
import * as http from "node:http"
import type { AddressInfo } from "node:net"
import * as net from "node:net"
import { Cause, Effect, Exit, Fiber, Layer, Result, Stream } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { decodeConfigObject, layerFromObject } from "../../src/layers/config/Config.ts"
import { engineFor } from "../../src/layers/engine/backends/index.ts"
import * as EngineClientLive from "../../src/layers/engine/EngineClient.ts"
import { layerFromPlan } from "../../src/layers/engine/EngineClient.ts"
import { planLayer } from "../../src/layers/engine/EnginePlan.ts"
import type { LaunchPlan, MetricNames } from "../../src/services/engine/Engine.ts"
import {
  type CompletionPath,
  complete,
  EngineClient,
  type EngineClientService,
  EngineError,
  type JsonObject,
  type RequestOptions
} from "../../src/services/engine/EngineClient.ts"
import * as EngineClientTest from "../../src/testing/EngineClient.ts"
import {
  EngineClientRecorder,
  type EngineScript,
  HIGH_WATER_OBJECTS,
  streamOf,
  textChunk
} from "../../src/testing/EngineClient.ts"
import { pollUntil } from "../support/poll.ts"
import { freePort } from "../support/ports.ts"
import { type SimHandle, startSim } from "../support/sim.ts"

/** A client with the two reads these tests use: `stream` (the Stream reader, streamOf) and `complete`. */
const withReads = (c: EngineClientService) => ({
  ...c,
  stream: streamOf(c),
  complete: (path: CompletionPath, body: JsonObject, options?: RequestOptions) => complete(c, path, body, options)
})
type TestClient = ReturnType<typeof withReads>

describe("complete and the Stream reader derive from the transport (on the scripted double)", () => {
  const scripted = (script: EngineScript) =>
    Effect.gen(function* () {
      return { client: withReads(yield* EngineClient), recorder: yield* EngineClientRecorder }
    }).pipe(Effect.provide(EngineClientTest.layerTest(script)))

  it("a slow pull past the high-water mark gets every object in order (the sink pauses the transport)", async () => {
    const chunks = Array.from({ length: HIGH_WATER_OBJECTS * 3 }, (_, i) => textChunk(String(i)))
    const out = await Effect.runPromise(
      Effect.flatMap(scripted({ chunks }), ({ client }) =>
        Stream.runCollect(Stream.mapEffect(client.stream("/v1/completions", { prompt: "p" }), Effect.succeed))
      )
    )
    expect(Array.from(out)).toEqual(chunks)
  })

  it("complete asks the transport for a whole answer; stream's failure after its objects", async () => {
    const streamError = new EngineError({ reason: "Stream", message: "cut" })
    const { whole, streamed, requests } = await Effect.runPromise(
      Effect.flatMap(scripted({ completion: { id: "whole" }, chunks: [textChunk("a")], streamError }), (s) =>
        Effect.all({
          whole: s.client.complete("/v1/completions", { prompt: "p" }, { requestId: "r" }),
          streamed: Effect.exit(Stream.runCollect(s.client.stream("/v1/completions", { prompt: "p" }))),
          requests: s.recorder.requests
        })
      )
    )
    expect(whole).toEqual({ id: "whole" })
    expect(Exit.isFailure(streamed) && Cause.squash(streamed.cause)).toBe(streamError)
    expect(requests.map((r) => [r.kind, r.options])).toEqual([
      ["complete", { requestId: "r" }],
      ["stream", undefined]
    ])
  })
})

const planFor = (baseUrl: string, metrics?: { url: string; names: MetricNames }): LaunchPlan => ({
  kind: "vllm",
  spawns: true,
  argv: [],
  env: {},
  baseUrl,
  host: "127.0.0.1",
  port: Number(new URL(baseUrl).port),
  probe: { kind: "http", url: `${baseUrl}/health` },
  metrics,
  kvEvents: undefined,
  servedModel: "served",
  requestModel: "engine-model"
})

const withClient = <A, E>(f: (c: TestClient) => Effect.Effect<A, E>) =>
  Effect.gen(function* () {
    return yield* f(withReads(yield* EngineClient))
  })

const run = <A>(plan: LaunchPlan, f: (c: TestClient) => Effect.Effect<A, EngineError>) =>
  Effect.runPromise(Effect.exit(withClient(f)).pipe(Effect.provide(layerFromPlan(plan))))

const failure = <A>(exit: Exit.Exit<A, EngineError>): EngineError => {
  if (Exit.isSuccess(exit)) throw new Error(`expected a failure, got ${JSON.stringify(exit.value)}`)
  const e = Cause.findErrorOption(exit.cause)
  if (e._tag === "None") throw new Error(`expected an EngineError, got ${Cause.pretty(exit.cause)}`)
  return e.value
}

const success = <A>(exit: Exit.Exit<A, EngineError>): A => {
  if (Exit.isFailure(exit)) throw new Error(`expected success, got ${Cause.pretty(exit.cause)}`)
  return exit.value
}

const chunk = (i: number) => `data: {"id":"c","choices":[{"index":0,"delta":{"content":"t${i}"}}]}\n\n`
const tick = () => new Promise<void>((r) => setImmediate(r))

/** Resolves when `pred` holds (the shared bounded poll, every 5 ms). */
const until = async (pred: () => boolean, ms = 5_000): Promise<void> => {
  await pollUntil("condition", pred, ms, 5)
}

describe("EngineClient against a controlled server", () => {
  let server: http.Server
  let base: string
  const seen: Array<{ path: string; headers: http.IncomingHttpHeaders; body: string }> = []
  const sockets = new Set<unknown>()
  let closedEarly = 0
  let openStreams = 0

  const handlers: Record<string, (req: http.IncomingMessage, res: http.ServerResponse) => void | Promise<void>> = {
    "/v1/chat/completions": async (req, res) => {
      const mode = req.headers["x-request-id"]
      if (mode === "http400") {
        res.writeHead(400, { "content-type": "application/json" })
        res.end('{"error":{"message":"bad max_tokens","type":"BadRequestError","param":null,"code":400}}')
        return
      }
      if (mode === "reset") {
        req.socket.destroy()
        return
      }
      if (mode === "broken-close") {
        // an answer the server closes its connection after (llama-server's streams), ended by a FIN mid-body: what a
        // killed engine's kernel sends
        res.writeHead(200, { "content-type": "text/event-stream", connection: "close" })
        res.write(chunk(0))
        await tick()
        req.socket.end()
        return
      }
      if (mode === "noheaders") return // never answers; the client's header timeout must fire
      if (mode === "big") {
        // 4 MiB of events written at once: the client must pause and resume the socket, losing nothing.
        const pad = "x".repeat(2000)
        for (let i = 0; i < 2000; i++) res.write(`data: {"i":${i},"pad":"${pad}"}\n\n`)
        res.end("data: [DONE]\n\n")
        return
      }
      res.writeHead(200, { "content-type": "text/event-stream" })
      if (mode === "split") {
        // Every byte in its own write, CRLF endings, comments in between.
        const text = `${`: keepalive 1/2\r\n\r\n${chunk(0)}${chunk(1)}`.replaceAll("\n", "\r\n")}data: [DONE]\r\n\r\n`
        for (const b of Buffer.from(text)) {
          res.write(Buffer.from([b]))
          await tick()
        }
        res.end()
        return
      }
      if (mode === "midstream") {
        res.end(
          `${chunk(0)}data: {"error":{"message":"engine died","type":"InternalServerError","code":500}}\n\ndata: [DONE]\n\n`
        )
        return
      }
      if (mode === "truncated") {
        res.end(chunk(0))
        return
      }
      if (mode === "broken") {
        res.write(chunk(0))
        await tick()
        req.socket.destroy()
        return
      }
      if (mode === "endless") {
        openStreams++
        let i = 0
        const timer = setInterval(() => res.write(chunk(i++)), 2)
        res.on("close", () => {
          clearInterval(timer)
          openStreams--
          if (!res.writableFinished) closedEarly++
        })
        return
      }
      res.end(`${chunk(0)}${chunk(1)}${chunk(2)}data: [DONE]\n\n`)
    },
    "/v1/completions": (req, res) => {
      const mode = req.headers["x-request-id"]
      if (mode === "slow") {
        openStreams++
        res.on("close", () => {
          openStreams--
          if (!res.writableFinished) closedEarly++
        })
        return
      }
      if (mode === "big") {
        res.writeHead(200, { "content-type": "application/json" })
        res.end(JSON.stringify({ id: "big", text: "y".repeat(1_000_000) }))
        return
      }
      if (mode === "endless500" || mode === "endless200") {
        // A body that never ends (a proxy's page, a wedged engine): the client must stop reading it.
        openStreams++
        res.writeHead(mode === "endless500" ? 500 : 200, { "content-type": "text/plain" })
        let open = true
        res.on("close", () => {
          open = false
          openStreams--
          if (!res.writableFinished) closedEarly++
        })
        const piece = "z".repeat(64 * 1024)
        const more = (): void => {
          while (open && res.write(piece));
          if (open) res.once("drain", more)
        }
        more()
        return
      }
      if (mode === "mlx404") {
        res.writeHead(404, { "content-type": "application/json" })
        res.end('{"error":"Model not found"}')
        return
      }
      res.writeHead(200, { "content-type": "application/json" })
      res.end('{"id":"x","object":"text_completion","choices":[{"index":0,"text":"hi","finish_reason":"stop"}]}')
    },
    "/metrics": (_req, res) => {
      res.writeHead(200, { "content-type": "text/plain" })
      res.end(
        'vllm:num_requests_running{model_name="m"} 2\nvllm:num_requests_waiting{model_name="m"} 1\nvllm:gpu_cache_usage_perc 0.5\n'
      )
    }
  }

  beforeAll(async () => {
    server = http.createServer((req, res) => {
      let body = ""
      req.setEncoding("utf8")
      req.on("data", (d: string) => {
        body += d
      })
      req.on("end", () => {
        seen.push({ path: req.url ?? "", headers: req.headers, body })
        const h = handlers[req.url ?? ""]
        if (h === undefined) {
          res.writeHead(404).end("no route")
          return
        }
        void h(req, res)
      })
    })
    server.on("connection", (s) => sockets.add(s))
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r))
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  })
  afterAll(async () => {
    server.closeAllConnections()
    await new Promise((r) => server.close(r))
  })

  const collect = (mode: string | undefined, extra?: Record<string, string>) =>
    run(planFor(base), (c) =>
      Stream.runCollect(
        c.stream("/v1/chat/completions", { model: "served", messages: [] }, { requestId: mode ?? "plain", ...extra })
      )
    )

  it("streams every data object until [DONE], with the body rewritten and the headers sent", async () => {
    const exit = await collect(undefined, { traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" })
    const chunks = success(exit) as ReadonlyArray<JsonObject>
    expect(chunks.map((c) => (c.choices as Array<{ delta: { content: string } }>)[0]?.delta.content)).toEqual([
      "t0",
      "t1",
      "t2"
    ])
    const req = seen.findLast((s) => s.headers["x-request-id"] === "plain")
    expect(req?.headers.traceparent).toBe("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    expect(req?.headers.accept).toBe("text/event-stream")
    // The client owns model, stream and stream_options: a stream always asks for usage.
    expect(JSON.parse(req?.body ?? "{}")).toEqual({
      model: "engine-model",
      messages: [],
      stream: true,
      stream_options: { include_usage: true }
    })
  })

  it("pins a data-parallel rank in the engine's header for it (vLLM: X-data-parallel-rank); others send none", async () => {
    const pinned = (plan: LaunchPlan, id: string) =>
      run(plan, (c) =>
        Stream.runCollect(c.stream("/v1/chat/completions", { messages: [] }, { requestId: id, dataParallelRank: 1 }))
      )
    success(await pinned(planFor(base), "rank-vllm"))
    expect(seen.findLast((s) => s.headers["x-request-id"] === "rank-vllm")?.headers["x-data-parallel-rank"]).toBe("1")
    success(await pinned({ ...planFor(base), kind: "llama_cpp" }, "rank-llama"))
    const llama = seen.findLast((s) => s.headers["x-request-id"] === "rank-llama")
    expect(llama).toBeDefined()
    expect(llama?.headers["x-data-parallel-rank"]).toBeUndefined()
  })

  it("survives a byte-by-byte split with CRLF and comment lines", async () => {
    const chunks = success(await collect("split")) as ReadonlyArray<JsonObject>
    expect(chunks).toHaveLength(2)
  })

  it("a mid-stream error object ends the stream with reason Stream and the engine's message", async () => {
    const e = failure(await collect("midstream"))
    expect([e.reason, e.message, e.status, e.engineType]).toEqual(["Stream", "engine died", 500, "InternalServerError"])
  })

  it("an error status is Http with the normalized body", async () => {
    const e = failure(await collect("http400"))
    expect([e.reason, e.status, e.message, e.engineType]).toEqual(["Http", 400, "bad max_tokens", "BadRequestError"])
  })

  // the engine had the request (read whole by the handler that resets): it broke off, as one killed mid-prefill does,
  // not an engine never reached ("engine unreachable", cgn-engine-reason Connect, read as such: P/D review F5)
  it("a connection reset after the request was written, before any answer, is Stream, not Connect", async () => {
    const e = failure(await collect("reset"))
    expect([e.reason, e.message]).toEqual(["Stream", expect.stringMatching(/other side closed|ECONNRESET/)])
    // a whole answer too (a prefill leg, which has no headers until its engine is done)
    const whole = failure(
      await run(planFor(base), (c) =>
        c.complete("/v1/chat/completions", { model: "served", messages: [] }, { requestId: "reset" })
      )
    )
    expect(whole.reason).toBe("Stream")
  })

  it("a body that ends without [DONE] is Stream (truncated)", async () => {
    const e = failure(await collect("truncated"))
    expect(e.reason).toBe("Stream")
    expect(e.message).toContain("truncated")
  })

  it("a connection broken mid-body is Stream", async () => {
    const e = failure(await collect("broken"))
    expect(e.reason).toBe("Stream")
  })

  it("a connection the engine closes mid-body is said as such, not as an HTTP parser's words", async () => {
    const e = failure(await collect("broken-close"))
    expect([e.reason, e.message]).toEqual([
      "Stream",
      "stream truncated: the engine closed the connection before the end of its answer"
    ])
  })

  it("no response headers within the stream header timeout is Timeout", async () => {
    const exit = await Effect.runPromise(
      Effect.exit(
        withClient((c) => Stream.runCollect(c.stream("/v1/chat/completions", {}, { requestId: "noheaders" })))
      ).pipe(Effect.provide(layerFromPlan(planFor(base), { streamHeadersTimeoutMs: 200 })))
    )
    expect(failure(exit).reason).toBe("Timeout")
  })

  // A listener whose process is blocked accepts nothing: with its accept queue full, the kernel drops further SYNs
  // and a connect waits. No connection at all is an unreachable engine (UNAVAILABLE, retry elsewhere); it was
  // Timeout, DEADLINE_EXCEEDED, as if the engine had taken the request and not answered in time.
  it("no connection within the connect timeout is Connect, not Timeout", async () => {
    // Blocks at once in the listen callback, its port printed first (a write to a pipe is synchronous on Linux).
    const script =
      "const s=require('net').createServer();s.listen({port:0,host:'127.0.0.1',backlog:1},()=>{" +
      "console.log(s.address().port);Atomics.wait(new Int32Array(new SharedArrayBuffer(4)),0,0,30000)})"
    const child = spawn(process.execPath, ["-e", script], { stdio: ["ignore", "pipe", "ignore"] })
    const exited = new Promise((resolve) => child.once("exit", resolve))
    const fillers: Array<net.Socket> = []
    try {
      const port = await new Promise<number>((resolve) => child.stdout.once("data", (d) => resolve(Number(String(d)))))
      for (let i = 0; i < 4; i++) fillers.push(net.connect(port, "127.0.0.1").on("error", () => undefined))
      // Full once it holds more than its backlog (Linux include/net/sock.h sk_acceptq_is_full: ack_backlog >
      // max_ack_backlog); /proc/net/tcp shows a listener's accept queue as its rx_queue (net/ipv4/tcp_ipv4.c
      // get_tcp4_sock). From then on every SYN to it is dropped, the client's below included.
      const local = `0100007F:${port.toString(16).toUpperCase().padStart(4, "0")}`
      await pollUntil("the listener's accept queue full", () =>
        fs
          .readFileSync("/proc/net/tcp", "utf8")
          .split("\n")
          .map((l) => l.trim().split(/\s+/))
          .some(
            ([, addr, , st, queues]) => addr === local && st === "0A" && Number.parseInt(queues!.split(":")[1]!, 16) > 1
          )
      )
      const exit = await Effect.runPromise(
        Effect.exit(withClient((c) => Stream.runCollect(c.stream("/v1/chat/completions", {})))).pipe(
          Effect.provide(layerFromPlan(planFor(`http://127.0.0.1:${port}`), { connectTimeoutMs: 300 }))
        )
      )
      expect([failure(exit).reason, failure(exit).message]).toEqual([
        "Connect",
        expect.stringMatching(/^UND_ERR_CONNECT_TIMEOUT: /)
      ])
    } finally {
      for (const f of fillers) f.destroy()
      child.kill("SIGKILL")
      await exited
    }
  }, 20_000)

  it("connection refused is Connect", async () => {
    const port = await freePort()
    const exit = await run(planFor(`http://127.0.0.1:${port}`), (c) =>
      Stream.runCollect(c.stream("/v1/chat/completions", {}))
    )
    expect(failure(exit).reason).toBe("Connect")
  })

  it("closing the stream early (take) aborts the request: the server sees the disconnect", async () => {
    const before = closedEarly
    const taken = await run(planFor(base), (c) =>
      Stream.runCollect(Stream.take(c.stream("/v1/chat/completions", {}, { requestId: "endless" }), 5))
    )
    expect(success(taken)).toHaveLength(5)
    await until(() => closedEarly === before + 1 && openStreams === 0)
  })

  it("interrupting the consuming fiber aborts the request", async () => {
    const before = closedEarly
    let got = 0
    const fiber = Effect.runFork(
      withClient((c) =>
        Stream.runForEach(c.stream("/v1/chat/completions", {}, { requestId: "endless" }), () =>
          Effect.sync(() => {
            got++
          })
        )
      ).pipe(Effect.provide(layerFromPlan(planFor(base))))
    )
    await until(() => got >= 3)
    await Effect.runPromise(Fiber.interrupt(fiber))
    await until(() => closedEarly === before + 1 && openStreams === 0)
  })

  it("streams that end at [DONE] leave the connection for reuse", async () => {
    const plan = planFor(base)
    const connectionsBefore = sockets.size
    const exit = await run(plan, (c) =>
      Effect.forEach([1, 2, 3, 4, 5, 6], () =>
        Stream.runCollect(c.stream("/v1/chat/completions", {}, { requestId: "plain" }))
      )
    )
    expect(success(exit)).toHaveLength(6)
    // undici opens a second socket for the second request (seen with bare undici too), then reuses them.
    expect(sockets.size - connectionsBefore).toBeLessThanOrEqual(2)
  })

  it("to an engine that closes streamed connections (llama-server), streams ask for none and each gets its own", async () => {
    const plan = { ...planFor(base), kind: "llama_cpp" as const }
    const connectionsBefore = sockets.size
    const exit = await run(plan, (c) =>
      Effect.forEach([1, 2, 3], () => Stream.runCollect(c.stream("/v1/chat/completions", {}, { requestId: "own" })))
    )
    expect(success(exit)).toHaveLength(3)
    expect(seen.filter((s) => s.headers["x-request-id"] === "own").map((s) => s.headers.connection)).toEqual([
      "close",
      "close",
      "close"
    ])
    expect(sockets.size - connectionsBefore).toBe(3)
    // vLLM keeps them
    await run(planFor(base), (c) => Stream.runCollect(c.stream("/v1/chat/completions", {}, { requestId: "kept" })))
    expect(seen.findLast((s) => s.headers["x-request-id"] === "kept")?.headers.connection).toBe("keep-alive")
  })

  it("complete: the whole object; body rewritten with stream false", async () => {
    const exit = await run(planFor(base), (c) =>
      c.complete("/v1/completions", { model: "x", prompt: "p" }, { requestId: "c1" })
    )
    expect(success(exit).id).toBe("x")
    const req = seen.findLast((s) => s.headers["x-request-id"] === "c1")
    expect(JSON.parse(req?.body ?? "{}")).toEqual({ model: "engine-model", prompt: "p", stream: false })
  })

  it("streamTo with stream false hands the sink the one response object (what complete derives from)", async () => {
    const reads: Array<ReadonlyArray<JsonObject>> = []
    const exit = await run(planFor(base), (c) =>
      c.streamTo(
        "/v1/completions",
        { prompt: "p" },
        { requestId: "c1", stream: false },
        { onChunks: (chunks) => reads.push(chunks) > 0 }
      )
    )
    success(exit)
    expect(reads.map((r) => r.map((o) => o.id))).toEqual([["x"]])
    const req = seen.findLast((s) => s.headers["x-request-id"] === "c1")
    expect(JSON.parse(req?.body ?? "{}")).toMatchObject({ model: "engine-model", prompt: "p", stream: false })
  })

  it("complete: a body larger than the stream buffer limit arrives whole", async () => {
    const exit = await run(planFor(base), (c) => c.complete("/v1/completions", {}, { requestId: "big" }))
    expect((success(exit).text as string).length).toBe(1_000_000)
  })

  it("a slow consumer of a large stream gets every event in order (pause and resume)", async () => {
    const exit = await run(planFor(base), (c) =>
      Stream.runFold(
        Stream.mapEffect(c.stream("/v1/chat/completions", {}, { requestId: "big" }), (obj) =>
          Effect.as(Effect.yieldNow, obj)
        ),
        () => 0,
        (n, obj) => {
          if (obj.i !== n) throw new Error(`event ${String(obj.i)} where ${n} was due`)
          return n + 1
        }
      )
    )
    expect(success(exit)).toBe(2000)
  })

  it("complete: an mlx-style error body", async () => {
    const e = failure(await run(planFor(base), (c) => c.complete("/v1/completions", {}, { requestId: "mlx404" })))
    expect([e.reason, e.status, e.message]).toEqual(["Http", 404, "Model not found"])
  })

  it("complete: a body that never ends is not read whole: an error status keeps its message, a 200 is Protocol", async () => {
    const before = closedEarly
    const e500 = failure(
      await run(planFor(base), (c) => c.complete("/v1/completions", {}, { requestId: "endless500" }))
    )
    expect([e500.reason, e500.status, e500.message]).toEqual(["Http", 500, expect.stringMatching(/^z{500}…$/)])
    const e200 = failure(
      await run(planFor(base), (c) => c.complete("/v1/completions", {}, { requestId: "endless200" }))
    )
    expect([e200.reason, e200.message]).toEqual(["Protocol", expect.stringMatching(/larger than \d+ bytes/)])
    await until(() => closedEarly === before + 2 && openStreams === 0)
  }, 20_000)

  it("a sink that throws ends the exchange Protocol with the reason (not a stream the engine broke off)", async () => {
    const e = failure(
      await run(planFor(base), (c) =>
        c.streamTo(
          "/v1/chat/completions",
          {},
          { requestId: "plain" },
          {
            onChunks: () => {
              throw new TypeError("cannot read this")
            }
          }
        )
      )
    )
    expect([e.reason, e.message]).toEqual(["Protocol", "the engine's chunk could not be read: cannot read this"])
  })

  it("complete: interruption aborts the request", async () => {
    const before = closedEarly
    const fiber = Effect.runFork(
      withClient((c) => c.complete("/v1/completions", {}, { requestId: "slow" })).pipe(
        Effect.provide(layerFromPlan(planFor(base)))
      )
    )
    await until(() => openStreams === 1)
    await Effect.runPromise(Fiber.interrupt(fiber))
    await until(() => closedEarly === before + 1 && openStreams === 0)
  })

  it("load scrapes the metrics URL; without metrics it answers undefined without I/O", async () => {
    const names: MetricNames = {
      running: ["vllm:num_requests_running"],
      waiting: ["vllm:num_requests_waiting"],
      kvUsage: ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"]
    }
    const exit = await run(planFor(base, { url: `${base}/metrics`, names }), (c) => c.load)
    expect(success(exit)).toEqual({ running: 2, waiting: 1, kvUsage: 0.5 })
    const port = await freePort()
    const none = await run(planFor(`http://127.0.0.1:${port}`), (c) => c.load)
    expect(success(none)).toEqual({ running: undefined, waiting: undefined, kvUsage: undefined })
  })
})

// Against the simulator, with the plan rendered the way the agent renders it (argv, metrics names, requestModel).
const flavors = ["vllm", "sglang", "llama_cpp", "mlx"] as const

for (const flavor of flavors) {
  describe(`EngineClient against the simulator (${flavor})`, () => {
    let sim: SimHandle | undefined
    let plan: LaunchPlan

    const simState = async (): Promise<{ running: number; aborted: number; ready: boolean; served: number }> => {
      const r = await fetch(`${plan.baseUrl}/sim/state`)
      return (await r.json()) as { running: number; aborted: number; ready: boolean; served: number }
    }
    const setFaults = async (faults: Record<string, unknown>) => {
      const r = await fetch(`${plan.baseUrl}/sim/faults`, { method: "POST", body: JSON.stringify(faults) })
      expect(r.status).toBe(200)
    }

    beforeAll(async () => {
      const port = await freePort()
      const decoded = decodeConfigObject(
        { engine: { kind: flavor, url: `http://127.0.0.1:${port}` }, models: { m: { hf_repo: "org/m" } } },
        undefined
      )
      if (Result.isFailure(decoded)) throw new Error(decoded.failure.message)
      plan = engineFor(flavor).render(decoded.success)
      sim = await startSim({
        flavor,
        args: [...plan.argv.slice(1), "--sim-itl", "2ms", "--sim-mode", "random", "--sim-seed", "7"]
      })
      await pollUntil("simulator ready", async () => (await simState()).ready, 10_000, 10)
    })
    afterAll(async () => {
      await sim?.stop()
    })

    const chat = {
      model: "whatever-the-router-sent",
      messages: [{ role: "user", content: "hello there" }],
      max_tokens: 4
    }

    it("streams chat chunks until [DONE]; the model field is rewritten for the engine", async () => {
      const exit = await run(plan, (c) => Stream.runCollect(c.stream("/v1/chat/completions", chat)))
      const chunks = success(exit) as ReadonlyArray<JsonObject>
      const text = chunks
        .flatMap((c) => (c.choices as Array<{ delta?: { content?: string } }>).map((ch) => ch.delta?.content ?? ""))
        .join("")
      expect(text.length).toBeGreaterThan(0)
      expect(chunks.some((c) => c.usage !== undefined && c.usage !== null)).toBe(true)
    })

    it("the configured layer: the plan rendered once from Config (planLayer)", async () => {
      const exit = await Effect.runPromise(
        Effect.exit(withClient((c) => c.complete("/v1/completions", { prompt: "hello", max_tokens: 2 }))).pipe(
          Effect.provide(
            EngineClientLive.layer.pipe(
              Layer.provide(planLayer),
              Layer.provide(
                layerFromObject({ engine: { kind: flavor, url: plan.baseUrl }, models: { m: { hf_repo: "org/m" } } })
              )
            )
          )
        )
      )
      expect((success(exit).choices as Array<{ text: string }>)[0]?.text.length).toBeGreaterThan(0)
    })

    it("complete: a whole text completion", async () => {
      const exit = await run(plan, (c) => c.complete("/v1/completions", { model: "x", prompt: "hello", max_tokens: 3 }))
      const body = success(exit)
      expect((body.choices as Array<{ text: string }>)[0]?.text.length).toBeGreaterThan(0)
    })

    it("load gives the flavor's signals", async () => {
      const load = success(await run(plan, (c) => c.load))
      if (plan.metrics === undefined)
        expect(load).toEqual({ running: undefined, waiting: undefined, kvUsage: undefined })
      else {
        expect(load.running).toBe(0)
        expect(load.waiting).toBe(0)
        if (plan.metrics.names.kvUsage.length > 0) expect(load.kvUsage).toBeTypeOf("number")
      }
    })

    it("error normalization: http400, http500, midstream, reset", async () => {
      try {
        await setFaults({ errorRate: 1, errorKind: "http400" })
        const e400 = failure(await run(plan, (c) => Stream.runCollect(c.stream("/v1/chat/completions", chat))))
        expect([e400.reason, e400.status]).toEqual(["Http", 400])
        expect(e400.message.length).toBeGreaterThan(0)
        expect(e400.message).not.toContain("{")
        if (flavor !== "mlx") expect(e400.engineType).toBeTypeOf("string")

        await setFaults({ errorKind: "http500" })
        const e500 = failure(await run(plan, (c) => c.complete("/v1/chat/completions", chat)))
        expect([e500.reason, e500.status]).toEqual(["Http", 500])

        await setFaults({ errorKind: "midstream" })
        const mid = failure(await run(plan, (c) => Stream.runCollect(c.stream("/v1/chat/completions", chat))))
        // mlx-lm has no error event: its stream just ends, without data: [DONE] (src/sim/faultReply.ts).
        const midMessage =
          flavor === "mlx" ? "stream truncated: body ended without [DONE]" : "simulated mid-stream engine failure"
        expect([mid.reason, mid.message]).toEqual(["Stream", midMessage])

        await setFaults({ errorKind: "reset" })
        const reset = failure(await run(plan, (c) => Stream.runCollect(c.stream("/v1/chat/completions", chat))))
        expect(reset.reason).toBe("Stream")
        const resetWhole = failure(await run(plan, (c) => c.complete("/v1/chat/completions", chat)))
        expect(["Connect", "Stream"]).toContain(resetWhole.reason)
      } finally {
        await setFaults({ errorRate: 0 })
      }
    })

    it("cancellation frees the slot: running back to 0, aborted incremented", async () => {
      const before = await simState()
      let got = 0
      const long = { ...chat, max_tokens: 4_000 }
      const fiber = Effect.runFork(
        withClient((c) =>
          Stream.runForEach(c.stream("/v1/chat/completions", long), () =>
            Effect.sync(() => {
              got++
            })
          )
        ).pipe(Effect.provide(layerFromPlan(plan)))
      )
      await until(() => got >= 3)
      expect((await simState()).running).toBe(1)
      await Effect.runPromise(Fiber.interrupt(fiber))
      const after = await pollUntil(
        "slot freed",
        async () => {
          const s = await simState()
          return s.running === 0 && s.aborted === before.aborted + 1 ? s : undefined
        },
        5_000,
        10
      )
      expect(after.aborted).toBe(before.aborted + 1)
    })
  })
}
