// The `engineDead` fault: vLLM's engine core dead under its API server, answered as vLLM's API server answers it
// (src/sim/engineDeath.ts): /health 503, a new completion a bare 500, a stream in flight an error event then
// [DONE], and the server gone (exit 0) at the first failed request or the watchdog's next 5 s tick, unless
// VLLM_KEEP_ALIVE_ON_ENGINE_DEATH. Other flavors have no such fault upstream and ignore it.
import { afterAll, describe, expect, it } from "vitest"
import { ENGINE_DEAD_MESSAGE, keepAliveOnEngineDeath, VLLM_WATCHDOG_MS } from "../../src/sim/engineDeath.ts"
import { postJson, type SimHandle, sseData, startSim } from "../support/sim.ts"

const started: Array<SimHandle> = []
const start = async (args: Array<string>, env: Record<string, string> = {}, flavor?: "sglang") => {
  const s = await startSim({ args, env, ...(flavor === undefined ? {} : { flavor }) })
  started.push(s)
  return s
}
afterAll(() => Promise.all(started.map((s) => s.stop(200))))

const setDead = async (s: SimHandle) =>
  expect((await postJson(`${s.url}/sim/faults`, { engineDead: true })).status).toBe(200)

describe("vLLM's engine dead", () => {
  it("fails a stream in flight with EngineDeadError's event, answers new requests a bare 500 and exits 0", async () => {
    const s = await start(["serve", "m", "--sim-mode", "random", "--sim-itl", "20ms"])
    const res = await fetch(`${s.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "m", prompt: "a b c", max_tokens: 1000, stream: true })
    })
    expect(res.status).toBe(200)
    const reader = res.body?.getReader()
    const first = await reader?.read()
    expect(new TextDecoder().decode(first?.value)).toContain('"text"')
    await setDead(s)
    expect((await fetch(`${s.url}/health`)).status).toBe(503)
    expect((await fetch(`${s.url}/v1/models`)).status).toBe(200)
    let rest = ""
    for (let r = await reader?.read(); r !== undefined && !r.done; r = await reader?.read())
      rest += new TextDecoder().decode(r.value)
    expect(sseData(rest).slice(-2)).toEqual([
      JSON.stringify({ error: { message: ENGINE_DEAD_MESSAGE, type: "InternalServerError", param: null, code: 500 } }),
      "[DONE]"
    ])
    // a model it does not serve is refused before the handler looks at the engine
    expect((await postJson(`${s.url}/v1/completions`, { model: "other", prompt: "a" })).status).toBe(404)
    // a new request: launcher.py's bare 500, and terminate_if_errored ends the server
    const dead = await postJson(`${s.url}/v1/chat/completions`, {
      model: "m",
      messages: [{ role: "user", content: "hi" }],
      stream: true
    })
    expect([dead.status, dead.text, dead.headers.get("content-type")]).toEqual([500, "", null])
    expect(await s.exited).toEqual({ code: 0, signal: null })
    expect(s.stderrLines.some((l) => l.includes('"msg":"Shutting down"'))).toBe(true)
  })

  it("with no request, the watchdog ends the server within its period", async () => {
    const s = await start(["serve", "m"])
    const t0 = performance.now()
    await setDead(s)
    expect(await s.exited).toEqual({ code: 0, signal: null })
    expect(performance.now() - t0).toBeLessThan(VLLM_WATCHDOG_MS + 2_000)
  })

  it("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1 keeps the server up: health 503 and bare 500s, the model still listed", async () => {
    const s = await start(["serve", "m"], { VLLM_KEEP_ALIVE_ON_ENGINE_DEATH: "1" })
    await setDead(s)
    for (let i = 0; i < 3; i++) {
      const r = await postJson(`${s.url}/v1/completions`, { model: "m", prompt: "a" })
      expect([r.status, r.text]).toEqual([500, ""])
    }
    expect((await fetch(`${s.url}/health`)).status).toBe(503)
    expect((await fetch(`${s.url}/v1/models`)).status).toBe(200)
    // back to life: the fault cleared, it serves again (the same process)
    expect((await postJson(`${s.url}/sim/faults`, { engineDead: false })).status).toBe(200)
    expect((await postJson(`${s.url}/v1/completions`, { model: "m", prompt: "a" })).status).toBe(200)
  })

  it("reads VLLM_KEEP_ALIVE_ON_ENGINE_DEATH as vllm/envs.py does (an integer, 0 by default)", () => {
    expect([{}, { VLLM_KEEP_ALIVE_ON_ENGINE_DEATH: "0" }].map(keepAliveOnEngineDeath)).toEqual([false, false])
    expect(
      [{ VLLM_KEEP_ALIVE_ON_ENGINE_DEATH: "1" }, { VLLM_KEEP_ALIVE_ON_ENGINE_DEATH: "2" }].map(keepAliveOnEngineDeath)
    ).toEqual([true, true])
  })
})

describe("engineDead on another flavor", () => {
  it("SGLang has no such state: it serves on", async () => {
    const s = await start(["--model-path", "m"], {}, "sglang")
    await setDead(s)
    expect((await postJson(`${s.url}/v1/completions`, { model: "m", prompt: "a" })).status).toBe(200)
    expect((await fetch(`${s.url}/health`)).status).toBe(200)
  })
})
