// One Generate call's error paths end to end, through the real gRPC server and the live EngineClient, against a
// scripted engine whose answer each test picks by the prompt: every engine failure shape (error bodies, statuses,
// non-JSON and HTML bodies, broken and truncated streams, a 200 that is not an event stream, endless bodies),
// each ending with the status of GrpcStatus's table and the engine's message, never as a short successful answer;
// then the caller cancelling, or its deadline passing, in each phase of the call (queued in admission, waiting for
// the engine's headers, streaming), each stopping the engine request or never making it.
import * as http from "node:http"
import type { AddressInfo } from "node:net"
import * as grpc from "@grpc/grpc-js"
import { Effect, Layer, ManagedRuntime } from "effect"
import { ClientError, createChannel, createClient, type Metadata, Status } from "nice-grpc"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  type AgentClient,
  AgentDefinition,
  type GenerateFinal,
  GenerateRequest,
  GenerateResponse
} from "../../src/gen/cgn/agent/v1/agent.ts"
import { layer as admissionLayer } from "../../src/layers/grpc/Admission.ts"
import { GENERATE_PATH } from "../../src/layers/grpc/AgentService.ts"
import { layerWith as grpcLayerWith } from "../../src/layers/grpc/GrpcServer.ts"
import { Admission } from "../../src/services/grpc/Admission.ts"
import { GrpcServer } from "../../src/services/grpc/GrpcServer.ts"
import { agentDeps } from "../support/agentDeps.ts"
import { pollUntil } from "../support/poll.ts"

interface Agent {
  readonly address: string
  readonly client: AgentClient
  /** Calls waiting in admission for a slot. */
  queued(): Promise<number>
  close(): Promise<void>
}

/** The agent's real gRPC server (admission from [agent]) over the live EngineClient to `engineUrl`. */
const startAgent = async (engineUrl: string, agent: Record<string, unknown> = {}): Promise<Agent> => {
  const { config, deps } = agentDeps(engineUrl, { agent: { max_tokens_limit: 1000, ...agent } })
  const rt = ManagedRuntime.make(
    grpcLayerWith({ address: "127.0.0.1:0", shutdownGraceMs: 500 }).pipe(
      Layer.provideMerge(Layer.mergeAll(deps, admissionLayer.pipe(Layer.provide(config))))
    )
  )
  const server = await rt.runPromise(GrpcServer)
  const channel = createChannel(server.address)
  return {
    address: server.address,
    client: createClient(AgentDefinition, channel),
    queued: () => rt.runPromise(Effect.flatMap(Admission, (a) => a.queued)),
    close: async () => {
      channel.close()
      await rt.dispose()
    }
  }
}

interface Collected {
  readonly text: string
  readonly final: GenerateFinal | undefined
  readonly status: string
  readonly details: string
  readonly trailer: Metadata | undefined
}

const collect = async (
  client: AgentClient,
  req: Partial<GenerateRequest>,
  options: { signal?: AbortSignal } = {}
): Promise<Collected> => {
  let text = ""
  let final: GenerateFinal | undefined
  let trailer: Metadata | undefined
  try {
    for await (const r of client.generate(req, { ...options, onTrailer: (t) => (trailer = t) })) {
      if (r.delta !== undefined) text += r.delta.text
      if (r.final !== undefined) final = r.final
    }
    return { text, final, status: "OK", details: "", trailer }
  } catch (e) {
    if (!(e instanceof ClientError)) throw e
    return { text, final, status: Status[e.code] ?? String(e.code), details: e.details, trailer }
  }
}

const chunk = (text: string): string => `data: {"choices":[{"index":0,"text":${JSON.stringify(text)}}]}\n\n`
const finish = `data: {"choices":[{"index":0,"text":"","finish_reason":"stop"}]}\n\ndata: [DONE]\n\n`
const SSE = { "content-type": "text/event-stream" }
const JSON_TYPE = { "content-type": "application/json" }

/** Writes `piece` until the client goes away (an endless body); `done` counts the closes. */
const endless = (res: http.ServerResponse, piece: string): void => {
  let open = true
  res.on("close", () => {
    open = false
    closed++
  })
  const more = (): void => {
    while (open && res.write(piece));
    if (open) res.once("drain", more)
  }
  more()
}
let closed = 0
/** Sends the rest of the splitUtf8 answer. */
let releaseSplit = (): void => {
  throw new Error("no splitUtf8 answer is waiting")
}

