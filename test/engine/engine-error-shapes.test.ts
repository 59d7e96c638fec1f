// Every engine's error shapes of every deployed age, read into the fields of the gRPC status: the flat and the
// nested body of vLLM (before and since 0.10.1) and SGLang (flat today; nested with `object` kept inside, as
// sgl-project/sglang PR #33534 would send it), their stream events (wrapped, with a scheduler abort's status
// name as the type), llama.cpp's and mlx-lm's; then end to end, the EngineClient against the simulator of an
// old vLLM (--sim-legacy-errors) and of SGLang.
import { Cause, Effect, Exit, Result, Stream } from "effect"
import { Status } from "nice-grpc-common"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { decodeConfigObject } from "../../src/layers/config/Config.ts"
import { engineFor } from "../../src/layers/engine/backends/index.ts"
import { layerFromPlan } from "../../src/layers/engine/EngineClient.ts"
import type { LaunchPlan } from "../../src/services/engine/Engine.ts"
import { EngineClient, type EngineError } from "../../src/services/engine/EngineClient.ts"
import * as EngineErrors from "../../src/services/engine/EngineErrors.ts"
import { engineFailure } from "../../src/services/grpc/GrpcStatus.ts"
import { streamOf } from "../../src/testing/EngineClient.ts"
import { freePort } from "../support/ports.ts"
import { getJson, pollUntil, postJson, type SimHandle, startSim } from "../support/sim.ts"

// The shapes, with no secret to scrub (what is scrubbed: engine-error-secrets.test.ts).
const httpError = (status: number, body: string) => EngineErrors.httpError(status, body, EngineErrors.NO_SECRETS)
const streamError = (obj: unknown) => EngineErrors.streamError(obj, EngineErrors.NO_SECRETS)
const sseErrorEvent = (text: string) => EngineErrors.sseErrorEvent(text, EngineErrors.NO_SECRETS)

/** What the gRPC status carries of an engine error: its message, and the trailers with the engine's code. */
const status = (e: EngineError) => {
  const f = engineFailure(e)
  return {
    code: f.code,
    message: f.message,
    status: f.trailers["cgn-engine-status"],
    type: f.trailers["cgn-engine-type"],
    engineCode: f.trailers["cgn-engine-code"]
  }
}

describe("HTTP error bodies, old and new", () => {
  it.each([
    [
      "vLLM >= 0.10.1 nested",
      400,
      '{"error":{"message":"too long","type":"BadRequestError","param":"max_tokens","code":400}}',
      { message: "engine answered HTTP 400 (BadRequestError): too long", status: "400", type: "BadRequestError" }
    ],
    [
      "vLLM < 0.10.1 / SGLang flat",
      400,
      '{"object":"error","message":"too long","type":"BadRequestError","param":null,"code":400}',
      { message: "engine answered HTTP 400 (BadRequestError): too long", status: "400", type: "BadRequestError" }
    ],
    [
      "SGLang nested with object kept inside (PR #33534)",
      400,
      '{"error":{"object":"error","message":"too long","type":"BadRequestError","param":"max_tokens","code":400}}',
      { message: "engine answered HTTP 400 (BadRequestError): too long", status: "400", type: "BadRequestError" }
    ],
    [
      "SGLang's HTTPException path: the status as the type (queue full)",
      503,
      '{"object":"error","message":"The request queue is full.","type":"503","param":null,"code":503}',
      { message: "engine answered HTTP 503 (503): The request queue is full.", status: "503", type: "503" }
    ],
    [
      "llama.cpp context exceeded, with its extra fields",
      400,
      '{"error":{"code":400,"message":"request (701 tokens) exceeds the available context size (512 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":701,"n_ctx":512}}',
      {
        message:
          "engine answered HTTP 400 (exceed_context_size_error): request (701 tokens) exceeds the available context size (512 tokens), try increasing it",
        status: "400",
        type: "exceed_context_size_error"
      }
    ],
    [
      "mlx-lm's string",
      404,
      '{"error":"Failed to load model x"}',
      { message: "engine answered HTTP 404: Failed to load model x", status: "404", type: undefined }
    ]
  ])("%s", (_name, code, body, expected) => {
    expect(status(httpError(code, body))).toMatchObject({ ...expected, engineCode: undefined })
  })
})

