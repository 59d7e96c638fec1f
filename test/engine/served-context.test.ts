// ServedContext: the context one request can use as the engine says it (services/engine/ServedContext.ts, the pure
// reading of a model list and the limit with the configured value; layers/engine/ServedContext.ts, read once per Ready
// period), and what ListModels and Generate's max_tokens check make of it, in process: the live layer against an HTTP
// engine of the test's own and against the vLLM-flavour simulator behind the gRPC server.
import * as http from "node:http"
import type { AddressInfo } from "node:net"
import { Layer, Logger, ManagedRuntime, Result } from "effect"
import { createChannel, createClient } from "nice-grpc"
import { afterAll, afterEach, describe, expect, it } from "vitest"
import { AgentDefinition, GenerateRequest } from "../../src/gen/cgn/agent/v1/agent.ts"
import { decodeConfigObject, layerFromObject } from "../../src/layers/config/Config.ts"
import { engineFor } from "../../src/layers/engine/backends/index.ts"
import * as ServedContextLive from "../../src/layers/engine/ServedContext.ts"
import { layerWith as grpcLayerWith } from "../../src/layers/grpc/GrpcServer.ts"
import type { AgentConfig, EngineKind } from "../../src/services/config/Config.ts"
import type { ServedContextSource } from "../../src/services/engine/Engine.ts"
import type { EngineState } from "../../src/services/engine/EngineProcess.ts"
import { State } from "../../src/services/engine/EngineState.ts"
import { requestContext, ServedContext, servedContextOf } from "../../src/services/engine/ServedContext.ts"
import { GenerateRejected, planRequest } from "../../src/services/grpc/Generate.ts"
import { GrpcServer } from "../../src/services/grpc/GrpcServer.ts"
import { modelsBody } from "../../src/sim/chunks.ts"
import { EngineProcessControl, layerTest as engineLayerTest, testPlan } from "../../src/testing/EngineProcess.ts"
import { layerTest as metricsLayerTest } from "../../src/testing/Metrics.ts"
import { agentDeps } from "../support/agentDeps.ts"
import { pollUntil } from "../support/poll.ts"
import { type SimHandle, startSim } from "../support/sim.ts"

const sourceOf = (kind: EngineKind): ServedContextSource => {
  const s = engineFor(kind).capabilities.servedContext
  if (s === undefined) throw new Error(`${kind} declares no servedContext`)
  return s
}

describe("servedContextOf: each backend's declared field in the model list its engine serves", () => {
  // the simulator's lists follow upstream's shapes (src/sim/chunks.ts modelsBody, each with its source)
  it.each([
    ["vllm", modelsBody("vllm", "m", "org/m", 8192, 0), 8192],
    ["sglang", modelsBody("sglang", "m", "org/m", 8192, 0), 8192],
    // llama-server: -c 1024 over 2 slots, meta.n_ctx is one slot's
    ["llama_cpp", modelsBody("llama_cpp", "m", "m.gguf", 1024, 0, 512), 512],
    ["openai_compat", modelsBody("vllm", "m", "org/m", 2048, 0), 2048],
    ["openai_compat", modelsBody("llama_cpp", "m", "m.gguf", 1024, 0, 256), 256]
  ] as const)("%s", (kind, body, want) => {
    expect(servedContextOf(body, sourceOf(kind), "m")).toBe(want)
  })

  it("mlx-lm says none: its backend declares no source", () => {
    expect(engineFor("mlx").capabilities.servedContext).toBeUndefined()
  })

  const vllm = sourceOf("vllm")
  it("the served model's entry, not a LoRA's listed before it; else the only entry", () => {
    const body = {
      data: [
        { id: "lora-a", max_model_len: null },
        { id: "m", max_model_len: 4096 }
      ]
    }
    expect(servedContextOf(body, vllm, "m")).toBe(4096)
    expect(servedContextOf({ data: [{ id: "other", max_model_len: 100 }] }, vllm, "m")).toBe(100)
  })

  it("openai_compat: a card with both fields is read at vLLM's and SGLang's max_model_len first, then llama-server's meta.n_ctx", () => {
    const proxied = sourceOf("openai_compat")
    expect(servedContextOf({ data: [{ id: "m", max_model_len: 2048, meta: { n_ctx: 512 } }] }, proxied, "m")).toBe(2048)
    expect(servedContextOf({ data: [{ id: "m", max_model_len: null, meta: { n_ctx: 512 } }] }, proxied, "m")).toBe(512)
  })

  it("no value: a reason, never a guess", () => {
    const cases: ReadonlyArray<[unknown, RegExp]> = [
      [null, /no "data" list/],
      [{ data: {} }, /no "data" list/],
      // a gateway listing several models, none ours
      [
        {
          data: [
            { id: "a", max_model_len: 1 },
            { id: "b", max_model_len: 2 }
          ]
        },
        /no entry with id "m" among 2/
      ],
      [{ data: [{ id: "m" }] }, /no positive integer at max_model_len/],
      [{ data: [{ id: "m", max_model_len: 0 }] }, /no positive integer/],
      [{ data: [{ id: "m", max_model_len: "4096" }] }, /no positive integer/],
      [{ data: [{ id: "m", max_model_len: 1.5 }] }, /no positive integer/]
    ]
    for (const [body, why] of cases) expect(servedContextOf(body, vllm, "m")).toMatch(why)
    // llama-server while loading (newer builds): "meta": null
    expect(servedContextOf({ data: [{ id: "m", meta: null }] }, sourceOf("llama_cpp"), "m")).toMatch(/meta\.n_ctx/)
  })
})