type Script = (res: http.ServerResponse) => void
const scripts: Record<string, Script> = {
  // Error bodies, one per engine shape (engines.md section 7 and 10).
  vllm400: (res) =>
    res
      .writeHead(400, JSON_TYPE)
      .end(JSON.stringify({ error: { message: "bad max_tokens", type: "BadRequestError", param: null, code: 400 } })),
  sglang413: (res) =>
    res
      .writeHead(413, JSON_TYPE)
      .end(JSON.stringify({ object: "error", message: "too long", type: "BadRequestError", param: null, code: 413 })),
  fastapi422: (res) =>
    res.writeHead(422, JSON_TYPE).end(JSON.stringify({ detail: [{ loc: ["body", "top_p"], msg: "bad top_p" }] })),
  mlx404: (res) => res.writeHead(404, JSON_TYPE).end(JSON.stringify({ error: "Model not found" })),
  llama400: (res) =>
    res.writeHead(400, JSON_TYPE).end(
      JSON.stringify({
        error: {
          code: 400,
          message: "the request exceeds the available context size",
          type: "exceed_context_size_error"
        }
      })
    ),
  busy429: (res) => res.writeHead(429, JSON_TYPE).end(JSON.stringify({ error: { message: "queue full", code: 429 } })),
  text500: (res) => res.writeHead(500, { "content-type": "text/plain" }).end("Internal Server Error"),
  llama503: (res) =>
    res
      .writeHead(503, JSON_TYPE)
      .end(JSON.stringify({ error: { code: 503, message: "Loading model", type: "unavailable_error" } })),
  proxy502: (res) =>
    res
      .writeHead(502, { "content-type": "text/html" })
      .end("<html><head><title>502 Bad Gateway</title></head><body><h1>502 Bad Gateway</h1>nginx</body></html>"),
  // A long engine message (pydantic echoes inputs): the status message must still reach a grpc-js caller.
  long400: (res) =>
    res.writeHead(400, JSON_TYPE).end(
      JSON.stringify({
        error: { message: `bad ${"€".repeat(20_000)}`, type: "€".repeat(5000), code: "c".repeat(5000) }
      })
    ),
  // Streams that fail or break.
  llamaMidstream: (res) =>
    res.writeHead(200, SSE).end(`${chunk("a")}data: {"error":{"code":500,"message":"boom","type":"server_error"}}\n\n`),
  llamaErrorField: (res) =>
    res
      .writeHead(200, SSE)
      .end(`${chunk("a")}error: {"code":500,"message":"old boom","type":"server_error"}\n\ndata: [DONE]\n\n`),
  vllmMidstream400: (res) =>
    res
      .writeHead(200, SSE)
      .end(
        `${chunk("a")}data: {"error":{"message":"bad seed","type":"BadRequestError","code":400}}\n\ndata: [DONE]\n\n`
      ),
  noDone: (res) => res.writeHead(200, SSE).end(chunk("a") + chunk("b")),
  empty200: (res) => res.writeHead(200, SSE).end(),
  midEvent: (res) => res.writeHead(200, SSE).end(`${chunk("a")}data: {"choices":[{"index":0,"te`),
  // Junk where a choice or a delta belongs: no text, read past (it ended UNAVAILABLE "stream truncated: Cannot
  // read properties of null", a throw in the read taken for a broken connection).
  junkChoices: (res) =>
    res
      .writeHead(200, SSE)
      .end(
        `${chunk("a")}data: {"choices":[null]}\n\ndata: {"choices":null}\n\ndata: {"choices":[{"delta":null}]}\n\n${chunk("b")}${finish}`
      ),
  // 200 answers that are not an event stream.
  json200: (res) =>
    res
      .writeHead(200, JSON_TYPE)
      .end(JSON.stringify({ choices: [{ index: 0, text: "whole", finish_reason: "stop" }] })),
  html200: (res) => res.writeHead(200, { "content-type": "text/html" }).end("<html><body>Please log in</body></html>"),
  error200: (res) =>
    res.writeHead(200, JSON_TYPE).end(JSON.stringify({ error: { message: "context overflow", code: 400 } })),
  // UTF-8: a character split across two reads arrives whole; a byte that is not UTF-8 is replaced, not fatal.
  // Sent up to the first byte of "€"; the rest once the test calls releaseSplit (when the caller has the "a").
  splitUtf8: (res) => {
    const b = Buffer.from(chunk("a") + chunk("é€") + chunk("z") + finish)
    const at = b.indexOf(0xe2) + 1
    res.writeHead(200, SSE)
    res.write(b.subarray(0, at))
    releaseSplit = () => res.end(b.subarray(at))
  },
  invalidUtf8: (res) =>
    res
      .writeHead(200, SSE)
      .end(
        Buffer.concat([
          Buffer.from('data: {"choices":[{"index":0,"text":"x'),
          Buffer.from([0xff]),
          Buffer.from(`y"}]}\n\n${finish}`)
        ])
      ),
  // Bodies that never end: nothing may hold them whole.
  endlessError: (res) => {
    res.writeHead(500, { "content-type": "text/plain" })
    endless(res, "y".repeat(64 * 1024))
  },
  endlessLine: (res) => {
    res.writeHead(200, SSE)
    res.write(chunk("a"))
    endless(res, `data: ${"x".repeat(64 * 1024)}`)
  },
  endlessDataLines: (res) => {
    res.writeHead(200, SSE)
    endless(res, `data: ${"x".repeat(1024)}\n`)
  }
}

