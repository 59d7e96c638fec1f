// Prefill/decode between two simulators. vLLM: the prefill leg returns kv_transfer_params and holds the
// blocks under a lease; the decode leg really fetches them from the prefill's side channel; a failed handshake
// (a wrong engine id) or transfer (block ids outside P's cache) fails (kv_load_failure_policy "fail"), a request P
// does not hold (unknown, read already, expired) is read all the same and only logged on P, as NIXL's reads are
// (nixl_connector.py _get_new_notifs); missing params compute locally.
// SGLang: bootstrap rendezvous by room, in SGLang's order: the prefill waits for its decode to connect (alone it
// fails at the bootstrap timeout), the decode waits for the prefill (alone it fails at its waiting timeout).
import * as http from "node:http"
import type { AddressInfo } from "node:net"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { prefillLossOf, waitForRoom } from "../../src/sim/pd.ts"
import { freePort } from "../support/ports.ts"
import { getJson, pollUntil, postJson, type SimHandle, sseData, startNixlPair, startSim } from "../support/sim.ts"

describe("vLLM P/D over the side channel", () => {
  let p: SimHandle
  let d: SimHandle
  let pSide: number
  beforeAll(async () => {
    ;({ p, d, pSide } = await startNixlPair(["--sim-kv-lease", "1500ms", "--sim-block-size", "2"]))
  })
  afterAll(() => Promise.all([p?.stop(), d?.stop()]))

  const body = { model: "m", prompt: "alpha beta gamma delta epsilon", max_tokens: 4 }
  const prefill = async () => {
    const r = await postJson(`${p.url}/v1/completions`, {
      ...body,
      max_tokens: 1,
      stream: false,
      kv_transfer_params: {
        do_remote_decode: true,
        do_remote_prefill: false,
        remote_engine_id: null,
        remote_block_ids: null,
        remote_host: null,
        remote_port: null
      }
    })
    expect(r.status).toBe(200)
    return (r.json as { kv_transfer_params: Record<string, unknown> }).kv_transfer_params
  }
  const decode = (kvp: unknown) => postJson(`${d.url}/v1/completions`, { ...body, kv_transfer_params: kvp })
  const pState = async () => (await getJson(`${p.url}/sim/state`)).json as Record<string, number>
  const loadFailures = () => d.stderrLines.filter((l) => l.includes("KV load failed")).length
  // vLLM's words on P (nixl_connector.py _get_new_notifs), logged as the simulator logs its lines
  const unrecognized = (id: string) =>
    p.stderrLines.filter((l) =>
      l.includes(
        `Potentially invalid KV blocks for unrecognized request ${id} were retrieved by a decode worker. They may have expired.`
      )
    ).length

  it("hands off: P returns kv_transfer_params, D fetches the blocks and P frees them", async () => {
    const kvp = await prefill()
    expect(kvp).toMatchObject({
      do_remote_prefill: true,
      do_remote_decode: false,
      remote_engine_id: expect.any(String),
      remote_request_id: expect.any(String),
      remote_host: "127.0.0.1",
      remote_port: pSide,
      tp_size: 1
    })
    expect((kvp.remote_block_ids as Array<Array<number>>)[0]).toHaveLength(3)
    expect((await pState()).kvHeld).toBe(1)
    const r = await decode(kvp)
    expect(r.status).toBe(200)
    expect(r.json).toMatchObject({ choices: [{ text: "alpha beta gamma delta", finish_reason: "length" }] })
    expect(await pState()).toMatchObject({ kvHeld: 0, kvFetched: 1 })
    // The same hand-off read again: NIXL reads the blocks by id all the same (whatever they hold now); P only logs
    // the notification of a request it no longer holds.
    const logged = unrecognized(String(kvp.remote_request_id))
    const loadFailuresBefore = loadFailures()
    const again = await decode(kvp)
    expect([again.status, loadFailures()]).toEqual([200, loadFailuresBefore])
    expect(unrecognized(String(kvp.remote_request_id))).toBe(logged + 1)
  })

  it.each([
    ["block ids (outside P's KV cache)", { remote_block_ids: [[99_999]] }],
    ["engine id", { remote_engine_id: "someone-else" }]
  ])("fails on a wrong %s: vLLM's generic 500 to the client, the cause in its log", async (_n, patch) => {
    const kvp = await prefill()
    const logged = loadFailures()
    const r = await decode({ ...kvp, ...patch })
    expect(r).toMatchObject({
      status: 500,
      json: { error: { message: "Internal server error", type: "InternalServerError", code: 500 } }
    })
    expect(loadFailures()).toBe(logged + 1)
  })

  it("a streamed decode leg whose load fails: 200, then the error event and [DONE], no token", async () => {
    const kvp = await prefill()
    const res = await fetch(`${d.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ ...body, stream: true, kv_transfer_params: { ...kvp, remote_engine_id: "someone-else" } })
    })
    expect(res.status).toBe(200)
    expect(sseData(await res.text())).toEqual([
      JSON.stringify({
        error: { message: "Internal server error", type: "InternalServerError", param: null, code: 500 }
      }),
      "[DONE]"
    ])
  })

  it("reads a request P does not know as any other: 200, and P logs the unrecognized request", async () => {
    const kvp = await prefill()
    const failures = loadFailures()
    const r = await decode({ ...kvp, remote_request_id: "cmpl-unknown" })
    expect(r).toMatchObject({ status: 200, json: { choices: [{ text: "alpha beta gamma delta" }] } })
    expect([unrecognized("cmpl-unknown"), loadFailures()]).toEqual([1, failures])
  })

  it("reads blocks whose lease expired all the same (they may have been reused): 200, and P logs it", async () => {
    const kvp = await prefill()
    const id = String(kvp.remote_request_id)
    // Every hold (this one and those left by the other cases) runs out after 1.5 s.
    await pollUntil(async () => ((await pState()).kvHeld === 0 ? true : undefined), 10_000, 50)
    const failures = loadFailures()
    const r = await decode(kvp)
    expect([r.status, loadFailures(), unrecognized(id)]).toEqual([200, failures, 1])
    await p.waitForLine((l) => /^ERROR \d\d-\d\d /.test(l) && l.includes(`unrecognized request ${id} `))
  })

  it("computes locally when the params are incomplete (as vLLM does)", async () => {
    const r = await decode({ do_remote_prefill: true, remote_block_ids: [] })
    expect(r.status).toBe(200)
    expect(((await getJson(`${d.url}/sim/state`)).json as Record<string, number>).localPrefills).toBeGreaterThan(0)
    await d.waitForLine((l) => l.includes("Got invalid KVTransferParams"))
  })
})

describe("SGLang P/D bootstrap", () => {
  let p: SimHandle
  let d: SimHandle
  let bootPort: number
  beforeAll(async () => {
    bootPort = await freePort()
    ;[p, d] = await Promise.all([
      startSim({
        args: [
          "--model-path",
          "m",
          "--disaggregation-mode",
          "prefill",
          "--disaggregation-transfer-backend",
          "nixl",
          "--disaggregation-bootstrap-port",
          String(bootPort),
          "--sim-ttft",
          "200ms"
        ],
        env: { SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT: "1" }
      }),
      startSim({
        args: ["--model-path", "m", "--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "nixl"],
        env: { SGLANG_DISAGGREGATION_WAITING_TIMEOUT: "1" }
      })
    ])
    await Promise.all([p, d].map((s) => s.waitForLine((l) => l.includes('"model loaded"'))))
  })
  afterAll(() => Promise.all([p?.stop(), d?.stop()]))

  const req = (room: string) =>
    `{"model":"m","prompt":"one two three","max_tokens":3,"bootstrap_host":"127.0.0.1","bootstrap_port":${bootPort},"bootstrap_room":${room}}`
  const post = async (url: string, text: string) => {
    const res = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: text
    })
    return { status: res.status, json: (await res.json()) as Record<string, unknown> }
  }

  it("decode waits for the prefill of the same room (a 63-bit room id)", async () => {
    const room = "9223372036854775000"
    const [pr, dr] = await Promise.all([post(p.url, req(room)), post(d.url, req(room))])
    expect(pr.status).toBe(200)
    // Three words at max_tokens 3: "length", the budget ending it before the end-of-sequence token would.
    expect(dr).toMatchObject({ status: 200, json: { choices: [{ text: "one two three", finish_reason: "length" }] } })
  })

  it("a room's KV goes to one decode leg: a later decode leg for the served room waits and fails like a lone one", async () => {
    const room = "4242"
    const [pr, dr] = await Promise.all([post(p.url, req(room)), post(d.url, req(room))])
    expect([pr.status, dr.status]).toStrictEqual([200, 200])
    const again = await post(d.url, req(room))
    expect(again).toMatchObject({ status: 500, json: { object: "error", message: expect.stringContaining(room) } })
  })

  it("a prefill alone does not complete: it waits for its decode to connect and fails at the bootstrap timeout", async () => {
    const started = Date.now()
    const r = await post(p.url, req("777"))
    expect(Date.now() - started).toBeGreaterThanOrEqual(900)
    expect(r.status).toBe(500)
    expect(r.json).toMatchObject({ object: "error", message: expect.stringMatching(/KVPoll\.Bootstrapping/) })
  })

  it("a prefill sent first completes once its decode connects", async () => {
    const before = ((await getJson(`${p.url}/sim/state`)).json as { received: number }).received
    const pending = post(p.url, req("778"))
    await pollUntil(async () =>
      ((await getJson(`${p.url}/sim/state`)).json as { received: number }).received > before ? true : undefined
    )
    const dr = await post(d.url, req("778"))
    expect((await pending).status).toBe(200)
    expect(dr).toMatchObject({ status: 200, json: { choices: [{ text: "one two three" }] } })
  })

  it("a room served is forgotten on the prefill side too: a prefill retried for it waits for a decode again", async () => {
    const room = "4343"
    const [pr, dr] = await Promise.all([post(p.url, req(room)), post(d.url, req(room))])
    expect([pr.status, dr.status]).toStrictEqual([200, 200])
    // the decode's connection went with the room (transfer_infos.pop(room)): alone, the prefill fails as a lone one
    const started = Date.now()
    const again = await post(p.url, req(room))
    expect(Date.now() - started).toBeGreaterThanOrEqual(900)
    expect(again).toMatchObject({
      status: 500,
      json: { object: "error", message: expect.stringMatching(/KVPoll\.Bootstrapping/) }
    })
  })

  it("decode fails when the prefill never comes, and without bootstrap fields", async () => {
    const r = await post(d.url, req("12345"))
    expect(r.status).toBe(500)
    expect(r.json).toMatchObject({ object: "error", code: 500 })
    const missing = await postJson(`${d.url}/v1/completions`, { prompt: "a" })
    expect(missing).toMatchObject({ status: 400, json: { object: "error" } })
  })
})

describe("SGLang decode: a prefill it cannot reach fails the request within seconds, not at the waiting timeout", () => {
  const loss = { infoTries: 3, heartbeatIntervalMs: 100, heartbeatMaxFailures: 2 }
  const never = new AbortController().signal

  it("SGLang's defaults and floors from its environment", () => {
    expect(prefillLossOf({})).toEqual({ infoTries: 15, heartbeatIntervalMs: 5000, heartbeatMaxFailures: 2 })
    expect(
      prefillLossOf({
        SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL: "0.5",
        SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE: "0"
      })
    ).toEqual({ infoTries: 15, heartbeatIntervalMs: 2000, heartbeatMaxFailures: 1 })
  })

  it("a bootstrap server never reached: 'Could not fetch prefill parallel info' after its tries", async () => {
    const port = await freePort()
    const r = await waitForRoom("127.0.0.1", port, "5", 60_000, never, loss)
    expect(r).toEqual({
      ok: false,
      reason: expect.stringMatching(
        new RegExp(`^Could not fetch prefill parallel info from bootstrap_addr: 127\\.0\\.0\\.1:${port} `)
      )
    })
  })

  it("a prefill reached, then gone (it died mid-handoff): 'Losing connection with prefill instance'", async () => {
    let waits = 0
    const server = http.createServer((_req, res) => {
      waits += 1
      // not done yet: the wait ends 408, as the bootstrap server answers; the next wait finds it gone
      res.writeHead(408, { connection: "close" }).end()
      if (waits === 1) server.close()
    })
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r))
    const { port } = server.address() as AddressInfo
    const started = Date.now()
    const r = await waitForRoom("127.0.0.1", port, "6", 60_000, never, loss)
    expect(r).toEqual({
      ok: false,
      reason: `Losing connection with prefill instance (bootstrap_addr: 127.0.0.1:${port}), affected 1 requests`
    })
    expect(Date.now() - started).toBeLessThan(30_000)
  })
})
