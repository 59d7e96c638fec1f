import { Effect, Layer } from "effect"
import { describe, expect, it } from "vitest"
import { layerFromObject } from "../../src/layers/config/Config.ts"
import { ActiveCalls } from "../../src/layers/grpc/ActiveCalls.ts"
import type { GenerateServerCall } from "../../src/layers/grpc/AgentService.ts"
import { makeHandler } from "../../src/layers/grpc/GenerateCall.ts"
import type { ServingState } from "../../src/layers/grpc/ServingState.ts"
import { StreamAborted } from "../../src/services/grpc/CallErrors.ts"
import { statusName } from "../../src/services/grpc/GrpcStatus.ts"
import { EngineClientRecorder, layerTest, textChunk } from "../../src/testing/EngineClient.ts"
import { FakeCall } from "../support/fakeCall.ts"
import { pollUntil } from "../support/poll.ts"

const serving = { refusal: () => undefined } as unknown as ServingState

describe("GenerateCall", () => {
  it("a call aborted by the drain before its paced start ends with the abort's status and never reaches the engine", async () => {
    const active = new ActiveCalls()
    const deps = Layer.mergeAll(
      layerFromObject({
        agent: { node_id: "n" },
        engine: { kind: "vllm", url: "http://127.0.0.1:1" },
        models: { m: { hf_repo: "org/m" } }
      }),
      layerTest({ chunks: [textChunk("a"), textChunk("b", "stop")] })
    )
    const { handler, recorder } = await Effect.runPromise(
      Effect.gen(function* () {
        return { handler: yield* makeHandler(serving, active, 1024), recorder: yield* EngineClientRecorder }
      }).pipe(Effect.scoped, Effect.provide(deps))
    )
    // A burst in one turn: far more than one turn's start budget (0.5 ms), so most starts wait for later turns.
    const calls = Array.from({ length: 3000 }, () => new FakeCall())
    for (const c of calls) handler.handle(c as unknown as GenerateServerCall)
    const waiting = active.size
    expect(waiting).toBeGreaterThan(0)
    // The drain's last step, in the same turn: every call still active is aborted.
    for (const relay of active.relays) relay.abort(new StreamAborted({ reason: "drained" }))
    await pollUntil("every call to end", () => calls.every((c) => c.status !== undefined))
    const ended = calls.map((c) => `${statusName(c.status!.code)} ${c.status!.message}`.trim())
    const aborted = ended.filter((s) => s === "UNAVAILABLE drained").length
    expect(aborted + ended.filter((s) => s === "OK").length).toBe(calls.length)
    expect(aborted).toBe(waiting)
    // Only the calls whose start had run by then (one turn's budget of them) made an engine request.
    const requests = (await Effect.runPromise(recorder.requests)).length
    expect(requests).toBeLessThan(calls.length / 2)
    // An aborted call relayed nothing.
    expect(calls.filter((c) => c.status?.message === "drained" && c.frames > 0)).toEqual([])
  })
})
