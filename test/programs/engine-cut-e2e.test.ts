// The built agent (`node dist/main.js run`) on the simulator: a Generate call streaming when the engine run under it
// ends is cut, UNAVAILABLE as before, and its status says why instead of the HTTP client's "other side closed": an
// operator's POST /engine/restart (the agent cuts the call as it publishes the run's end, before the engine is
// signalled), and an engine killed under the call (SIGKILL: its sockets close before the orphan guard reports the
// exit). Requires dist/ (`npm run build`).
import type { Channel } from "nice-grpc"
import { ClientError } from "nice-grpc"
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { killAllAgents, requireDist, simAgentConfig, startAgent } from "../support/agent.ts"
import { agentClient, generate, grpcCode } from "../support/generate.ts"
import { pollUntil } from "../support/poll.ts"

beforeAll(() => requireDist())
const channels: Array<Channel> = []
afterEach(async () => {
  for (const c of channels.splice(0)) c.close()
  await killAllAgents()
})
afterAll(() => killAllAgents())

const words = (n: number) => Array.from({ length: n }, (_, i) => `w${i}`).join(" ")

/** An agent on the simulator at 50 ms per token, and one call of 400 tokens (20 s) that is streaming. */
const streamingCall = async () => {
  const { config, engineUrl, grpcPort } = await simAgentConfig({
    simArgs: ["--sim-itl", "50ms"],
    engine: { restart_backoff_initial: "100ms" }
  })
  const agent = await startAgent({ config, readyTimeoutMs: 45_000 })
  const { client, channel } = agentClient(`127.0.0.1:${grpcPort}`)
  channels.push(channel)
  const trailer: { retryable?: string | undefined } = {}
  const call = generate(
    client,
    { prompt: words(400), sampling: { maxTokens: 400 } },
    { onTrailer: (t) => (trailer.retryable = t.get("cgn-retryable")) }
  )
  await call.firstDelta
  const sim = (await (await fetch(`${engineUrl}/sim/state`)).json()) as { pid: number }
  return { agent, call: { ...call, trailer }, simPid: sim.pid }
}

const ended = async (call: Awaited<ReturnType<typeof streamingCall>>["call"]) => {
  const r = await call.done
  expect(r.tokens()).toBeLessThan(400)
  expect(r.error).toBeInstanceOf(ClientError)
  return { code: grpcCode(r.error), details: (r.error as ClientError).details, retryable: call.trailer.retryable }
}

describe("a call cut by the end of the engine run under it", () => {
  it("POST /engine/restart mid-stream: UNAVAILABLE, saying an operator restarts the engine", async () => {
    const { agent, call } = await streamingCall()
    const res = await fetch(`${agent.adminUrl}/engine/restart`, { method: "POST" })
    expect(res.status, agent.tail()).toBe(202)
    const r = await ended(call)
    expect(r.code, agent.tail()).toBe("UNAVAILABLE")
    expect(r.details).toMatch(
      /^the engine is being restarted \(POST \/engine\/restart by an operator\): .+; do not retry elsewhere: the call had already streamed output$/
    )
    expect(r.retryable).toBe("false")
    expect((await agent.stop()).code).toBe(0)
  }, 90_000)

  it("the engine killed mid-stream: UNAVAILABLE, saying the engine exited and how", async () => {
    const { agent, call, simPid } = await streamingCall()
    process.kill(simPid, "SIGKILL")
    const r = await ended(call)
    expect(r.code, agent.tail()).toBe("UNAVAILABLE")
    // deltas had gone out: the advice agrees with cgn-retryable false (the soak saw "retry on another node" beside it)
    expect(r.details, agent.tail()).toMatch(
      /^the engine exited \(signal SIGKILL\): .+; do not retry elsewhere: the call had already streamed output$/
    )
    expect(r.retryable).toBe("false")
    // the supervisor restarts it as after any exit
    await pollUntil("ready again", async () => (await fetch(`${agent.adminUrl}/readyz`)).status === 200, 45_000)
    expect((await agent.stop()).code).toBe(0)
  }, 90_000)
})
