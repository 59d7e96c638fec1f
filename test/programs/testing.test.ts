// cgn-agent/testing: the exported test layers replace the live ones. The real gRPC server runs on them
// over loopback (no engine, no etcd), and what the scripted engine received is checked.
import { Effect, Layer, ManagedRuntime } from "effect"
import { createChannel, createClient } from "nice-grpc"
import { describe, expect, it } from "vitest"
import { AgentDefinition, type GenerateResponse } from "../../src/gen/cgn/agent/v1/agent.ts"
import { layerWith as grpcLayerWith } from "../../src/layers/grpc/GrpcServer.ts"
import { EngineError } from "../../src/services/engine/EngineClient.ts"
import { State } from "../../src/services/engine/EngineState.ts"
import { GrpcServer } from "../../src/services/grpc/GrpcServer.ts"
import { HealthReporter } from "../../src/services/registry/HealthReporter.ts"
import { EngineClientRecorder, TestLayers, textChunk } from "../../src/testing/index.ts"

const config = { agent: { node_id: "t-1" }, models: { m: { hf_repo: "org/m" } } }

const agentOn = (script: Parameters<typeof TestLayers.EngineClient>[0]) =>
  ManagedRuntime.make(
    grpcLayerWith({ address: "127.0.0.1:0", shutdownGraceMs: 500 }).pipe(
      Layer.provideMerge(
        Layer.mergeAll(
          TestLayers.Config(config),
          TestLayers.EngineClient(script),
          TestLayers.EngineProcess({ initial: State.Ready({ since: Date.now(), run: 0 }) }),
          TestLayers.NodeStatus({ state: "ready" }),
          TestLayers.Admission({ maxInflight: 2, maxQueue: 0 })
        )
      )
    )
  )

const collect = async (it: AsyncIterable<GenerateResponse>) => {
  const out: GenerateResponse[] = []
  for await (const r of it) out.push(r)
  return out
}

describe("cgn-agent/testing", () => {
  it("runs the real gRPC server on the scripted engine and records the request", async () => {
    const rt = agentOn({ chunks: [textChunk("Hello"), textChunk(", world", "stop")] })
    try {
      const server = await rt.runPromise(GrpcServer)
      const channel = createChannel(server.address)
      const client = createClient(AgentDefinition, channel)
      const responses = await collect(client.generate({ requestId: "r-1", prompt: "hi", sampling: { maxTokens: 4 } }))
      channel.close()
      const text = responses.map((r) => r.delta?.text ?? "").join("")
      expect(text).toBe("Hello, world")
      expect(responses.at(-1)?.final).toMatchObject({ finishReason: "stop", nodeId: "t-1", requestId: "r-1" })
      const requests = await rt.runPromise(Effect.flatMap(EngineClientRecorder, (r) => r.requests))
      expect(requests).toHaveLength(1)
      expect(requests[0]).toMatchObject({
        kind: "stream",
        path: "/v1/completions",
        body: { prompt: "hi", max_tokens: 4 },
        options: { requestId: "r-1" }
      })
    } finally {
      await rt.dispose()
    }
  })

  it("carries a scripted engine error to the caller's gRPC status", async () => {
    const streamError = new EngineError({ reason: "Http", status: 400, message: "prompt too long" })
    const rt = agentOn({ chunks: [], streamError })
    try {
      const server = await rt.runPromise(GrpcServer)
      const channel = createChannel(server.address)
      const client = createClient(AgentDefinition, channel)
      await expect(collect(client.generate({ prompt: "hi" }))).rejects.toMatchObject({
        code: 3,
        details: expect.stringContaining("prompt too long")
      })
      channel.close()
    } finally {
      await rt.dispose()
    }
  })

  it("the in-memory reporter records flushes and the drain mark from NodeStatus", async () => {
    const rt = ManagedRuntime.make(
      TestLayers.HealthReporter.pipe(Layer.provideMerge(TestLayers.NodeStatus({ state: "ready", nodeId: "n-9" })))
    )
    try {
      const status = await rt.runPromise(
        Effect.gen(function* () {
          const reporter = yield* HealthReporter
          yield* reporter.flush
          yield* reporter.markDraining
          return { status: yield* reporter.status, last: yield* reporter.lastRecord }
        })
      )
      expect(status.status).toMatchObject({ state: "standalone", sequence: 2, writes: 2, publishedState: "draining" })
      expect(status.last?.nodeId).toBe("n-9")
    } finally {
      await rt.dispose()
    }
  })
})
