import * as http from "node:http"
import type { AddressInfo } from "node:net"
import { Cause, Effect, Exit, Layer, Result, Stream } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { GenerateRequest } from "../../src/gen/cgn/agent/v1/agent.ts"
import { decodeConfigObject, layerFromObject } from "../../src/layers/config/Config.ts"
import { engineFor } from "../../src/layers/engine/backends/index.ts"
import { PROXIED_WIRE } from "../../src/layers/engine/backends/openai_compat.ts"
import { layerFromPlan } from "../../src/layers/engine/EngineClient.ts"
import { probeBody, probeShape } from "../../src/layers/engine/probeShape.ts"
import { ActiveCalls } from "../../src/layers/grpc/ActiveCalls.ts"
import type { GenerateServerCall } from "../../src/layers/grpc/AgentService.ts"
import { makeHandler } from "../../src/layers/grpc/GenerateCall.ts"
import type { ServingState } from "../../src/layers/grpc/ServingState.ts"
import type { ProxiedKind } from "../../src/services/config/Config.ts"
import { ProxiedKinds } from "../../src/services/config/ConfigSchema.ts"
import type { LaunchPlan } from "../../src/services/engine/Engine.ts"
import { EngineClient, EngineError } from "../../src/services/engine/EngineClient.ts"
import { EngineClientRecorder, layerTest, streamOf, textChunk } from "../../src/testing/EngineClient.ts"
import { FakeCall } from "../support/fakeCall.ts"
import { pollUntil } from "../support/poll.ts"

/** llama-server's output-parser failure (tools/server: the chat parser refusing the model's output). */
const OUTPUT_FAULT = "The model produced output that does not match the expected Content-only format"
const errorBody = JSON.stringify({ error: { code: 500, message: OUTPUT_FAULT, type: "server_error" } })

let server: http.Server
let base: string
/** The `connection` header of each request, in order. */
const connections: Array<string | undefined> = []

beforeAll(async () => {
  server = http.createServer((req, res) => {
    connections.push(req.headers.connection)
    req.resume()
    req.on("end", () => {
      const mode = req.headers["x-request-id"]
      if (mode === "http500") {
        res.writeHead(500, { "content-type": "application/json" })
        res.end(errorBody)
        return
      }
      res.writeHead(200, { "content-type": "text/event-stream" })
      if (mode === "event") {
        res.end(`data: ${errorBody}\n\n`)
        return
      }
      res.end('data: {"id":"c","choices":[{"index":0,"text":"a"}]}\n\ndata: [DONE]\n\n')
    })
  })
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r))
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
})
afterAll(async () => {
  server.closeAllConnections()
  await new Promise<void>((r) => server.close(() => r()))
})

const planOf = (proxiedKind?: ProxiedKind): LaunchPlan => ({
  kind: "openai_compat",
  ...(proxiedKind === undefined ? {} : { proxiedKind }),
  spawns: false,
  argv: [],
  env: {},
  baseUrl: base,
  host: "127.0.0.1",
  port: Number(new URL(base).port),
  probe: { kind: "http", url: `${base}/health` },
  metrics: undefined,
  kvEvents: undefined,
  servedModel: "m",
  requestModel: "m"
})

/** One streamed completion, its id naming what the server does; the EngineError it failed with, if any. */
const streamed = async (plan: LaunchPlan, mode: string): Promise<EngineError | undefined> => {
  const exit = await Effect.runPromise(
    Effect.exit(
      Effect.gen(function* () {
        const c = yield* EngineClient
        return yield* Stream.runCollect(
          streamOf(c)("/v1/completions", { model: "m", prompt: "p" }, { requestId: mode })
        )
      })
    ).pipe(Effect.provide(layerFromPlan(plan)))
  )
  if (Exit.isSuccess(exit)) return undefined
  const e = Cause.squash(exit.cause)
  if (!(e instanceof EngineError)) throw new Error(`expected an EngineError, got ${Cause.pretty(exit.cause)}`)
  return e
}

describe("openai_compat with engine.proxied_kind: the EngineClient speaks as the proxied engine", () => {
  it("llama_cpp's output fault, on a 500 or a stream's error event, is marked so; untold, or vllm told, it is not", async () => {
    for (const mode of ["http500", "event"]) {
      const told = await streamed(planOf("llama_cpp"), mode)
      expect([told?.message, told?.fault], mode).toEqual([OUTPUT_FAULT, "output"])
      expect((await streamed(planOf(), mode))?.fault, `${mode}, untold`).toBeUndefined()
      expect((await streamed(planOf("vllm"), mode))?.fault, `${mode}, vllm`).toBeUndefined()
    }
  })

  it("llama_cpp closes a streamed answer's connection: the client asks for close; untold, it keeps it alive", async () => {
    connections.length = 0
    expect(await streamed(planOf("llama_cpp"), "ok")).toBeUndefined()
    expect(await streamed(planOf(), "ok")).toBeUndefined()
    expect(connections).toEqual(["close", "keep-alive"])
  })
})