/** Requests the scripted engine holds unanswered ("hold"), and how many it has seen in all. */
const held: Array<http.ServerResponse> = []
let requests = 0

const startEngine = async (): Promise<{ server: http.Server; url: string }> => {
  const server = http.createServer((req, res) => {
    let body = ""
    req.setEncoding("utf8")
    req.on("data", (d: string) => (body += d))
    req.on("end", () => {
      requests++
      const prompt = (JSON.parse(body) as { prompt: string }).prompt
      if (prompt === "hold") {
        held.push(res)
        res.on("close", () => {
          if (!res.writableFinished) closed++
        })
        return
      }
      scripts[prompt]!(res)
    })
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  return { server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` }
}

const stopEngine = async (server: http.Server | undefined): Promise<void> => {
  server?.closeAllConnections()
  await new Promise<void>((resolve) => (server === undefined ? resolve() : server.close(() => resolve())))
}

describe("engine failure shapes end Generate with the table's status and the engine's message", () => {
  let engine: { server: http.Server; url: string }
  let agent: Agent
  beforeAll(async () => {
    engine = await startEngine()
    agent = await startAgent(engine.url)
  })
  afterAll(async () => {
    await agent?.close()
    await stopEngine(engine?.server)
  })

  // [script, status, details, cgn-engine-reason, text relayed before the end]
  const cases: ReadonlyArray<[string, string, RegExp, string, string]> = [
    ["vllm400", "INVALID_ARGUMENT", /^engine answered HTTP 400 \(BadRequestError\): bad max_tokens$/, "Http", ""],
    ["sglang413", "RESOURCE_EXHAUSTED", /HTTP 413 \(BadRequestError\): too long$/, "Http", ""],
    ["fastapi422", "INVALID_ARGUMENT", /HTTP 422: body\.top_p: bad top_p$/, "Http", ""],
    ["mlx404", "NOT_FOUND", /HTTP 404: Model not found$/, "Http", ""],
    [
      "llama400",
      "INVALID_ARGUMENT",
      /\(exceed_context_size_error\): the request exceeds the available context/,
      "Http",
      ""
    ],
    ["busy429", "RESOURCE_EXHAUSTED", /HTTP 429: queue full$/, "Http", ""],
    ["text500", "UNAVAILABLE", /HTTP 500: Internal Server Error$/, "Http", ""],
    ["llama503", "UNAVAILABLE", /HTTP 503 \(unavailable_error\): Loading model$/, "Http", ""],
    ["proxy502", "UNAVAILABLE", /HTTP 502: <html>.*502 Bad Gateway/, "Http", ""],
    ["llamaMidstream", "UNAVAILABLE", /^engine failed mid-stream \(server_error\): boom$/, "Stream", "a"],
    ["llamaErrorField", "UNAVAILABLE", /^engine failed mid-stream \(server_error\): old boom$/, "Stream", "a"],
    ["vllmMidstream400", "INVALID_ARGUMENT", /^engine failed mid-stream \(BadRequestError\): bad seed$/, "Stream", "a"],
    ["noDone", "UNAVAILABLE", /stream truncated: body ended without \[DONE\]/, "Stream", "ab"],
    ["empty200", "UNAVAILABLE", /stream truncated/, "Stream", ""],
    // The body ends inside an event: a broken stream (retryable), not an engine that speaks another protocol.
    ["midEvent", "UNAVAILABLE", /stream truncated: body ended inside an event/, "Stream", "a"],
    // A 200 that is no event stream is an answer outside the OpenAI API: INTERNAL, naming what came, with the
    // engine's own words when it sent an error object.
    ["json200", "INTERNAL", /content-type "application\/json", not an event stream/, "Protocol", ""],
    [
      "html200",
      "INTERNAL",
      /content-type "text\/html", not an event stream: <html><body>Please log in/,
      "Protocol",
      ""
    ],
    ["error200", "INTERNAL", /not an event stream: context overflow$/, "Protocol", ""]
  ]
  it.each(cases)("%s: %s", async (prompt, status, details, reason, text) => {
    const r = await collect(agent.client, { prompt })
    expect([r.status, r.details, r.text, r.final]).toEqual([status, expect.stringMatching(details), text, undefined])
    expect(r.trailer?.get("cgn-error-source")).toBe("engine")
    expect(r.trailer?.get("cgn-engine-reason")).toBe(reason)
    expect((r.trailer?.get("cgn-engine-message") ?? "").length).toBeGreaterThan(0)
  })

  it("engine status, type and code go in the trailers", async () => {
    const r = await collect(agent.client, { prompt: "vllm400" })
    expect([
      r.trailer?.get("cgn-engine-status"),
      r.trailer?.get("cgn-engine-type"),
      r.trailer?.get("cgn-engine-message")
    ]).toEqual(["400", "BadRequestError", "bad max_tokens"])
  })

  it("a long engine message still reaches the caller, bounded, with its status", async () => {
    const r = await collect(agent.client, { prompt: "long400" })
    // The engine's type is cut to 64 characters and its message to 500 (EngineErrors.ts): 5 KB percent-encoded, so
    // grpc-message is cut to 1 KiB as sent (StatusMessage.ts), saying how much; the trailers keep the rest.
    expect([r.status, r.details]).toEqual([
      "INVALID_ARGUMENT",
      expect.stringMatching(/^engine answered HTTP 400 \(€{64}…\): bad €+… \(\d+ more characters\)$/)
    ])
    expect(r.details.length).toBeLessThan(200)
    expect(r.trailer?.get("cgn-engine-message")).toMatch(/^bad \?+/)
  })

  it("junk in place of a choice or a delta carries no text and does not break the stream", async () => {
    expect(await collect(agent.client, { prompt: "junkChoices" })).toMatchObject({ status: "OK", text: "ab" })
  })

  it("UTF-8 split across reads arrives whole; a byte that is not UTF-8 becomes U+FFFD", async () => {
    // The caller has the "a" before the engine sends the rest: the agent has read the first byte of "€" by then,
    // and reads the other two later.
    const call = agent.client.generate({ prompt: "splitUtf8" })[Symbol.asyncIterator]()
    expect((await call.next()).value?.delta?.text).toBe("a")
    releaseSplit()
    let text = ""
    let final: GenerateFinal | undefined
    for (let r = await call.next(); !r.done; r = await call.next()) {
      text += r.value.delta?.text ?? ""
      final ??= r.value.final
    }
    expect({ text, finishReason: final?.finishReason }).toEqual({ text: "é€z", finishReason: "stop" })
    expect(await collect(agent.client, { prompt: "invalidUtf8" })).toMatchObject({ status: "OK", text: "x\ufffdy" })
  })

  // Each body below never ends: buffered whole it would grow the agent without limit (and the call would hang).
  it.each([
    ["endlessError", "UNAVAILABLE", /^engine answered HTTP 500: yyyy/, "Http", ""],
    ["endlessLine", "INTERNAL", /^engine sent an invalid answer: SSE event over \d+ bytes/, "Protocol", "a"],
    ["endlessDataLines", "INTERNAL", /^engine sent an invalid answer: SSE event over \d+ bytes/, "Protocol", ""]
  ])(
    "%s: ends %s, bounded, and the engine request is aborted",
    async (prompt, status, details, reason, text) => {
      const before = closed
      const r = await collect(agent.client, { prompt })
      expect([r.status, r.details, r.text]).toEqual([status, expect.stringMatching(details), text])
      expect(r.trailer?.get("cgn-engine-reason")).toBe(reason)
      expect(r.details.length).toBeLessThan(1024)
      await pollUntil("the engine to see the disconnect", () => closed > before)
    },
    20_000
  )
})

/** One Generate through grpc-js (it sends grpc-timeout from a deadline): status name and details. */
const rawGenerate = (
  address: string,
  prompt: string,
  options: grpc.CallOptions & { cancelWhen?: Promise<unknown> } = {}
): Promise<[string, string]> => {
  const raw = new grpc.Client(address, grpc.credentials.createInsecure())
  return new Promise<[string, string]>((resolve) => {
    const call = raw.makeServerStreamRequest(
      GENERATE_PATH,
      (m: GenerateRequest) => Buffer.from(GenerateRequest.encode(m).finish()),
      (b: Buffer) => GenerateResponse.decode(b),
      GenerateRequest.fromPartial({ prompt }),
      new grpc.Metadata(),
      options
    )
    call.on("data", () => undefined)
    call.on("error", () => undefined)
    call.on("status", (st: grpc.StatusObject) => resolve([Status[st.code] ?? String(st.code), st.details]))
    // Cancelled also when what it waits for fails (the test fails on that): the call must end either way.
    options.cancelWhen?.then(
      () => call.cancel(),
      () => call.cancel()
    )
  }).finally(() => raw.close())
}

describe("the caller cancelling, or its deadline passing, in each phase of a call", () => {
  let engine: { server: http.Server; url: string }
  let agent: Agent
  let address: string
  beforeAll(async () => {
    engine = await startEngine()
    // One slot and a queue: a second call waits in admission while the first is held by the engine.
    agent = await startAgent(engine.url, { max_inflight: 1, max_queue: 4 })
    address = agent.address
  })
  afterAll(async () => {
    await agent?.close()
    for (const res of held) res.destroy()
    await stopEngine(engine?.server)
  })

  const releaseHeld = (): void => {
    for (const res of held.splice(0)) res.writeHead(200, SSE).end(chunk("ok") + finish)
  }

  it("cancelled while waiting for the engine's headers: the engine request is aborted", async () => {
    const before = closed
    const ac = new AbortController()
    const call = collect(agent.client, { prompt: "hold" }, { signal: ac.signal })
    await pollUntil("the engine to hold the request", () => held.length === 1)
    ac.abort()
    await expect(call).rejects.toThrow(/abort/i)
    await pollUntil("the engine to see the disconnect", () => closed > before)
    held.splice(0)
  })

  it("deadline while waiting for the engine's headers: DEADLINE_EXCEEDED, the engine request is aborted", async () => {
    const before = closed
    const r = await rawGenerate(address, "hold", { deadline: Date.now() + 300 })
    expect(r[0]).toBe("DEADLINE_EXCEEDED")
    await pollUntil("the engine to see the disconnect", () => closed > before)
    held.splice(0)
  })

  it("cancelled while streaming: the engine request is aborted", async () => {
    const before = closed
    const ac = new AbortController()
    const call = agent.client.generate({ prompt: "hold" }, { signal: ac.signal })[Symbol.asyncIterator]()
    const first = call.next()
    await pollUntil("the engine to hold the request", () => held.length === 1)
    const res = held.splice(0)[0]!
    res.writeHead(200, SSE)
    res.write(chunk("first"))
    // Streaming: the engine's first text has reached the caller, and the engine's answer is still open.
    expect((await first).value?.delta?.text).toBe("first")
    ac.abort()
    await expect(call.next()).rejects.toThrow(/abort/i)
    await pollUntil("the engine to see the disconnect", () => closed > before)
  })

  it("cancelled, or past its deadline, while queued in admission: the engine never sees it, the slot goes on", async () => {
    const first = collect(agent.client, { prompt: "hold" })
    await pollUntil("the engine to hold the first request", () => held.length === 1)
    const seen = requests
    const inQueue = () => pollUntil("the call waiting in admission", async () => (await agent.queued()) === 1)
    // Cancelled in the queue, once it waits there.
    const waiting = inQueue()
    const cancelled = rawGenerate(address, "hold", { cancelWhen: waiting })
    await waiting
    expect(await cancelled).toEqual(["CANCELLED", expect.any(String)])
    const leftQueue = () => pollUntil("the call out of the queue", async () => (await agent.queued()) === 0)
    await leftQueue()
    // A deadline shorter than the wait for admission: it passes while the call waits there.
    const late = rawGenerate(address, "hold", { deadline: Date.now() + 1_500 })
    await inQueue()
    expect(await late).toEqual(["DEADLINE_EXCEEDED", expect.any(String)])
    await leftQueue()
    expect(requests).toBe(seen)
    releaseHeld()
    expect(await first).toMatchObject({ status: "OK", text: "ok" })
    // Neither left a slot or a queue entry behind: the next call runs at once.
    const next = collect(agent.client, { prompt: "hold" })
    await pollUntil("the next call to reach the engine", () => held.length === 1)
    releaseHeld()
    expect(await next).toMatchObject({ status: "OK", text: "ok" })
  })
})
