// The built agent (`node dist/main.js run`, openai_compat in front of a server of the test's own that closes every
// connection after its answer, so each call and probe needs a fresh socket) out of descriptors while it serves: its
// soft RLIMIT_NOFILE lowered under the descriptors it holds (`prlimit --pid`), so every new socket fails EMFILE and the
// ones it has (the caller's HTTP/2 connection) go on. Calls end `UNAVAILABLE`, `cgn-reason agent_resources`, never
// counted against the engine; before services/node/AgentShortage.ts the node read `ready` throughout, drawing traffic
// it failed in microseconds. Now engine.failed_calls_unhealthy such calls take the node `unhealthy` with the reason
// (the engine not restarted), and once the limit is raised again the agent's own connection test clears it within
// engine.liveness_interval. Requires dist/ and prlimit (util-linux).
import { spawnSync } from "node:child_process"
import * as http from "node:http"
import type { AddressInfo } from "node:net"
import { type Channel, ClientError, type Metadata, Status } from "nice-grpc"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type AgentHandle, killAllAgents, requireDist, startAgent } from "../support/agent.ts"
import { agentClient, generate } from "../support/generate.ts"
import { pollUntil } from "../support/poll.ts"
import { freePorts } from "../support/ports.ts"

const hasPrlimit = spawnSync("prlimit", ["--version"], { stdio: "ignore" }).status === 0

const chunk = (text: string, finish: string | null): string =>
  `data: ${JSON.stringify({ id: "c", object: "text_completion", model: "m", choices: [{ index: 0, text, finish_reason: finish }] })}\n\n`

let engine: http.Server
let agent: AgentHandle
let channel: Channel
let client: ReturnType<typeof agentClient>["client"]
/** The agent's soft descriptor limit before the test lowered it. */
let softLimit = ""
let completions = 0

/** Sets the agent's soft RLIMIT_NOFILE (the hard one kept, so raising it again needs no privilege). */
const setSoftLimit = (value: string): void => {
  const r = spawnSync("prlimit", ["--pid", String(agent.pid), `--nofile=${value}:`], { encoding: "utf8" })
  if (r.status !== 0) throw new Error(`prlimit failed: ${r.stderr}`)
}

beforeAll(async () => {
  if (!hasPrlimit) return
  requireDist()
  engine = http.createServer((req, res) => {
    // every answer closes its connection: the agent's next request needs a new socket
    res.shouldKeepAlive = false
    if (req.method === "GET" && req.url === "/v1/models") {
      res.writeHead(200, { "content-type": "application/json" })
      res.end(JSON.stringify({ object: "list", data: [{ id: "m", object: "model" }] }))
      return
    }
    req.resume()
    req.on("end", () => {
      completions++
      res.writeHead(200, { "content-type": "text/event-stream" })
      res.end(`${chunk("one", null)}${chunk(" two", "length")}data: [DONE]\n\n`)
    })
  })
  await new Promise<void>((resolve) => engine.listen(0, "127.0.0.1", resolve))
  const [grpcPort, adminPort] = (await freePorts(2)) as [number, number]
  agent = await startAgent({
    config: {
      agent: {
        listen_grpc: `127.0.0.1:${grpcPort}`,
        listen_admin: `127.0.0.1:${adminPort}`,
        node_id: "short-1",
        state_dir: "state"
      },
      engine: {
        kind: "openai_compat",
        url: `http://127.0.0.1:${(engine.address() as AddressInfo).port}`,
        failed_calls_unhealthy: 2,
        // the shortage test's cadence; liveness probes would take 30 failures in a row: the calls decide here
        liveness_interval: "1s",
        liveness_failures: 30
      },
      models: { m: { hf_repo: "org/m" } }
    }
  })
  ;({ client, channel } = agentClient(agent.grpcAddress))
  const limits = spawnSync("prlimit", ["--pid", String(agent.pid), "--nofile", "--output=SOFT", "--noheadings"], {
    encoding: "utf8"
  })
  softLimit = limits.stdout.trim()
})

afterAll(async () => {
  channel?.close()
  await killAllAgents()
  engine?.closeAllConnections()
  if (engine !== undefined) await new Promise<void>((resolve) => engine.close(() => resolve()))
})

const nodeHealth = () => client.getNodeHealth({})

describe.skipIf(!hasPrlimit)("an agent out of descriptors while serving", () => {
  it("reads unhealthy after failed_calls_unhealthy calls it could not send, and ready once it can open sockets again", async () => {
    // the caller's connection is open, and a call goes through
    const first = await generate(client, { prompt: "a", sampling: { maxTokens: 2 } }).done
    expect(first.error).toBeUndefined()
    expect((await nodeHealth()).state).toBe("ready")
    const served = completions

    // 3: stdin, stdout and stderr, open for the process's life; every other descriptor number is now out of reach
    setSoftLimit("3")
    const failures: Array<{ code: Status; reason: string | undefined; source: string | undefined }> = []
    for (let i = 0; i < 2; i++) {
      let trailer: Metadata | undefined
      const r = await generate(
        client,
        { prompt: "b", sampling: { maxTokens: 2 } },
        { onTrailer: (t: Metadata) => (trailer = t) }
      ).done
      expect(r.error).toBeInstanceOf(ClientError)
      failures.push({
        code: (r.error as ClientError).code,
        reason: trailer?.get("cgn-reason"),
        source: trailer?.get("cgn-error-source")
      })
    }
    expect(failures).toEqual([
      { code: Status.UNAVAILABLE, reason: "agent_resources", source: "agent" },
      { code: Status.UNAVAILABLE, reason: "agent_resources", source: "agent" }
    ])
    expect(completions).toBe(served) // nothing reached the engine

    // the watchdog's next tick (within a second) takes the node unhealthy with the reason; the engine is not restarted
    const unhealthy = await pollUntil("the node unhealthy for the agent's shortage", async () => {
      const h = await nodeHealth()
      return h.state === "unhealthy" ? h : undefined
    })
    expect(unhealthy.engine?.detail).toMatch(/^the agent is short of resources to reach its engine .*EMFILE/)
    expect(unhealthy.engine?.restarts).toBe(0)
    await agent.waitForLine((l) => l.includes('"node unhealthy: the agent is short of resources'))

    // the limit raised again: the shortage test (every liveness_interval) finds a socket and clears it
    setSoftLimit(softLimit)
    await pollUntil("the node ready again", async () => (await nodeHealth()).state === "ready", 10_000)
    await agent.waitForLine((l) => l.includes("the agent can open connections to its engine again"))
    const after = await generate(client, { prompt: "c", sampling: { maxTokens: 2 } }).done
    expect(after.error).toBeUndefined()
    expect(completions).toBe(served + 1)
  })
})
