// Fault switches of the simulator, on the command line and through POST /sim/faults: crashes (after N
// requests, after T, now), stalled streams, error kinds, hanging health, SIGTERM ignored, and a grandchild
// that outlives the simulator unless its whole process group is killed.
import { execFileSync } from "node:child_process"
import * as http from "node:http"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { processAlive } from "../support/agent.ts"
import { getJson, pollUntil, postJson, type SimHandle, sseData, startSim } from "../support/sim.ts"
import { simGguf } from "../support/simModel.ts"

const started: Array<SimHandle> = []
const start = async (args: Array<string>) => {
  const s = await startSim({ args: ["serve", "m", ...args] })
  started.push(s)
  return s
}
afterAll(() => Promise.all(started.map((s) => s.stop(200))))

// A zombie counts as gone: the grandchild is reparented when the simulator exits, and kill(pid, 0)
// succeeds on a zombie until its new parent reaps it.
const alive = processAlive
describe("crashes", () => {
  it("exits 1 after N requests", async () => {
    const s = await start(["--sim-crash-after-requests", "2"])
    expect((await postJson(`${s.url}/v1/completions`, { prompt: "a" })).status).toBe(200)
    expect((await postJson(`${s.url}/v1/completions`, { prompt: "b" })).status).toBe(200)
    expect((await s.exited).code).toBe(1)
  })

  it("exits 1 after a duration, and at once on crashNow", async () => {
    const [a, b] = await Promise.all([start(["--sim-crash-after", "300ms"]), start([])])
    expect((await a.exited).code).toBe(1)
    const r = await postJson(`${b.url}/sim/faults`, { crashNow: true })
    expect(r.status).toBe(200)
    expect((await b.exited).code).toBe(1)
  })
})

describe("errors, stalls and health", () => {
  let s: SimHandle
  beforeAll(async () => {
    s = await start([
      "--sim-error-rate",
      "1",
      "--sim-error-kind",
      "http429",
      "--sim-hang-health",
      "--sim-stall-after-tokens",
      "2"
    ])
  })
  const setFaults = async (f: Record<string, unknown>) =>
    expect((await postJson(`${s.url}/sim/faults`, f)).status).toBe(200)

  it.each([
    ["http429", 429],
    ["http400", 400],
    ["http404", 404],
    ["http500", 500]
  ])("%s returns the flavor's error body", async (kind, status) => {
    await setFaults({ errorKind: kind })
    const r = await postJson(`${s.url}/v1/completions`, { prompt: "a" })
    expect(r.status).toBe(status)
    expect(r.json).toMatchObject({ error: { code: status, type: expect.any(String), message: expect.any(String) } })
  })

  it("midstream sends data: {error} then [DONE]; reset drops the connection", async () => {
    await setFaults({ errorKind: "midstream" })
    const r = await postJson(`${s.url}/v1/completions`, { prompt: "a b c", stream: true })
    const data = sseData(r.text)
    expect(data.at(-1)).toBe("[DONE]")
    expect(JSON.parse(data.at(-2) ?? "{}")).toMatchObject({ error: { code: 500 } })
    await setFaults({ errorKind: "reset" })
    await expect(postJson(`${s.url}/v1/completions`, { prompt: "a b c", stream: true })).rejects.toThrow()
    await expect(postJson(`${s.url}/v1/completions`, { prompt: "a b c" })).rejects.toThrow()
    await setFaults({ errorRate: 0 })
  })

  it("stalls a stream after N tokens, keeping it open", async () => {
    const tokens = await new Promise<number>((resolve, reject) => {
      const req = http.request(
        `${s.url}/v1/completions`,
        { method: "POST", headers: { "content-type": "application/json" } },
        (res) => {
          let text = ""
          res.setEncoding("utf8")
          res.on("data", (c: string) => {
            text += c
            const n = sseData(text).length
            if (n >= 2) {
              // Both tokens arrived; the stream must still be running on the engine.
              getJson(`${s.url}/sim/state`)
                .then(({ json }) => {
                  expect(json).toMatchObject({ running: 1 })
                  expect(text).not.toContain("[DONE]")
                  req.destroy()
                  resolve(n)
                })
                .catch(reject)
            }
          })
        }
      )
      req.on("error", () => {})
      req.end(JSON.stringify({ prompt: "a b c d e f", stream: true }))
    })
    expect(tokens).toBe(2)
    await pollUntil(async () =>
      ((await getJson(`${s.url}/sim/state`)).json as { running: number }).running === 0 ? true : undefined
    )
  })

  it("hangs health until the switch is turned off", async () => {
    await expect(fetch(`${s.url}/health`, { signal: AbortSignal.timeout(300) })).rejects.toThrow()
    await setFaults({ hangHealth: false })
    expect((await fetch(`${s.url}/health`)).status).toBe(200)
  })

  it("rejects a malformed /sim/faults body", async () => {
    expect((await postJson(`${s.url}/sim/faults`, { errorKind: "boom" })).status).toBe(400)
  })
})

