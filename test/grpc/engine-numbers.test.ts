// What a hostile or broken OpenAI-compatible engine says that the gRPC contract cannot carry: a usage count or a
// context length past its uint32 field, a finish reason of any length and bytes, a kv_transfer_params.remote_host that
// is no host. The readers bound each where they read it (ChunkReader.ts, ServedContext.ts, NixlParams.ts); a message
// that still cannot be encoded ends its call INTERNAL, counted so (GenerateCall.ts, http2/Call.ts write), where it
// used to be counted OK and left open until the caller's deadline (forever with none). In process: the agent's real
// gRPC server in front of an HTTP engine of the test's own.
import * as http from "node:http"
import * as http2 from "node:http2"
import type { AddressInfo } from "node:net"
import { Effect, Layer, ManagedRuntime, Result } from "effect"
import { ClientError, createChannel, createClient, Status } from "nice-grpc"
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest"
import { AgentDefinition, type GenerateFinal, type GenerateRequest } from "../../src/gen/cgn/agent/v1/agent.ts"
import { engineFor } from "../../src/layers/engine/backends/index.ts"
import * as ServedContextLive from "../../src/layers/engine/ServedContext.ts"
import { layerWith as grpcLayerWith } from "../../src/layers/grpc/GrpcServer.ts"
import { ServerCall } from "../../src/layers/grpc/http2/Call.ts"
import { servedContextOf } from "../../src/services/engine/ServedContext.ts"
import { ChunkReader, MAX_FINISH_REASON_CHARS } from "../../src/services/grpc/ChunkReader.ts"
import { GrpcServer } from "../../src/services/grpc/GrpcServer.ts"
import { extractKvTransferParams, planLeg } from "../../src/services/grpc/Handoff.ts"
import { isHostOrIp, nixlParamsProblems } from "../../src/services/grpc/NixlParams.ts"
import { Metrics } from "../../src/services/observability/Metrics.ts"
import { layerTest as metricsLayerTest } from "../../src/testing/Metrics.ts"
import { agentDeps } from "../support/agentDeps.ts"
import { collect, startAgent } from "../support/grpcAgent.ts"
import { pollUntil } from "../support/poll.ts"

const UINT32_MAX = 2 ** 32 - 1
const HOSTILE_REASON = `stop\r\nevil\u001b[2J${"x".repeat(100_000)}`

const usageChunk = (usage: string) => ({ choices: [], usage: JSON.parse(usage) as unknown }) as Record<string, unknown>

describe("ChunkReader: usage counts past uint32 are no counts", () => {
  it.each([
    ['{"prompt_tokens":1,"completion_tokens":4294967296,"total_tokens":4294967297}'],
    ['{"prompt_tokens":1e20,"completion_tokens":1}'],
    ['{"prompt_tokens":1,"completion_tokens":1e300}'],
    // JSON.parse makes this Infinity
    ['{"prompt_tokens":1,"completion_tokens":1e400}'],
    ['{"prompt_tokens":1,"completion_tokens":2,"total_tokens":4294967296}'],
    // each fits, their sum (the total the engine left out) does not
    ['{"prompt_tokens":4294967295,"completion_tokens":1}']
  ])("%s: the usage is dropped (the final carries none)", (usage) => {
    const r = new ChunkReader()
    r.read(usageChunk('{"prompt_tokens":1,"completion_tokens":1}'))
    r.read(usageChunk(usage))
    expect(r.usage).toBeUndefined()
    expect(r.final({ ttftMs: 0, totalMs: 0, queueMs: 0, nodeId: "n", requestId: "r" }).usage).toBeUndefined()
  })

  it("the largest uint32 is kept; negative, fractional and string counts are normalized as before", () => {
    const r = new ChunkReader()
    r.read(usageChunk(`{"prompt_tokens":0,"completion_tokens":${UINT32_MAX},"total_tokens":${UINT32_MAX}}`))
    expect(r.usage).toEqual({ promptTokens: 0, completionTokens: UINT32_MAX, totalTokens: UINT32_MAX })
    r.read(usageChunk('{"prompt_tokens":-5,"completion_tokens":2.7,"total_tokens":"9"}'))
    expect(r.usage).toEqual({ promptTokens: 0, completionTokens: 2, totalTokens: 0 })
  })
})

