// agent.client_send_timeout through the real gRPC server over loopback, in front of the simulator, with one admission
// slot and no queue: a caller that opens a Generate stream and never reads (its HTTP/2 window closes) has its stream
// reset (RST_STREAM CANCEL) once the timeout passes, its engine request aborted (the simulator counts it) and its slot
// freed: the next call is admitted and completes. Before the timeout existed, such a stream held the slot for ever.
import * as http2 from "node:http2"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { GenerateRequest } from "../../src/gen/cgn/agent/v1/agent.ts"
import { type Agent, collect, startAgent } from "../support/grpcAgent.ts"
import { getJson, pollUntil, type SimHandle, startSim } from "../support/sim.ts"

const simState = async (sim: SimHandle) => (await getJson(`${sim.url}/sim/state`)).json as Record<string, number>

/** Opens one Generate stream that never reads; resolves with its RST_STREAM code once the server ends it. */
const neverReading = (address: string, req: Partial<GenerateRequest>) => {
  const session = http2.connect(`http://${address}`)
  session.on("error", () => undefined)
  const stream = session.request({
    ":method": "POST",
    ":path": "/cgn.agent.v1.Agent/Generate",
    "content-type": "application/grpc",
    te: "trailers"
  })
  stream.on("error", () => undefined)
  const body = Buffer.from(GenerateRequest.encode(GenerateRequest.fromPartial(req)).finish())
  const prefix = Buffer.alloc(5)
  prefix.writeUInt32BE(body.length, 1)
  stream.end(Buffer.concat([prefix, body]))
  // no 'data' listener and paused: nothing is consumed, so the stream's flow-control window closes
  stream.pause()
  const closed = new Promise<number>((resolve) => stream.once("close", () => resolve(stream.rstCode ?? -1)))
  return { closed, close: () => session.destroy() }
}

describe("agent.client_send_timeout through the real gRPC server", () => {
  let sim: SimHandle
  let agent: Agent
  beforeAll(async () => {
    // a context room for the 400,000 tokens the stuck call asks for (vLLM holds a request to it)
    sim = await startSim({
      args: ["serve", "m", "--sim-mode", "random", "--sim-itl", "0ms", "--max-model-len", "500000"]
    })
    agent = await startAgent(sim.url, "vllm", {
      role: "both",
      max_inflight: 1,
      max_queue: 0,
      max_tokens_limit: 500_000,
      client_send_timeout: "1s"
    })
  }, 30_000)
  afterAll(async () => {
    await agent?.close()
    await sim?.stop()
  })

  it("a caller that stops reading has its stream reset, its engine request aborted and its slot freed", async () => {
    const before = await simState(sim)
    const stuck = neverReading(agent.address, {
      prompt: "alpha beta gamma",
      sampling: { maxTokens: 400_000, stop: [] }
    })
    try {
      const rst = await Promise.race([
        stuck.closed,
        new Promise<string>((resolve) => setTimeout(() => resolve("still open after 15 s"), 15_000))
      ])
      expect(rst).toBe(http2.constants.NGHTTP2_CANCEL)
      const after = await pollUntil(async () => {
        const s = await simState(sim)
        return s.aborted === before.aborted! + 1 && s.running === 0 ? s : undefined
      })
      expect(after.aborted).toBe(before.aborted! + 1)
      // the one slot is free again: the next call is admitted (max_queue 0 would refuse it) and completes
      const next = await collect(agent.client, { prompt: "alpha beta gamma", sampling: { maxTokens: 4, stop: [] } })
      expect([next.status, next.details]).toEqual(["OK", ""])
    } finally {
      stuck.close()
    }
  }, 30_000)
})