describe("requestContext: the smaller of the configured and the engine's values", () => {
  it.each([
    [undefined, undefined, undefined],
    [1024, undefined, { tokens: 1024, engine: false }],
    [undefined, 4096, { tokens: 4096, engine: true }],
    [1024, 512, { tokens: 512, engine: true }],
    [1024, 1024, { tokens: 1024, engine: false }],
    [2048, 4096, { tokens: 2048, engine: false }]
  ] as const)("configured %s, engine %s", (configured, served, want) => {
    expect(requestContext(configured, served)).toEqual(want)
  })
})

describe("planRequest: max_tokens against the engine's per-request context", () => {
  const config = (model: Record<string, unknown>): AgentConfig => {
    const r = decodeConfigObject(
      { agent: { node_id: "n1" }, models: { m: { hf_repo: "org/m", served_name: "m", ...model } } },
      undefined,
      {}
    )
    if (Result.isFailure(r)) throw new Error(r.failure.message)
    return r.success
  }
  const req = (maxTokens: number) => GenerateRequest.fromPartial({ prompt: "a", sampling: { maxTokens } })

  it("above the engine's smaller limit: refused, naming it", () => {
    const r = planRequest(req(900), config({ max_model_len: 1024 }), {}, 512)
    expect(r).toBeInstanceOf(GenerateRejected)
    const e = r as GenerateRejected
    expect(e.reason).toBe("invalid_argument")
    expect(e.field).toBe("sampling.max_tokens")
    expect(e.message).toBe(
      "sampling.max_tokens 900 leaves no room for the prompt in the context one request can use on this node, 512 tokens, as the engine reports it; ask for at most 511"
    )
    expect(planRequest(req(512), config({ max_model_len: 1024 }), {}, 512)).toBeInstanceOf(GenerateRejected)
    expect(planRequest(req(511), config({ max_model_len: 1024 }), {}, 512)).not.toBeInstanceOf(GenerateRejected)
  })

  it("no configured value: the engine's alone; the configured one where it is smaller; neither: unchecked", () => {
    expect((planRequest(req(5000), config({}), {}, 4096) as GenerateRejected).message).toMatch(/4096 tokens/)
    expect((planRequest(req(3000), config({ max_model_len: 2048 }), {}, 4096) as GenerateRejected).message).toBe(
      "sampling.max_tokens 3000 leaves no room for the prompt in the model's context length 2048; ask for at most 2047"
    )
    expect(planRequest(req(3000), config({}), {})).not.toBeInstanceOf(GenerateRejected)
  })
})

/** An engine of the test's own: GET /v1/models answers `answer()` (status, body), counting the reads. */
const fakeEngine = async (answer: () => [number, unknown]) => {
  let reads = 0
  const server = http.createServer((req, res) => {
    if (req.url === "/v1/models") reads++
    const [status, body] = answer()
    res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(body))
  })
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r))
  const port = (server.address() as AddressInfo).port
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    reads: () => reads,
    close: () => new Promise<void>((r) => server.close(() => r()))
  }
}

const disposers: Array<() => Promise<void>> = []
afterEach(async () => {
  for (const d of disposers.splice(0).reverse()) await d()
})