describe("ChunkReader: the finish reason is bounded and printable", () => {
  const reasonOf = (fr: string) => {
    const r = new ChunkReader()
    r.read({ choices: [{ index: 0, delta: {}, finish_reason: fr }] })
    return r.finishReason
  }
  it("upstream's words pass unchanged", () => {
    for (const fr of ["stop", "length", "abort", "error", "repetition", "tool_calls"]) expect(reasonOf(fr)).toBe(fr)
  })
  it("100,000 characters with CR/LF and an escape sequence: the first 64, each control character '?'", () => {
    const got = reasonOf(HOSTILE_REASON)
    expect(got).toHaveLength(MAX_FINISH_REASON_CHARS)
    expect(got).toMatch(/^[\x20-\x7e]+$/)
    expect(got.startsWith("stop??evil?[2Jxxx")).toBe(true)
  })
})

describe("servedContextOf: a max_model_len past uint32 is no usable value", () => {
  const vllm = engineFor("vllm").capabilities.servedContext!
  const proxied = engineFor("openai_compat").capabilities.servedContext!
  it("4294967296000: a reason, the configured value stays in force; 2^32-1 is still taken", () => {
    expect(servedContextOf({ data: [{ id: "m", max_model_len: 4294967296000 }] }, vllm, "m")).toMatch(
      /no positive integer at max_model_len .*\(at most 2\^32-1\)/
    )
    expect(servedContextOf({ data: [{ id: "m", max_model_len: 2 ** 32 }] }, vllm, "m")).toEqual(expect.any(String))
    expect(servedContextOf({ data: [{ id: "m", max_model_len: UINT32_MAX }] }, vllm, "m")).toBe(UINT32_MAX)
  })
  it("openai_compat: an out-of-range max_model_len gives way to meta.n_ctx", () => {
    const body = { data: [{ id: "m", max_model_len: 4294967296000, meta: { n_ctx: 512 } }] }
    expect(servedContextOf(body, proxied, "m")).toBe(512)
  })
})

describe("kv_transfer_params.remote_host: a host name or IP literal only", () => {
  const params = (remote_host: unknown) => ({
    do_remote_prefill: true,
    do_remote_decode: false,
    remote_block_ids: [1, 2],
    remote_engine_id: "e",
    remote_host,
    remote_port: 5600
  })
  it.each([
    "localhost",
    "127.0.0.1",
    "10.1.2.3",
    "::1",
    "fe80::1",
    "2001:db8::8a2e:370:7334",
    "::ffff:10.0.0.1",
    "prefill-0.prefill.ns.svc.cluster.local",
    "node_1",
    "host."
  ])("%s: accepted", (host) => {
    expect(isHostOrIp(host)).toBe(true)
    expect(nixlParamsProblems(params(host)).wrong).toEqual([])
  })
  it.each([
    "127.0.0.1\r\nevil\u001b[2J",
    "127.0.0.1 ",
    "a b",
    "[::1]",
    "::1\n",
    "999.1.1.1",
    "1.2.3",
    "-lead",
    "a..b",
    "x".repeat(64),
    `${"a.".repeat(127)}ab`,
    "h%0d",
    "host:5600"
  ])("%j: refused", (host) => {
    expect(isHostOrIp(host)).toBe(false)
    expect(nixlParamsProblems(params(host)).wrong).toEqual([
      expect.stringMatching(/^remote_host must be a host name or IP address, got /)
    ])
  })

  it("on a decode leg: InvalidHandoff in the existing style; from a prefill engine: refused too", () => {
    const leg = planLeg({ role: "decode", handoff: "kv_transfer_params", body: {}, kvTransferParams: params("a\r\nb") })
    expect(Result.isFailure(leg)).toBe(true)
    if (Result.isFailure(leg))
      expect(leg.failure.message).toBe(
        'invalid kv_transfer_params; remote_host must be a host name or IP address, got "a\\r\\nb"'
      )
    expect(Result.isFailure(extractKvTransferParams({ kv_transfer_params: params("evil\u001b[2J") }))).toBe(true)
    expect(Result.isSuccess(extractKvTransferParams({ kv_transfer_params: params("10.0.0.7") }))).toBe(true)
  })
})

// ---------------------------------------------------------------------------------------------------------------
// End to end

