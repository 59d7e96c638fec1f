// The simulator as an SGLang prefill or decode server takes a request naming SGLang's fake bootstrap host as the
// real one does: its own warm-up and /health_generate send FAKE_BOOTSTRAP_HOST ("2.2.2.2") and a room, no port
// (python/sglang/srt/entrypoints/http_server.py _execute_server_warmup, health_generate;
// python/sglang/srt/disaggregation/utils.py), and the bootstrap queues then use the fake KV sender or receiver, which
// report the hand-off done at once (python/sglang/srt/disaggregation/prefill.py and decode.py, `add`; fake/conn.py).
// So the decode server generates without a prefill, the prefill server answers its one token without a decode (and
// hands the bootstrap server nothing); a request without bootstrap fields is refused as before.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { freePort } from "../support/ports.ts"
import { getJson, postJson, type SimHandle, startSim } from "../support/sim.ts"

const FAKE = { bootstrap_host: "2.2.2.2", bootstrap_room: 0 }

describe("SGLang P/D: the fake bootstrap host", () => {
  let p: SimHandle
  let d: SimHandle
  let bootPort: number
  beforeAll(async () => {
    bootPort = await freePort()
    const mode = (m: string, extra: ReadonlyArray<string>) => [
      "--model-path",
      "m",
      "--disaggregation-mode",
      m,
      "--disaggregation-transfer-backend",
      "mooncake",
      "--sim-mode",
      "echo",
      ...extra
    ]
    // short bootstrap and waiting timeouts: a request that waited for a peer would fail (500) within a second
    ;[p, d] = await Promise.all([
      startSim({
        args: mode("prefill", ["--disaggregation-bootstrap-port", String(bootPort)]),
        env: { SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT: "1" }
      }),
      startSim({ args: mode("decode", []), env: { SGLANG_DISAGGREGATION_WAITING_TIMEOUT: "1" } })
    ])
    await Promise.all([p, d].map((s) => s.waitForLine((l) => l.includes('"model loaded"'))))
  })
  afterAll(() => Promise.all([p?.stop(), d?.stop()]))

  it("decode generates on its own, on both endpoints, with no port", async () => {
    const c = await postJson(`${d.url}/v1/completions`, {
      model: "m",
      prompt: "one two three four",
      max_tokens: 3,
      ...FAKE
    })
    expect(c).toMatchObject({
      status: 200,
      json: { choices: [{ text: "one two three", finish_reason: "length" }], usage: { completion_tokens: 3 } }
    })
    const chat = await postJson(`${d.url}/v1/chat/completions`, {
      model: "m",
      messages: [{ role: "user", content: "ping" }],
      max_tokens: 16,
      ignore_eos: true,
      ...FAKE
    })
    expect(chat).toMatchObject({ status: 200, json: { usage: { completion_tokens: 16 } } })
  })

  it("prefill answers its one token with no decode connected, and marks nothing done on the bootstrap server", async () => {
    const r = await postJson(`${p.url}/v1/completions`, { model: "m", prompt: "one two", max_tokens: 16, ...FAKE })
    expect(r).toMatchObject({ status: 200, json: { usage: { completion_tokens: 1 } } })
    const room = await getJson(`http://127.0.0.1:${bootPort}/room/0?wait_ms=0`)
    expect(room.status).toBe(408)
  })

  it("still refused: no bootstrap fields, a real host without a port, the fake host without a room", async () => {
    for (const [sim, mode] of [
      [d, "decode"],
      [p, "prefill"]
    ] as const) {
      for (const extra of [{}, { bootstrap_host: "127.0.0.1", bootstrap_room: 5 }, { bootstrap_host: "2.2.2.2" }]) {
        const r = await postJson(`${sim.url}/v1/completions`, { model: "m", prompt: "a", max_tokens: 2, ...extra })
        expect(r, `${mode} ${JSON.stringify(extra)}`).toMatchObject({
          status: 400,
          json: { message: `bootstrap_host, bootstrap_port and bootstrap_room are required in ${mode} mode` }
        })
      }
    }
  })
})