/** The live layer in front of a fake engine answering `answer()`, its engine state under the test's control. */
const live = async (
  answer: () => [number, unknown],
  kind: "llama_cpp" | "mlx" = "llama_cpp",
  initial?: EngineState,
  rereadMs?: number,
  extra: { readonly env?: Record<string, string>; readonly lines?: Array<string> } = {}
) => {
  const engine = await fakeEngine(answer)
  disposers.push(engine.close)
  const plan = testPlan({ kind, baseUrl: engine.url, port: engine.port, env: extra.env ?? {} })
  const lines = extra.lines
  const logged =
    lines === undefined
      ? Layer.empty
      : Logger.layer([Logger.make(({ message }) => void lines.push(JSON.stringify(message)))])
  const model = kind === "mlx" ? { hf_repo: "org/m" } : { path: "/m.gguf", max_model_len: 1024 }
  const rt = ManagedRuntime.make(
    ServedContextLive.layerWith(rereadMs === undefined ? {} : { rereadMs }).pipe(
      Layer.provideMerge(engineLayerTest({ plan, ...(initial === undefined ? {} : { initial }) })),
      Layer.provide(
        layerFromObject({ agent: { node_id: "n1" }, engine: { kind, url: engine.url }, models: { m: model } })
      ),
      Layer.provide(logged)
    )
  )
  disposers.push(() => rt.dispose())
  const served = await rt.runPromise(ServedContext)
  const control = await rt.runPromise(EngineProcessControl)
  const set = (st: Parameters<typeof control.set>[0]) => rt.runPromise(control.set(st))
  return { engine, served, set, ready: () => set(State.Ready({ since: 1, run: 0 })) }
}

describe("the live layer: one read per Ready period, retried while it fails", () => {
  it("reads on Ready, again on a new period only; a failed read leaves the configured value and is tried again", async () => {
    let answer: [number, unknown] = [200, { data: [{ id: "m", meta: { n_ctx: 512 } }] }]
    const { engine, served, set } = await live(() => answer)
    // Starting: nothing read yet
    expect(served.current()).toBeUndefined()
    expect(engine.reads()).toBe(0)

    await set(State.Ready({ since: 1, run: 0 }))
    expect(await pollUntil("the engine's value", () => served.current() === 512)).toBe(true)
    // the same period again (a repeated state): no second read
    await set(State.Ready({ since: 1, run: 0 }))
    answer = [200, { data: [{ id: "m", meta: { n_ctx: 256 } }] }]
    await set(State.Unhealthy({ reason: "x", since: 2, run: 0 }))
    expect(engine.reads()).toBe(1)
    // recovered: a new Ready period, read again
    await set(State.Ready({ since: 3, run: 0 }))
    await pollUntil("the new value", () => served.current() === 256)
    expect(engine.reads()).toBe(2)
    // the next run's engine answers an error: the configured value is left in force ...
    answer = [500, { error: { message: "boom" } }]
    await set(State.Ready({ since: 4, run: 1 }))
    await pollUntil("the value dropped", () => served.current() === undefined)
    // ... and the read is tried again in the same period (1 s later), until the engine says it
    answer = [200, { data: [{ id: "m", meta: { n_ctx: 384 } }] }]
    await pollUntil("said on a retry, no new period", () => served.current() === 384, 10_000)
    // one whose list lacks the field: the configured value again, however often it is asked
    answer = [200, { data: [{ id: "m", meta: null }] }]
    const before = engine.reads()
    await set(State.Ready({ since: 5, run: 1 }))
    await pollUntil("a read of the new period", () => engine.reads() > before)
    expect(served.current()).toBeUndefined()
  })

  it("a failed read's log is scrubbed of the run's secrets (its environment's), as the calls' errors are", async () => {
    const secret = "hf_modellistsecret0123456789"
    const lines: Array<string> = []
    const { ready } = await live(
      () => [401, { error: { message: `token ${secret} is not valid` } }],
      "llama_cpp",
      undefined,
      undefined,
      { env: { HF_TOKEN: secret }, lines }
    )
    await ready()
    const line = await pollUntil("the failed read logged", () => lines.find((l) => l.includes("is not valid")))
    expect(line).toContain("token <redacted> is not valid")
    expect(lines.join("\n")).not.toContain(secret)
  })

  it("a list without the field is an answer: not asked again in that period, where a failed read is", async () => {
    // layers/engine/ServedContext.ts: "a list without it: a server whose list has no such field says so every time";
    // only a transport or HTTP error is tried again (1 s, then 2 s). A second engine that fails twice before it answers
    // is the clock: its answer comes after its retries at 1 s and 3 s, so a retry of the first (at 1 s) would be in.
    const fieldless = await live(() => [200, { data: [{ id: "m", meta: null }] }])
    let failures = 0
    const clock = await live(() =>
      ++failures <= 2 ? [500, { error: { message: "boom" } }] : [200, { data: [{ id: "m", meta: { n_ctx: 384 } }] }]
    )
    await Promise.all([fieldless.ready(), clock.ready()])
    await pollUntil("the second engine's value, on its second retry", () => clock.served.current() === 384, 15_000)
    expect(clock.engine.reads()).toBe(3)
    expect(fieldless.engine.reads()).toBe(1)
    expect(fieldless.served.current()).toBeUndefined()
  })

  it("once said, read again while Ready: a proxied server restarted with another context is followed; a failed re-read keeps it", async () => {
    // A server the agent does not run (openai_compat) may come back with another -c between two liveness probes: no
    // new Ready period shows it, so the figure is read again every rereadMs (30 s in the daemon).
    let answer: [number, unknown] = [200, { data: [{ id: "m", meta: { n_ctx: 256 } }] }]
    const { engine, served, ready } = await live(() => answer, "llama_cpp", undefined, 100)
    await ready()
    await pollUntil("the first figure", () => served.current() === 256)
    answer = [200, { data: [{ id: "m", meta: { n_ctx: 2048 } }] }]
    await pollUntil("the restarted server's figure, in the same period", () => served.current() === 2048, 5_000)
    answer = [503, { error: { message: "Loading model" } }]
    const reads = engine.reads()
    await pollUntil("two failed re-reads", () => engine.reads() >= reads + 2, 5_000)
    expect(served.current()).toBe(2048)
  })

  it("an engine that says none (mlx) is never asked", async () => {
    const { engine, served } = await live(
      () => [200, { data: [{ id: "m" }] }],
      "mlx",
      State.Ready({ since: 1, run: 0 })
    )
    expect(served.current()).toBeUndefined()
    expect(engine.reads()).toBe(0)
  })
})