describe("engineFor(openai_compat, proxied kind): each proxied kind's wire capabilities are that engine's own", () => {
  // the list itself is held by engines.test.ts's spelled-out expectation for llama_cpp
  it.each(ProxiedKinds)("%s", (kind) => {
    const own = engineFor(kind).capabilities
    const compat = engineFor("openai_compat").capabilities
    const told = engineFor("openai_compat", kind).capabilities
    for (const k of PROXIED_WIRE) expect(told[k], k).toEqual(own[k] ?? compat[k])
    // the rest stays openai_compat's: nothing spawned, no GPUs, no P/D, no rank header
    expect({ ...told, ...Object.fromEntries(PROXIED_WIRE.map((k) => [k, compat[k]])), displayName: "" }).toEqual({
      ...compat,
      displayName: ""
    })
    expect(told.displayName).toBe(`the proxied ${own.displayName}`)
    // the plan's render stays openai_compat's too: nothing to spawn, the key sent as a header
    const decoded = decodeConfigObject(
      {
        engine: { kind: "openai_compat", url: "http://10.0.3.7:8000", proxied_kind: kind, api_key: "secret-key" },
        models: { m: { hf_repo: "o/m" } }
      },
      undefined
    )
    if (Result.isFailure(decoded)) throw new Error(decoded.failure.message)
    const config = decoded.success
    const plan = engineFor("openai_compat", kind).render(config)
    expect([plan.kind, plan.proxiedKind, plan.spawns, plan.argv, plan.authorization]).toEqual([
      "openai_compat",
      kind,
      false,
      [],
      "Bearer secret-key"
    ])
  })
})

describe("the Generate call to a proxied llama-server speaks llama-server's dialect", () => {
  /** The body the agent sent the engine for a Generate with a repetition penalty, under `engine`. */
  const sentBody = async (engine: Record<string, unknown>): Promise<Record<string, unknown>> => {
    const deps = Layer.mergeAll(
      layerFromObject({ agent: { node_id: "n" }, engine, models: { m: { hf_repo: "org/m" } } }),
      layerTest({ chunks: [textChunk("a", "stop")] })
    )
    const serving = { refusal: () => undefined } as unknown as ServingState
    const { handler, recorder } = await Effect.runPromise(
      Effect.gen(function* () {
        return { handler: yield* makeHandler(serving, new ActiveCalls(), 1024), recorder: yield* EngineClientRecorder }
      }).pipe(Effect.scoped, Effect.provide(deps))
    )
    const call = new FakeCall(GenerateRequest.fromPartial({ prompt: "a", sampling: { repetitionPenalty: 1.3 } }))
    handler.handle(call as unknown as GenerateServerCall)
    await pollUntil("the call to end", () => call.status !== undefined)
    const [request] = await Effect.runPromise(recorder.requests)
    return request?.body ?? {}
  }

  it("repeat_penalty (llama-server ignores repetition_penalty silently); untold, the OpenAI spelling", async () => {
    const told = await sentBody({ kind: "openai_compat", url: "http://10.0.3.7:8080", proxied_kind: "llama_cpp" })
    expect([told.repeat_penalty, told.repetition_penalty]).toEqual([1.3, undefined])
    const untold = await sentBody({ kind: "openai_compat", url: "http://10.0.3.7:8080" })
    expect([untold.repeat_penalty, untold.repetition_penalty]).toEqual([undefined, 1.3])
  })
})

describe("the stall test's request to a proxied server of a known kind", () => {
  it("carries ignore_eos where the proxied engine takes it (vLLM, SGLang, llama.cpp), not for an unknown server", () => {
    const ignoresEos = (proxied?: ProxiedKind) =>
      "ignore_eos" in probeBody("/v1/completions", probeShape("openai_compat", "both", 1, proxied))
    expect(ProxiedKinds.map((k) => [k, ignoresEos(k)])).toEqual([
      ["vllm", true],
      ["sglang", true],
      ["llama_cpp", true],
      ["mlx", false]
    ])
    expect(ignoresEos()).toBe(false)
  })
})
