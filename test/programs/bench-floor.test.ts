// bench/floor.ts, the relay the bench reads the agent against, relays what the engine streams whichever server
// it is run with (grpc-js, node:http2, or HTTP/2 framed by hand on node:net): every token and the final message,
// over one HTTP/2 connection, calls at once, a call larger than the client's flow-control windows (64 KiB), and
// a client whose stream window is 100 bytes, which the hand-framed server must wait out on its WINDOW_UPDATEs.
import { type ChildProcess, spawn } from "node:child_process"
import * as path from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { leanClient } from "../../bench/grpc-client.ts"
import { GenerateRequest, type GenerateResponse } from "../../src/gen/cgn/agent/v1/agent.ts"
import { repoRoot } from "../support/agent.ts"
import { freePorts } from "../support/ports.ts"
import { pollUntil, type SimHandle, startSim } from "../support/sim.ts"

let sim: SimHandle
beforeAll(async () => {
  sim = await startSim({
    flavor: "vllm",
    args: [
      "serve",
      "org/m",
      "--served-model-name",
      "m",
      "--sim-mode",
      "random",
      "--sim-itl",
      "0ms",
      "--max-model-len",
      "32768"
    ]
  })
})
afterAll(() => sim?.stop())

/**
 * A floor on two free ports, ready: its /readyz answered with its own pid. A port another test's process took between
 * the check and the floor's bind (the floor then exits) is met by starting again on others: a CI run once read another
 * process's 200 on the admin port as the floor's and found nothing on the gRPC one.
 */
const startFloor = async (server: string, relay: string) => {
  for (let attempt = 1; ; attempt++) {
    const [grpc, admin] = (await freePorts(2)) as [number, number]
    const child: ChildProcess = spawn(
      process.execPath,
      [path.join(repoRoot, "bench/floor.ts"), "--grpc", String(grpc), "--admin", String(admin), "--engine", sim.url],
      { env: { ...process.env, FLOOR_SERVER: server, FLOOR_RELAY: relay }, stdio: "ignore" }
    )
    const exited = new Promise<"exited">((resolve) => child.once("exit", () => resolve("exited")))
    const ready = pollUntil(async () => {
      const r = await fetch(`http://127.0.0.1:${admin}/readyz`).catch(() => undefined)
      return r?.ok === true && (await r.text()) === String(child.pid) ? ("ready" as const) : undefined
    })
    ready.catch(() => undefined) // left pending when the floor exits first: its timeout is then nobody's failure
    if ((await Promise.race([ready, exited])) === "ready") return { child, address: `127.0.0.1:${grpc}` }
    if (attempt === 3) throw new Error(`bench/floor.ts exited at start ${attempt} times`)
  }
}

/** One call's tokens and finish reason, as the client read them. */
const generate = async (client: ReturnType<typeof leanClient>, maxTokens: number) => {
  const messages: Array<GenerateResponse> = []
  await client.generate(GenerateRequest.fromPartial({ model: "m", prompt: "hi", sampling: { maxTokens } }), (m) =>
    messages.push(m)
  )
  const tokens = messages.reduce((n, m) => n + (m.delta?.tokens ?? 0), 0)
  return { tokens, finish: messages.at(-1)?.final?.finishReason }
}

describe.each(["grpc-js", "http2", "net-h2"])("bench/floor.ts, FLOOR_SERVER=%s", (server) => {
  it.each(["parsed", "raw"])("relays every token and the final message (FLOOR_RELAY=%s)", async (relay) => {
    const floor = await startFloor(server, relay)
    const client = leanClient(floor.address)
    try {
      const together = await Promise.all([5, 40, 300].map((n) => generate(client, n)))
      // raw writes one one-token delta per engine read, whatever the read held: at least one, at most the tokens
      if (relay === "parsed") expect(together).toEqual([5, 40, 300].map((n) => ({ tokens: n, finish: "length" })))
      else
        for (const [i, n] of [5, 40, 300].entries()) {
          expect(together[i]?.finish).toBe("stop")
          expect(together[i]?.tokens).toBeGreaterThanOrEqual(1)
          expect(together[i]?.tokens).toBeLessThanOrEqual(n)
        }
      // ~20k tokens of text: several times the client's 64 KiB stream and connection windows
      if (relay === "parsed") expect(await generate(client, 20_000)).toEqual({ tokens: 20_000, finish: "length" })
    } finally {
      client.close()
      floor.child.kill("SIGKILL")
    }
  })

  it("waits out a client's 100-byte stream window: every message sent once a WINDOW_UPDATE lets it", async () => {
    const floor = await startFloor(server, "parsed")
    const client = leanClient(floor.address, { initialWindowSize: 100 })
    try {
      expect(await generate(client, 2_000)).toEqual({ tokens: 2_000, finish: "length" })
    } finally {
      client.close()
      floor.child.kill("SIGKILL")
    }
  })
})