/** The engine's answer to a completion: the SSE body after the text "hi". */
let tail = ""
let modelReads = 0
let completions = 0
const engine = http.createServer((req, res) => {
  if (req.url === "/v1/models") {
    modelReads++
    // openai_compat reads max_model_len, then meta.n_ctx (its backend's servedContext)
    res.writeHead(200, { "content-type": "application/json" })
    res.end(JSON.stringify({ data: [{ id: "m", max_model_len: 4294967296000, meta: { n_ctx: 512 } }] }))
    return
  }
  completions++
  req.resume()
  req.on("end", () => {
    res.writeHead(200, { "content-type": "text/event-stream" })
    res.end(`data: {"choices":[{"index":0,"text":"hi"}]}\n\n${tail}data: [DONE]\n\n`)
  })
})

let rt: ManagedRuntime.ManagedRuntime<GrpcServer | Metrics, unknown>
let address = ""
beforeAll(async () => {
  await new Promise<void>((r) => engine.listen(0, "127.0.0.1", r))
  const url = `http://127.0.0.1:${(engine.address() as AddressInfo).port}`
  const { deps } = agentDeps(url, { kind: "openai_compat" })
  rt = ManagedRuntime.make(
    grpcLayerWith({ address: "127.0.0.1:0", shutdownGraceMs: 500 }).pipe(
      Layer.provideMerge(ServedContextLive.layer),
      Layer.provideMerge(Layer.mergeAll(deps, metricsLayerTest))
    )
  ) as typeof rt
  address = (await rt.runPromise(GrpcServer)).address
})
afterAll(async () => {
  await rt?.dispose()
  engine.closeAllConnections()
  await new Promise<void>((r) => engine.close(() => r()))
})
afterEach(() => {
  vi.restoreAllMocks()
})

const client = () => {
  const channel = createChannel(address)
  return { client: createClient(AgentDefinition, channel), close: () => channel.close() }
}

/** One Generate, bounded: a call left open fails the test with an AbortError rather than hanging it. */
const generate = async (req: Partial<GenerateRequest>) => {
  const c = client()
  let text = ""
  let final: GenerateFinal | undefined
  try {
    for await (const r of c.client.generate(req, { signal: AbortSignal.timeout(5_000) })) {
      if (r.delta !== undefined) text += r.delta.text
      if (r.final !== undefined) final = r.final
    }
    return { status: "OK", details: "", text, final }
  } catch (e) {
    if (!(e instanceof ClientError)) throw e
    return { status: Status[e.code], details: e.details, text, final }
  } finally {
    c.close()
  }
}

/** cgn_agent_requests_total by grpc_code, and cgn_agent_finals_without_usage_total. */
const counts = () =>
  rt.runPromise(
    Effect.flatMap(Metrics, (m) =>
      Effect.promise(async () => {
        const out: Record<string, number> = {}
        for (const v of (await m.requests.get()).values)
          out[String(v.labels.grpc_code)] = (out[String(v.labels.grpc_code)] ?? 0) + v.value
        out.noUsage = (await m.finalsWithoutUsage.get()).values.reduce((n, v) => n + v.value, 0)
        return out
      })
    )
  )