describe("a fault kind fails every answer it is set for, a one-token answer too", () => {
  const flavors: Array<[string, Array<string>]> = [
    ["vllm", ["serve", "m"]],
    ["sglang", ["--model-path", "m"]],
    ["llama_cpp", ["-m", simGguf("m.gguf")]],
    ["mlx", ["--model", "m"]]
  ]
  // echo: "a" is one token, which the answer ends at (max_tokens 2)
  const one = { prompt: "a", max_tokens: 2 }
  it.each(flavors)("%s: midstream (llama_cpp also sse_error_field), streamed and whole", async (flavor, args) => {
    const s = await startSim({ args: [...args, "--sim-error-rate", "1", "--sim-error-kind", "midstream"] })
    started.push(s)
    const kinds = flavor === "llama_cpp" ? ["midstream", "sse_error_field"] : ["midstream"]
    for (const kind of kinds) {
      expect((await postJson(`${s.url}/sim/faults`, { errorKind: kind })).status).toBe(200)
      const stream = await postJson(`${s.url}/v1/completions`, { ...one, stream: true })
      const errorEvent = /^(data: \{"error"|error: \{)/m.test(stream.text)
      // no finish: mlx-lm's failed stream just ends (faultReply.ts mlxFailure), the others send an error event
      expect([kind, /"finish_reason":"/.test(stream.text), errorEvent]).toEqual([kind, false, flavor !== "mlx"])
      // a whole answer: the flavor's 500, or (mlx-lm) the connection closed with no answer
      const whole = postJson(`${s.url}/v1/completions`, one)
      if (flavor === "mlx") await expect(whole).rejects.toThrow()
      else expect([kind, (await whole).status]).toEqual([kind, 500])
    }
  })
})

describe("signals and the grandchild", () => {
  it("ignores SIGTERM, and its grandchild (same process group) ignores it too until SIGKILL", async () => {
    const s = await start(["--sim-ignore-sigterm", "--sim-fork-grandchild"])
    const line = await s.waitForLine((l) => l.includes("grandchild pid="))
    const gpid = Number(/grandchild pid=(\d+)/.exec(line)?.[1])
    expect(((await getJson(`${s.url}/sim/state`)).json as { grandchildPid: number }).grandchildPid).toBe(gpid)
    expect(
      execFileSync("ps", ["-o", "pgid=", "-p", String(gpid)])
        .toString()
        .trim()
    ).toBe(String(s.pid))
    process.kill(-s.pid, "SIGTERM")
    await s.waitForLine((l) => l.includes("ignoring SIGTERM"))
    expect((await fetch(`${s.url}/health`)).status).toBe(200)
    expect(alive(gpid)).toBe(true)
    await s.stop(200)
    await pollUntil(async () => (alive(gpid) ? undefined : true))
  })

  it("exits 0 on SIGTERM, leaving the grandchild running", async () => {
    const s = await start(["--sim-fork-grandchild"])
    const gpid = Number(/grandchild pid=(\d+)/.exec(await s.waitForLine((l) => l.includes("grandchild pid=")))?.[1])
    process.kill(s.pid, "SIGTERM")
    expect((await s.exited).code).toBe(0)
    expect(alive(gpid)).toBe(true)
    await s.stop()
    await pollUntil(async () => (alive(gpid) ? undefined : true))
  })
})
