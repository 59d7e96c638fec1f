// An operator's restart under load against the real llama-server: the built agent (dist/main.js) spawns llama-server
// (built by `npm run real-engine:build`, test/real/engine.ts) with two long streams in flight, then POST
// /engine/restart on the admin port (loopback, no admin_token: none needed). llama-server does not exit on SIGTERM
// while a streaming connection is open (its task loop stops, the connection threads wait for results that never come:
// a chaos soak saw every restart under load end in SIGKILL after the whole engine.stop_grace, the calls getting
// nothing meanwhile). The agent cuts the calls the moment it publishes the run's ending (layers/grpc/EngineCut.ts
// cutOnRunEnd): each ends UNAVAILABLE with why at once, llama-server sees its connections close and exits on the
// SIGTERM. stop_grace is 20 s here, so a kill would be obvious: the next run is Ready well before it could pass.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { type Channel, ClientError } from "nice-grpc"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { killAllAgents, requireDist, startAgent } from "../support/agent.ts"
import { agentClient, generate, grpcCode } from "../support/generate.ts"
import { pollUntil } from "../support/poll.ts"
import { llamaAgentConfig, type RealEngine, realEngine, serverPids, tinyModel } from "./engine.ts"

interface Exit {
  readonly run: number
  readonly code: number | null
  readonly signal: string | null
  readonly reason: string
  readonly endedAt: string
}

const STOP_GRACE_MS = 20_000

let engine: RealEngine
let dir: string
const channels: Array<Channel> = []

beforeAll(() => {
  requireDist()
  engine = realEngine()
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-real-restart-"))
}, 30 * 60_000)
afterAll(async () => {
  for (const c of channels) c.close()
  await killAllAgents()
  if (dir) fs.rmSync(dir, { recursive: true, force: true })
})

describe("POST /engine/restart with streams in flight on the real llama-server", () => {
  it("the calls end at once with why, and llama-server exits on the SIGTERM, not killed after stop_grace", async () => {
    const c = await llamaAgentConfig({
      engine,
      model: tinyModel(engine, dir, "words"),
      slots: 2,
      contextSize: 4096,
      engineSection: { stop_grace: `${STOP_GRACE_MS / 1000}s`, restart_backoff_initial: "100ms" }
    })
    const agent = await startAgent({ config: c.config, readyTimeoutMs: 60_000 })
    const { client, channel } = agentClient(agent.grpcAddress)
    channels.push(channel)
    const [pid] = serverPids(c.enginePort)
    expect(pid, agent.tail()).toBeDefined()

    // two streams far longer than the test (2000 tokens each), both streaming
    const calls = [0, 1].map((i) =>
      generate(client, { prompt: `the quick brown fox ${i}`, sampling: { maxTokens: 2000 } })
    )
    await Promise.all(calls.map((call) => call.firstDelta))
    const asked = Date.now()
    const res = await fetch(`${agent.adminUrl}/engine/restart`, { method: "POST" })
    expect(res.status, agent.tail()).toBe(202)

    const ended = await Promise.all(calls.map((call) => call.done))
    const endedMs = Date.now() - asked
    // before the cut the calls ended only with the engine's kill, the whole stop_grace later
    expect(endedMs, `${ended.map((r) => String(r.error)).join("\n")}\n${agent.tail()}`).toBeLessThan(STOP_GRACE_MS / 4)
    for (const r of ended) {
      expect(r.error, agent.tail()).toBeInstanceOf(ClientError)
      expect(grpcCode(r.error)).toBe("UNAVAILABLE")
      expect((r.error as ClientError).details).toBe(
        // deltas had gone out: the advice agrees with cgn-retryable false (StatusMessage.ts asSent)
        "the engine is being restarted (POST /engine/restart by an operator): the engine request was aborted; do not retry elsewhere: the call had already streamed output"
      )
      expect(r.tokens()).toBeLessThan(2000)
    }

    // the old run gone and the next one Ready, well within the stop_grace a kill would have waited out
    await pollUntil(
      "the next run Ready",
      async () => (await fetch(`${agent.adminUrl}/readyz`)).status === 200 && !serverPids(c.enginePort).includes(pid!),
      STOP_GRACE_MS / 2
    )
    const status = (await (await fetch(`${agent.adminUrl}/status`)).json()) as {
      readonly engine: { readonly exits: ReadonlyArray<Exit> }
    }
    const [exit] = status.engine.exits
    expect(exit?.run).toBe(0)
    expect(exit?.reason).toMatch(/^restarted: /)
    expect(exit?.signal, JSON.stringify(exit)).not.toBe("SIGKILL")
    // the guard's report of the group's end: gone on the SIGTERM, not "killed" (run.ts logs it before the exit)
    const stopped = await agent.waitForLine((l) => /engine group \d+ stopped: /.test(l), 5_000)
    expect(stopped).toMatch(/engine group \d+ stopped: terminated/)
    const exitMs = Date.parse(String(exit?.endedAt)) - asked
    console.log(
      `restart under load: calls ended ${endedMs} ms, the run ${exitMs} ms after POST /engine/restart (${exit?.code ?? exit?.signal})`
    )

    // and the next run serves
    const after = await generate(client, { prompt: "the quick brown fox", sampling: { maxTokens: 8 } }).done
    expect(after.error, agent.tail()).toBeUndefined()
    expect((await agent.stop("SIGTERM", 30_000)).code).toBe(0)
  }, 120_000)
})