describe("a hostile engine behind the agent's gRPC server", () => {
  it("ListModels: an engine's max_model_len of 4294967296000 is passed over (it was INTERNAL 'invalid uint32')", async () => {
    const c = client()
    try {
      const models = await pollUntil("ListModels with meta.n_ctx", async () => {
        const r = await c.client.listModels({})
        return r.models[0]?.maxModelLen === 512 ? r.models : undefined
      })
      expect(modelReads).toBeGreaterThan(0)
      expect(models[0]?.maxModelLen).toBe(512)
    } finally {
      c.close()
    }
  })

  it.each([
    ['{"prompt_tokens":1,"completion_tokens":4294967296,"total_tokens":4294967297}'],
    ['{"prompt_tokens":1e20,"completion_tokens":1,"total_tokens":2}'],
    ['{"prompt_tokens":1,"completion_tokens":1e300,"total_tokens":2}']
  ])(
    "usage %s: OK with no usage in the final, counted as a final without usage (it hung, counted OK)",
    async (usage) => {
      tail = `data: {"choices":[{"index":0,"text":"","finish_reason":"stop"}]}\n\ndata: {"choices":[],"usage":${usage}}\n\n`
      const before = await counts()
      const r = await generate({ prompt: "a" })
      expect([r.status, r.details, r.text]).toEqual(["OK", "", "hi"])
      expect(r.final?.finishReason).toBe("stop")
      expect(r.final?.usage).toBeUndefined()
      const after = await counts()
      expect([after.OK! - (before.OK ?? 0), after.noUsage! - before.noUsage!]).toEqual([1, 1])
    }
  )

  it("a 100,000-character finish reason with CR/LF and ANSI escapes: 64 printable characters", async () => {
    tail = `data: ${JSON.stringify({ choices: [{ index: 0, text: "", finish_reason: HOSTILE_REASON }] })}\n\n`
    const r = await generate({ prompt: "a" })
    expect(r.status).toBe("OK")
    expect(r.final?.finishReason).toBe(`stop??evil?[2J${"x".repeat(MAX_FINISH_REASON_CHARS - 14)}`)
  })

  it("a final that still cannot be encoded ends the call INTERNAL, counted so, never OK and open", async () => {
    tail = `data: {"choices":[{"index":0,"text":"","finish_reason":"stop"}]}\n\n`
    // A count past uint32 that got by the reader (the reader's own check is the test above)
    const final = ChunkReader.prototype.final
    vi.spyOn(ChunkReader.prototype, "final").mockImplementation(function (this: ChunkReader, info) {
      return { ...final.call(this, info), usage: { promptTokens: 1, completionTokens: 2 ** 32, totalTokens: 1 } }
    })
    const before = await counts()
    const r = await generate({ prompt: "a", requestId: "enc-1" })
    expect([r.status, r.text, r.final]).toEqual(["INTERNAL", "hi", undefined])
    expect(r.details).toMatch(/^engine sent an invalid answer: the answer could not be encoded as a gRPC message \(/)
    const after = await counts()
    expect([after.INTERNAL! - (before.INTERNAL ?? 0), (after.OK ?? 0) - (before.OK ?? 0)]).toEqual([1, 0])
  })

  it("a decode node refuses a hostile remote_host before its engine sees it", async () => {
    const agent = await startAgent(`http://127.0.0.1:${(engine.address() as AddressInfo).port}`, "vllm", {
      role: "decode"
    })
    try {
      const sent = completions
      const r = await collect(agent.client, {
        prompt: "a",
        kvTransferParams: {
          do_remote_prefill: true,
          remote_block_ids: [1],
          remote_engine_id: "e",
          remote_host: "127.0.0.1\r\nevil\u001b[2J",
          remote_port: 5600
        }
      })
      expect([r.status, r.trailer?.get("cgn-reason")]).toEqual(["FAILED_PRECONDITION", "invalid_handoff"])
      expect(r.details).toMatch(/remote_host must be a host name or IP address/)
      expect(completions).toBe(sent)
    } finally {
      await agent.close()
    }
  })
})

describe("http2/Call.ts write: a message that cannot be encoded ends the call", () => {
  it("INTERNAL, the request id in its trailers, where the throw used to leave the stream open", async () => {
    const server = http2.createServer()
    let ended: (v: boolean) => void = () => undefined
    const handled = new Promise<boolean>((r) => (ended = r))
    server.on("stream", (stream, headers) => {
      const call = new ServerCall<unknown, unknown>(
        stream,
        headers,
        () => {
          throw new Error("invalid uint32: 4294967296")
        },
        { open: 0 }
      )
      call.requestId = "req-7"
      let wrote: boolean | string
      try {
        wrote = call.write({})
      } catch (e) {
        wrote = `threw ${String(e)}`
      }
      ended(wrote === false && call.done)
    })
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r))
    const session = http2.connect(`http://127.0.0.1:${(server.address() as AddressInfo).port}`)
    try {
      const req = session.request({ ":method": "POST", ":path": "/x", "content-type": "application/grpc" })
      req.end()
      // ended by the write, synchronously (else the stream stays open: the test fails here, not on a timeout)
      expect(await handled).toBe(true)
      const headers = await new Promise<http2.IncomingHttpHeaders>((resolve, reject) => {
        req.on("response", resolve)
        req.on("error", reject)
      })
      expect(headers["grpc-status"]).toBe(String(Status.INTERNAL))
      expect(decodeURIComponent(String(headers["grpc-message"]))).toBe(
        "agent error: the response could not be encoded: invalid uint32: 4294967296"
      )
      expect(headers["cgn-request-id"]).toBe("req-7")
    } finally {
      session.destroy()
      await new Promise<void>((r) => server.close(() => r()))
    }
  })
})
