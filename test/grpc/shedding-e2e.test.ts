// Deadline shedding through the real gRPC server, in front of a vLLM simulator whose prefill takes 600 ms, with one
// admission slot and handoff_timeout 1.5 s. Once the agent has measured what a prefill leg needs, a leg that
// reaches the slot with less time left fails DEADLINE_EXCEEDED there and the engine never sees it (before, it held
// the engine until its deadline aborted it); one whose own deadline (grpc-timeout) is below that need while the
// slot is busy is refused RESOURCE_EXHAUSTED at once. Margins of 300 ms either side of each decision (a loaded
// 2-core CI machine).
import * as grpc from "@grpc/grpc-js"
import { Status } from "nice-grpc"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { GenerateRequest, GenerateResponse } from "../../src/gen/cgn/agent/v1/agent.ts"
import { MIN_SAMPLES } from "../../src/services/grpc/ServiceTimes.ts"
import { type Agent, collect, startAgent } from "../support/grpcAgent.ts"
import { freePort } from "../support/ports.ts"
import { getJson, pollUntil, type SimHandle, startSim } from "../support/sim.ts"

/** One Generate through grpc-js, which sends grpc-timeout from a deadline (nice-grpc sends none): status, details. */
const rawGenerate = (address: string, options: grpc.CallOptions): Promise<[string, string]> => {
  const raw = new grpc.Client(address, grpc.credentials.createInsecure())
  return new Promise<[string, string]>((resolve) => {
    const call = raw.makeServerStreamRequest(
      "/cgn.agent.v1.Agent/Generate",
      (m: GenerateRequest) => Buffer.from(GenerateRequest.encode(m).finish()),
      (b: Buffer) => GenerateResponse.decode(b),
      GenerateRequest.fromPartial({ prompt: "alpha beta gamma" }),
      new grpc.Metadata(),
      options
    )
    call.on("data", () => undefined)
    call.on("error", () => undefined)
    call.on("status", (st: grpc.StatusObject) => resolve([Status[st.code] ?? String(st.code), st.details]))
  }).finally(() => raw.close())
}

const simState = async (sim: SimHandle) => (await getJson(`${sim.url}/sim/state`)).json as Record<string, number>

describe("deadline shedding through the real gRPC server (vLLM prefill legs)", () => {
  let sim: SimHandle
  let agent: Agent
  const kvCfg = JSON.stringify({ kv_connector: "NixlConnector", kv_role: "kv_both", kv_load_failure_policy: "fail" })
  const req: Partial<GenerateRequest> = { prompt: "alpha beta gamma", sampling: { maxTokens: 4, stop: [] } }

  beforeAll(async () => {
    const side = await freePort()
    sim = await startSim({
      args: ["serve", "m", "--kv-transfer-config", kvCfg, "--sim-mode", "echo", "--sim-ttft", "600ms"],
      env: { VLLM_NIXL_SIDE_CHANNEL_HOST: "127.0.0.1", VLLM_NIXL_SIDE_CHANNEL_PORT: String(side) }
    })
    agent = await startAgent(sim.url, "vllm", {
      role: "prefill",
      max_inflight: 1,
      max_queue: 8,
      handoff_timeout: "1500ms"
    })
    // What a leg needs here: MIN_SAMPLES legs served one after another (~600 ms each).
    for (let i = 0; i < MIN_SAMPLES; i++) expect((await collect(agent.client, req)).status).toBe("OK")
  }, 30_000)
  afterAll(async () => {
    await agent?.close()
    await sim?.stop()
  })

  it("a queued leg that reaches the slot too late is shed there, never sent; the one before it runs", async () => {
    const before = await simState(sim)
    // One connection: the agent takes them in this order. a: 0-600 ms; b reaches the slot at ~600 with ~900 ms
    // left (>= 600): served 600-1200; c reaches it at ~1200 with ~300 ms left (< 600): shed.
    const [a, b, c] = await Promise.all([1, 2, 3].map(() => collect(agent.client, req)))
    expect([a?.status, b?.status]).toEqual(["OK", "OK"])
    expect([c?.status, c?.details]).toEqual([
      "DEADLINE_EXCEEDED",
      expect.stringMatching(
        /^~\d+ ms left of its deadline \(agent.handoff_timeout = 1s 500ms\) after \d+ ms waiting for a slot.*prefill legs here need ~\d+ ms.*not sent to the engine$/
      )
    ])
    expect(c?.trailer?.get("cgn-error-source")).toBe("agent")
    const after = await pollUntil(async () => {
      const s = await simState(sim)
      return s.served === before.served! + 2 ? s : undefined
    })
    expect(after.aborted).toBe(before.aborted)
  })

  it("a leg whose own deadline is below what legs need, with the slot busy: RESOURCE_EXHAUSTED at once", async () => {
    const holder = collect(agent.client, req)
    await pollUntil(async () => ((await simState(sim)).running! > 0 ? true : undefined))
    const started = Date.now()
    const [code, details] = await rawGenerate(agent.address, { deadline: Date.now() + 300 })
    expect([code, details]).toEqual([
      "RESOURCE_EXHAUSTED",
      expect.stringMatching(/^not queued: all 1 slots are busy .*the caller's deadline.*retry on another node$/)
    ])
    // At once: before its own 300 ms deadline would have ended it.
    expect(Date.now() - started).toBeLessThan(300)
    expect((await holder).status).toBe("OK")
  })
})
