// One caller's overlong value must fail that call alone. The agent echoed a request's `model` or chat `role` whole
// into grpc-message: a 120k-character model name, or 25k "é" (150 KB once percent-encoded), made a status header
// block a grpc-js client could not take (nghttp2 refuses a field over 64 KiB HPACK-coded), so it closed the whole
// connection and the 20 other calls on it ended INTERNAL mid-stream, too late to retry elsewhere. Here the real
// server, in front of the vLLM simulator, and one nice-grpc (grpc-js) channel carry 20 streaming calls and the two
// bad ones: those get their own status with a short message naming the field, and the 20 finish OK.
import { ClientError, Status } from "nice-grpc"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { GenerateRequest } from "../../src/gen/cgn/agent/v1/agent.ts"
import { MAX_STATUS_MESSAGE_BYTES } from "../../src/services/grpc/StatusMessage.ts"
import { type Agent, collect, startAgent } from "../support/grpcAgent.ts"
import { type SimHandle, startSim } from "../support/sim.ts"

const STREAMS = 20
const TOKENS = 400 // at 10 ms a token: ~4 s, far longer than the bad calls take

describe("an overlong model or role fails its own call, not the connection's others", () => {
  let sim: SimHandle
  let agent: Agent

  beforeAll(async () => {
    sim = await startSim({ args: ["serve", "m", "--sim-mode", "random", "--sim-itl", "10ms"] })
    agent = await startAgent(sim.url, "vllm", { role: "both", max_tokens_limit: 1000 })
  }, 30_000)
  afterAll(async () => {
    await agent?.close()
    await sim?.stop()
  })

  it("20 streams on the channel finish OK; the bad calls get NOT_FOUND / INVALID_ARGUMENT, bounded", async () => {
    const req: Partial<GenerateRequest> = { prompt: "alpha beta", sampling: { maxTokens: TOKENS, stop: [] } }
    let running = 0
    const started: Array<Promise<void>> = []
    const streams = Array.from({ length: STREAMS }, (_, i) => {
      let first: () => void = () => undefined
      started[i] = new Promise<void>((resolve) => (first = resolve))
      return (async () => {
        let deltas = 0
        try {
          for await (const r of agent.client.generate(req)) {
            if (r.delta !== undefined && deltas++ === 0) {
              running++
              first()
            }
          }
          return { status: "OK", deltas }
        } catch (e) {
          if (!(e instanceof ClientError)) throw e
          return { status: Status[e.code], details: e.details, deltas }
        } finally {
          if (deltas > 0) running--
          first()
        }
      })()
    })
    // Every stream has streamed text before the bad calls go out on the same channel (one connection).
    await Promise.all(started)
    expect(running).toBe(STREAMS)

    const [model, role] = await Promise.all([
      collect(agent.client, { model: `M${"x".repeat(120_000)}`, prompt: "a" }),
      collect(agent.client, { chat: { messages: [{ role: "é".repeat(25_000), content: "hi" }] } })
    ])
    const runningThen = running
    const results = await Promise.all(streams)
    expect(results.filter((r) => r.status !== "OK")).toEqual([])
    for (const r of results) expect(r.deltas).toBeGreaterThan(1)
    // The bad calls were answered while all 20 were still streaming: they are what the connection carried.
    expect(runningThen).toBe(STREAMS)

    expect(model.status).toBe("NOT_FOUND")
    expect(model.details).toMatch(/^model "Mx+"\.\.\. \(120001 characters\) is not served here; this node serves "m"$/)
    expect(model.trailer?.get("cgn-field")).toBe("model")
    expect(role.status).toBe("INVALID_ARGUMENT")
    expect(role.details).toMatch(/^chat\.messages\[0\]\.role "(\\u00e9)+"\.\.\. \(25000 characters\) is not one of /)
    expect(role.trailer?.get("cgn-field")).toBe("chat.messages[0].role")
    for (const bad of [model, role]) expect(bad.details.length).toBeLessThanOrEqual(MAX_STATUS_MESSAGE_BYTES)
  }, 60_000)
})