describe("stream error events, old and new", () => {
  it.each([
    [
      "vLLM >= 0.10.1: the nested object",
      { error: { message: "boom", type: "InternalServerError", param: null, code: 500 } },
      { message: "engine failed mid-stream (InternalServerError): boom", status: "500", type: "InternalServerError" }
    ],
    [
      "vLLM < 0.10.1 / SGLang: the flat object wrapped",
      { error: { object: "error", message: "boom", type: "InternalServerError", param: null, code: 500 } },
      { message: "engine failed mid-stream (InternalServerError): boom", status: "500", type: "InternalServerError" }
    ],
    [
      "SGLang scheduler abort: the status name as the type",
      { error: { object: "error", message: "The request queue is full.", type: "SERVICE_UNAVAILABLE", code: 503 } },
      {
        message: "engine failed mid-stream (SERVICE_UNAVAILABLE): The request queue is full.",
        status: "503",
        type: "SERVICE_UNAVAILABLE"
      }
    ],
    [
      "llama.cpp data: event",
      { error: { code: 500, message: "boom", type: "server_error" } },
      { message: "engine failed mid-stream (server_error): boom", status: "500", type: "server_error" }
    ]
  ])("%s", (_name, obj, expected) => {
    expect(status(streamError(obj))).toMatchObject(expected)
  })

  it("older llama.cpp's error: field line, flat", () => {
    expect(status(sseErrorEvent('{"code":500,"message":"boom","type":"server_error"}'))).toMatchObject({
      message: "engine failed mid-stream (server_error): boom",
      status: "500",
      type: "server_error"
    })
  })
})

// End to end: the agent's renderer, client and status mapping against the simulated engines.
describe("the EngineClient against the simulator, old vLLM and SGLang", () => {
  const sims: Array<SimHandle> = []
  const plans: Record<string, LaunchPlan> = {}

  const start = async (name: string, flavor: "vllm" | "sglang", extra: ReadonlyArray<string>) => {
    const port = await freePort()
    const decoded = decodeConfigObject(
      { engine: { kind: flavor, url: `http://127.0.0.1:${port}` }, models: { m: { hf_repo: "org/m" } } },
      undefined
    )
    if (Result.isFailure(decoded)) throw new Error(decoded.failure.message)
    const plan = engineFor(flavor).render(decoded.success)
    const sim = await startSim({ flavor, args: [...plan.argv.slice(1), ...extra] })
    sims.push(sim)
    await pollUntil(async () => ((await getJson(`${sim.url}/sim/state`)).json as { ready: boolean }).ready || undefined)
    plans[name] = plan
  }

  beforeAll(async () => {
    await Promise.all([start("vllmOld", "vllm", ["--sim-legacy-errors"]), start("sglang", "sglang", [])])
  })
  afterAll(() => Promise.all(sims.map((s) => s.stop())))

  const failure = async (plan: LaunchPlan, stream: boolean): Promise<EngineError> => {
    const body = { messages: [{ role: "user", content: "hello there" }], max_tokens: 4, stream }
    const call = Effect.gen(function* () {
      const c = yield* EngineClient
      return yield* Stream.runCollect(streamOf(c)("/v1/chat/completions", body))
    })
    const exit = await Effect.runPromise(Effect.exit(call).pipe(Effect.provide(layerFromPlan(plan))))
    if (Exit.isSuccess(exit)) throw new Error("expected a failure")
    const e = Cause.findErrorOption(exit.cause)
    if (e._tag === "None") throw new Error(Cause.pretty(exit.cause))
    return e.value
  }
  const withFaults = async <A>(plan: LaunchPlan, kind: string, f: () => Promise<A>): Promise<A> => {
    const set = (b: Record<string, unknown>) => postJson(`${plan.baseUrl}/sim/faults`, b)
    await set({ errorRate: 1, errorKind: kind })
    try {
      return await f()
    } finally {
      await set({ errorRate: 0 })
    }
  }

  it("old vLLM's flat HTTP error: the engine's message, status and type", async () => {
    const plan = plans.vllmOld!
    const e = await withFaults(plan, "http400", () => failure(plan, true))
    expect(status(e)).toMatchObject({
      message: "engine answered HTTP 400 (BadRequestError): simulated error (http400)",
      status: "400",
      type: "BadRequestError"
    })
  })

  it("old vLLM's wrapped flat object mid-stream: the engine's message and its code", async () => {
    const plan = plans.vllmOld!
    const e = await withFaults(plan, "midstream", () => failure(plan, true))
    expect(status(e)).toMatchObject({
      message: "engine failed mid-stream (InternalServerError): simulated mid-stream engine failure",
      status: "500",
      type: "InternalServerError"
    })
  })

  it("SGLang's scheduler abort mid-stream: INTERNAL_SERVER_ERROR with code 500 (UNAVAILABLE, retry elsewhere)", async () => {
    const plan = plans.sglang!
    const e = await withFaults(plan, "midstream", () => failure(plan, true))
    const f = engineFailure(e)
    expect([f.code, f.retryElsewhere]).toEqual([Status.UNAVAILABLE, true])
    expect(status(e)).toMatchObject({
      message: "engine failed mid-stream (INTERNAL_SERVER_ERROR): simulated mid-stream engine failure",
      status: "500",
      type: "INTERNAL_SERVER_ERROR"
    })
  })
})