describe("ListModels and Generate behind the gRPC server, vLLM simulator, models.m.max_model_len unset", () => {
  let sim: SimHandle | undefined
  afterAll(async () => {
    await sim?.stop()
  })

  it("ListModels reports the simulator's max_model_len; max_tokens above it is refused", async () => {
    // the simulator's own default, as vLLM's is the model's: no --max-model-len on its command line
    sim = await startSim({ flavor: "vllm", args: ["serve", "org/m", "--served-model-name", "m"] })
    const engineCard = (
      (await (await fetch(`${sim.url}/v1/models`)).json()) as { data: Array<{ max_model_len: number }> }
    ).data[0]
    expect(engineCard?.max_model_len).toBe(4096)
    const { deps } = agentDeps(sim.url, { agent: { max_tokens_limit: 100_000 } })
    const rt = ManagedRuntime.make(
      grpcLayerWith({ address: "127.0.0.1:0", shutdownGraceMs: 1_000 }).pipe(
        Layer.provideMerge(ServedContextLive.layer),
        Layer.provideMerge(Layer.mergeAll(deps, metricsLayerTest))
      )
    )
    disposers.push(() => rt.dispose())
    const server = await rt.runPromise(GrpcServer)
    const channel = createChannel(server.address)
    disposers.push(async () => channel.close())
    const client = createClient(AgentDefinition, channel)
    const models = await pollUntil("ListModels with the engine's context", async () => {
      const r = await client.listModels({})
      return r.models[0]?.maxModelLen === 4096 ? r.models : undefined
    })
    expect(models).toEqual([{ name: "m", source: "org/m", tp: 1, maxModelLen: 4096 }])
    const refused = await (async () => {
      try {
        for await (const _ of client.generate({ prompt: "a", sampling: { maxTokens: 5000 } })) {
          // nothing is streamed for a refused call
        }
        return undefined
      } catch (e) {
        return e as Error
      }
    })()
    expect(refused?.message).toMatch(
      /INVALID_ARGUMENT.*leaves no room for the prompt in the context one request can use on this node, 4096 tokens/
    )
  })
})
