// Disaggregated prefill/decode between two agents' real gRPC servers, each in front of its own simulator:
// the test plays the router (prefill agent, then its final's kv_transfer_params to the decode agent; for
// SGLang both legs at once with the same bootstrap room). Failure cases: a failed KV transfer (the decode engine's
// handshake with the prefill engine fails), prefill engine down, missing or invalid handoff, a leg past [agent].handoff_timeout (the engine request is aborted).
// A vLLM decode leg whose input is not its prefill leg's (kv_transfer_params.cgn_input_digest) is refused before
// its engine sees it; a matching one reaches the engine without the agent's field (a recording proxy in front of D).
// Also a burst above max_inflight + max_queue through the real server: exact OK / RESOURCE_EXHAUSTED counts.
import * as http from "node:http"
import type { AddressInfo } from "node:net"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type Agent, collect, startAgent } from "../support/grpcAgent.ts"
import { freePort } from "../support/ports.ts"
import { getJson, pollUntil, type SimHandle, startSim } from "../support/sim.ts"

const simState = async (sim: SimHandle) => (await getJson(`${sim.url}/sim/state`)).json as Record<string, number>

/** An HTTP proxy in front of `target` that keeps the JSON body of every request it forwards. */
const recordingProxy = async (target: string) => {
  const bodies: Array<Record<string, unknown>> = []
  const server = http.createServer((req, res) => {
    const chunks: Array<Buffer> = []
    req.on("data", (c: Buffer) => chunks.push(c))
    req.on("end", () => {
      const raw = Buffer.concat(chunks)
      if (raw.length > 0) bodies.push(JSON.parse(raw.toString("utf8")) as Record<string, unknown>)
      const up = http.request(`${target}${req.url}`, { method: req.method, headers: req.headers }, (r) => {
        res.writeHead(r.statusCode ?? 502, r.headers)
        r.pipe(res)
      })
      up.on("error", () => res.destroy())
      res.on("close", () => up.destroy())
      up.end(raw)
    })
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    bodies,
    close: () => {
      server.closeAllConnections()
      return new Promise<void>((resolve) => server.close(() => resolve()))
    }
  }
}

describe("vLLM prefill -> decode between two agents", () => {
  let p: SimHandle
  let d: SimHandle
  let pAgent: Agent
  let dAgent: Agent
  let dEngine: Awaited<ReturnType<typeof recordingProxy>>
  let pSide: number
  const kvCfg = JSON.stringify({ kv_connector: "NixlConnector", kv_role: "kv_both", kv_load_failure_policy: "fail" })
  const prompt = "alpha beta gamma delta epsilon"

  beforeAll(async () => {
    pSide = await freePort()
    const dSide = await freePort()
    const sim = (side: number, extra: ReadonlyArray<string>) =>
      startSim({
        args: ["serve", "m", "--kv-transfer-config", kvCfg, "--sim-mode", "echo", ...extra],
        env: { VLLM_NIXL_SIDE_CHANNEL_HOST: "127.0.0.1", VLLM_NIXL_SIDE_CHANNEL_PORT: String(side) }
      })
    ;[p, d] = await Promise.all([sim(pSide, ["--sim-kv-lease", "1s", "--sim-block-size", "2"]), sim(dSide, [])])
    dEngine = await recordingProxy(d.url)
    ;[pAgent, dAgent] = await Promise.all([
      startAgent(p.url, "vllm", { role: "prefill" }),
      startAgent(dEngine.url, "vllm", { role: "decode" })
    ])
  })
  afterAll(async () => {
    await Promise.all([pAgent?.close(), dAgent?.close()])
    await dEngine?.close()
    await Promise.all([p?.stop(), d?.stop()])
  })

  const prefill = async () => {
    const r = await collect(pAgent.client, { requestId: "pd-1", prompt, sampling: { maxTokens: 4, stop: [] } })
    expect([r.status, r.details]).toEqual(["OK", ""])
    return r
  }

  it("hands off: the prefill final carries the engine's params, the decode agent streams the answer", async () => {
    const before = await simState(p)
    const pr = await prefill()
    // The prefill leg streams nothing: the answer comes from the decode leg.
    expect(pr.deltas).toBe(0)
    expect(pr.final?.finishReason).toBe("length")
    expect(pr.final?.kvTransferParams).toMatchObject({
      do_remote_prefill: true,
      do_remote_decode: false,
      remote_engine_id: expect.any(String),
      remote_request_id: expect.any(String),
      remote_host: "127.0.0.1",
      remote_port: pSide,
      // P's agent adds its digest of the leg's input; D's agent checks it and takes it out.
      cgn_input_digest: expect.stringMatching(/^v1:/)
    })
    expect((await simState(p)).kvHeld).toBe(before.kvHeld! + 1)
    const sent = dEngine.bodies.length
    const dr = await collect(dAgent.client, {
      requestId: "pd-1",
      prompt,
      sampling: { maxTokens: 4, stop: [] },
      kvTransferParams: pr.final?.kvTransferParams
    })
    expect([dr.status, dr.text]).toEqual(["OK", "alpha beta gamma delta"])
    expect(dr.deltas).toBeGreaterThan(0)
    expect(dr.final?.kvTransferParams).toBeUndefined()
    expect(await simState(p)).toMatchObject({ kvHeld: before.kvHeld, kvFetched: before.kvFetched! + 1 })
    // D's engine got exactly the params P's engine returned.
    const { cgn_input_digest: _digest, ...engines } = pr.final!.kvTransferParams!
    expect(dEngine.bodies.slice(sent).map((b) => b.kv_transfer_params)).toStrictEqual([engines])
  })

  it("a decode leg whose input is not its prefill leg's: FAILED_PRECONDITION, never sent to the engine", async () => {
    const sampling = { maxTokens: 4, stop: [] }
    const chat = (role: string, content: string) => ({ messages: [{ role, content }] })
    const pr = await collect(pAgent.client, { chat: chat("user", prompt), sampling })
    expect([pr.status, pr.final?.kvTransferParams?.cgn_input_digest]).toEqual(["OK", expect.stringMatching(/^v1:/)])
    const kvTransferParams = pr.final?.kvTransferParams
    const [served, sent] = [(await simState(d)).served, dEngine.bodies.length]
    // Another text, another role, the same text as a prompt (sent to /v1/completions).
    for (const other of [{ chat: chat("user", `${prompt} zeta`) }, { chat: chat("system", prompt) }, { prompt }]) {
      const r = await collect(dAgent.client, { ...other, sampling, kvTransferParams })
      expect([r.status, r.details]).toEqual([
        "FAILED_PRECONDITION",
        expect.stringMatching(
          /^the decode leg's input differs from its prefill leg's \(kv_transfer_params\.cgn_input_digest\)/
        )
      ])
      expect(r.trailer?.get("cgn-reason")).toBe("invalid_handoff")
    }
    expect([(await simState(d)).served, dEngine.bodies.length]).toEqual([served, sent])
    // The refusals left the handoff alone: the leg with the prefill leg's input still takes it.
    const dr = await collect(dAgent.client, { chat: chat("user", prompt), sampling, kvTransferParams })
    expect([dr.status, dr.details, dr.text]).toEqual(["OK", "", "alpha beta gamma delta"])
  })

  it("a one-word prompt with a stop sequence still hands off: the prefill leg ends on its length, not EOS or stop", async () => {
    // The engine hands off only a request that ends on its length (NixlConnector request_finished): the echo
    // engine would end this one on its end-of-sequence at once, and the caller's stop would match its word.
    const pr = await collect(pAgent.client, { prompt: "alpha", sampling: { maxTokens: 8, stop: ["alpha"] } })
    expect([pr.status, pr.details]).toEqual(["OK", ""])
    expect(pr.final?.finishReason).toBe("length")
    expect(pr.final?.kvTransferParams).toMatchObject({ do_remote_prefill: true, remote_port: pSide })
  })

  it("a failed KV transfer: the decode engine's failed fetch is UNAVAILABLE with vLLM's generic words, retried as a new pair", async () => {
    // vLLM fails a load whose NIXL handshake or transfer fails (here the prefill engine answers the handshake with
    // another engine id: "Remote NIXL agent engine ID mismatch"); expired blocks it reads without an error
    // (nixl_connector.py _get_new_notifs only logs them), so they are no failure to inject.
    const pr = await prefill()
    const kvTransferParams = { ...pr.final?.kvTransferParams, remote_engine_id: "another-prefill-engine" }
    const dr = await collect(dAgent.client, { prompt, kvTransferParams })
    // vLLM answers 200, then fails the request at its first step with a generic error event (the cause is in its
    // log only): a leg with no delta, retryable elsewhere
    expect([dr.status, dr.details]).toEqual([
      "UNAVAILABLE",
      "engine failed mid-stream (InternalServerError): Internal server error"
    ])
    expect(dr.deltas).toBe(0)
    // not the same leg on another decode node (its handoff is spent, or on vLLM may read blocks since reused): the pair
    expect([dr.trailer?.get("cgn-retryable"), dr.trailer?.get("cgn-retry-pair")]).toEqual(["false", "true"])
    // said to a gRPC library's retry policy too (gRFC A6 pushback: negative is "do not retry")
    expect(dr.trailer?.get("grpc-retry-pushback-ms")).toBe("-1")
  })

  it("a leg on the wrong node: params on the prefill node, SGLang's bootstrap on vLLM's: FAILED_PRECONDITION", async () => {
    const servedP = (await simState(p)).served
    const pr = await prefill()
    const misrouted = await collect(pAgent.client, { prompt, kvTransferParams: pr.final?.kvTransferParams })
    expect([misrouted.status, misrouted.details]).toEqual([
      "FAILED_PRECONDITION",
      expect.stringMatching(/^kv_transfer_params on a prefill node: .*send this leg to a decode node/)
    ])
    const foreign = await collect(dAgent.client, {
      prompt,
      kvTransferParams: pr.final?.kvTransferParams,
      bootstrap: { host: "127.0.0.1", port: 8998, room: "1" }
    })
    expect([foreign.status, foreign.details]).toEqual([
      "FAILED_PRECONDITION",
      expect.stringMatching(/^bootstrap on a node whose engine hands off by kv_transfer_params/)
    ])
    // only the one prefill leg reached the prefill engine
    expect((await simState(p)).served).toBe(servedP! + 1)
  })

  it("missing or invalid handoff params: FAILED_PRECONDITION before the engine is called", async () => {
    const served = (await simState(d)).served
    const missing = await collect(dAgent.client, { prompt })
    expect([missing.status, missing.details]).toEqual([
      "FAILED_PRECONDITION",
      expect.stringMatching(/kv_transfer_params/)
    ])
    const invalid = await collect(dAgent.client, {
      prompt,
      kvTransferParams: { do_remote_prefill: true, remote_block_ids: [], remote_host: "127.0.0.1" }
    })
    expect([invalid.status, invalid.details]).toEqual([
      "FAILED_PRECONDITION",
      expect.stringMatching(/missing or empty remote_block_ids, remote_engine_id, remote_port/)
    ])
    expect(invalid.trailer?.get("cgn-error-source")).toBe("agent")
    expect((await simState(d)).served).toBe(served)
  })

  it("prefill engine down: UNAVAILABLE, and a vLLM prefill leg may go to another prefill node as it is", async () => {
    await p.stop()
    const r = await collect(pAgent.client, { prompt })
    expect([r.status, r.details]).toEqual(["UNAVAILABLE", expect.stringMatching(/engine unreachable/)])
    expect([r.trailer?.get("cgn-retryable"), r.trailer?.get("cgn-retry-pair")]).toEqual(["true", undefined])
  })
})

describe("vLLM prefill -> decode with an older NixlConnector (before vLLM PR #29665: no remote_request_id)", () => {
  let p: SimHandle
  let d: SimHandle
  let pAgent: Agent
  let dAgent: Agent
  const kvCfg = JSON.stringify({ kv_connector: "NixlConnector", kv_role: "kv_both", kv_load_failure_policy: "fail" })
  const prompt = "alpha beta gamma delta epsilon"

  beforeAll(async () => {
    const [pSide, dSide] = [await freePort(), await freePort()]
    const sim = (side: number) =>
      startSim({
        args: ["serve", "m", "--kv-transfer-config", kvCfg, "--sim-mode", "echo", "--sim-nixl-legacy"],
        env: { VLLM_NIXL_SIDE_CHANNEL_HOST: "127.0.0.1", VLLM_NIXL_SIDE_CHANNEL_PORT: String(side) }
      })
    ;[p, d] = await Promise.all([sim(pSide), sim(dSide)])
    ;[pAgent, dAgent] = await Promise.all([
      startAgent(p.url, "vllm", { role: "prefill" }),
      startAgent(d.url, "vllm", { role: "decode" })
    ])
  })
  afterAll(async () => {
    await Promise.all([pAgent?.close(), dAgent?.close()])
    await Promise.all([p?.stop(), d?.stop()])
  })

  it("hands off without remote_request_id: D pulls under the shared request id", async () => {
    const before = await simState(p)
    const sampling = { maxTokens: 4, stop: [] }
    const pr = await collect(pAgent.client, { requestId: "legacy-1", prompt, sampling })
    expect([pr.status, pr.details]).toEqual(["OK", ""])
    expect(pr.final?.kvTransferParams).toMatchObject({
      remote_engine_id: expect.any(String),
      remote_port: expect.any(Number)
    })
    expect(pr.final?.kvTransferParams).not.toHaveProperty("remote_request_id")
    const dr = await collect(dAgent.client, {
      requestId: "legacy-1",
      prompt,
      sampling,
      kvTransferParams: pr.final?.kvTransferParams
    })
    expect([dr.status, dr.text]).toEqual(["OK", "alpha beta gamma delta"])
    expect(await simState(p)).toMatchObject({ kvHeld: before.kvHeld, kvFetched: before.kvFetched! + 1 })
    expect((await simState(d)).localPrefills).toBe(0)
  })
})

describe("SGLang prefill + decode with a bootstrap room", () => {
  let p: SimHandle
  let d: SimHandle
  /** A decode engine at 200 ms a token, behind an agent with one admission slot. */
  let dSlow: SimHandle
  let pAgent: Agent
  let pAgentShort: Agent
  let dAgent: Agent
  let dAgentShort: Agent
  let dAgentOneSlot: Agent
  let bootPort: number
  const prompt = "one two three"

  beforeAll(async () => {
    bootPort = await freePort()
    const sim = (mode: string, extra: ReadonlyArray<string>) =>
      startSim({
        args: [
          "--model-path",
          "m",
          "--disaggregation-mode",
          mode,
          "--disaggregation-transfer-backend",
          "nixl",
          "--sim-mode",
          "echo",
          ...extra
        ]
      })
    ;[p, d, dSlow] = await Promise.all([
      sim("prefill", ["--disaggregation-bootstrap-port", String(bootPort), "--sim-ttft", "100ms"]),
      sim("decode", []),
      sim("decode", ["--sim-itl", "200ms"])
    ])
    await Promise.all([p, d, dSlow].map((s) => s.waitForLine((l) => l.includes('"model loaded"'))))
    ;[pAgent, pAgentShort, dAgent, dAgentShort, dAgentOneSlot] = await Promise.all([
      startAgent(p.url, "sglang", { role: "prefill" }),
      startAgent(p.url, "sglang", { role: "prefill", handoff_timeout: "500ms" }),
      startAgent(d.url, "sglang", { role: "decode" }),
      startAgent(d.url, "sglang", { role: "decode", handoff_timeout: "300ms" }),
      startAgent(dSlow.url, "sglang", { role: "decode", handoff_timeout: "300ms", max_inflight: 1, max_queue: 1 })
    ])
  })
  afterAll(async () => {
    await Promise.all([
      pAgent?.close(),
      pAgentShort?.close(),
      dAgent?.close(),
      dAgentShort?.close(),
      dAgentOneSlot?.close()
    ])
    await Promise.all([p?.stop(), d?.stop(), dSlow?.stop()])
  })

  it("both legs with the same 63-bit room (an exact JSON integer): the decode agent streams the answer", async () => {
    const bootstrap = { host: "127.0.0.1", port: bootPort, room: "9223372036854775000" }
    const req = { prompt, sampling: { maxTokens: 3, stop: [] }, bootstrap }
    const [pr, dr] = await Promise.all([collect(pAgent.client, req), collect(dAgent.client, req)])
    expect([pr.status, pr.details, pr.deltas]).toEqual(["OK", "", 0])
    expect(pr.final?.kvTransferParams).toBeUndefined()
    expect([dr.status, dr.text]).toEqual(["OK", "one two three"])
  })

  it("missing or invalid bootstrap: FAILED_PRECONDITION on either leg", async () => {
    for (const agent of [pAgent, dAgent]) {
      const r = await collect(agent.client, { prompt })
      expect([r.status, r.details]).toEqual([
        "FAILED_PRECONDITION",
        expect.stringMatching(/missing or empty bootstrap/)
      ])
    }
    // A uint64 on the wire, but SGLang's rooms stop at 2^63-1.
    const bad = await collect(dAgent.client, {
      prompt,
      bootstrap: { host: "127.0.0.1", port: bootPort, room: "18446744073709551615" }
    })
    expect([bad.status, bad.details]).toEqual(["FAILED_PRECONDITION", expect.stringMatching(/bootstrap\.room/)])
  })

  it("a prefill leg sent alone does not complete (SGLang holds it until the decode connects): DEADLINE_EXCEEDED", async () => {
    const before = await simState(p)
    const r = await collect(pAgentShort.client, {
      prompt,
      bootstrap: { host: "127.0.0.1", port: bootPort, room: "4343" }
    })
    expect([r.status, r.details]).toEqual(["DEADLINE_EXCEEDED", expect.stringMatching(/prefill leg did not finish/)])
    const after = await pollUntil(async () => {
      const s = await simState(p)
      return s.aborted! > before.aborted! ? s : undefined
    }, 10_000)
    expect([after.aborted, after.served]).toEqual([before.aborted! + 1, before.served])
  })

  it("a decode leg whose prefill never comes ends at handoff_timeout and the engine request is aborted", async () => {
    const before = await simState(d)
    const bootstrap = { host: "127.0.0.1", port: bootPort, room: "4242" }
    const r = await collect(dAgentShort.client, { prompt, bootstrap })
    expect([r.status, r.details]).toEqual(["DEADLINE_EXCEEDED", expect.stringMatching(/handoff_timeout/)])
    // its room is taken on the decode engine: retried as a new pair, with a new room
    expect([r.trailer?.get("cgn-retryable"), r.trailer?.get("cgn-retry-pair")]).toEqual(["false", "true"])
    const after = await pollUntil(async () => {
      const s = await simState(d)
      return s.aborted! > before.aborted! && s.running === 0 && s.waiting === 0 ? s : undefined
    }, 10_000)
    expect(after.aborted).toBe(before.aborted! + 1)
  })

  it("a decode leg queued behind a full max_inflight counts the wait in handoff_timeout: it never reaches the engine", async () => {
    const before = await simState(dSlow)
    // The first call takes the one slot and streams for ~1 s (five tokens at 200 ms); the second, a decode leg
    // whose prefill never comes, waits for admission meanwhile. Counted from admission, its 300 ms would start
    // when the first ends and the engine would see (and abort) it; counted from its start, it ends in the queue.
    const words = "a b c d e"
    const room = { host: "127.0.0.1", port: bootPort, room: "5151" }
    const req = { prompt: words, sampling: { maxTokens: 5, stop: [] }, bootstrap: room }
    const first = Promise.all([collect(pAgent.client, req), collect(dAgentOneSlot.client, req)])
    await pollUntil(async () => ((await simState(dSlow)).running! > before.running! ? true : undefined), 10_000)
    const second = await collect(dAgentOneSlot.client, {
      prompt,
      bootstrap: { host: "127.0.0.1", port: bootPort, room: "5252" }
    })
    expect([second.status, second.details]).toEqual([
      "DEADLINE_EXCEEDED",
      expect.stringMatching(/decode leg did not start within 300ms .*waiting for admission/)
    ])
    const [pr, dr] = await first
    expect([pr.status, dr.status, dr.text]).toEqual(["OK", "OK", words])
    const after = await simState(dSlow)
    expect([after.aborted, after.served]).toEqual([before.aborted, before.served! + 1])
  })

  it("a prefill leg refused before its engine (a model this node does not serve) is still retried only as a pair", async () => {
    const r = await collect(pAgent.client, {
      model: "elsewhere",
      prompt,
      bootstrap: { host: "127.0.0.1", port: bootPort, room: "8" }
    })
    expect(r.status).toBe("NOT_FOUND")
    expect([r.trailer?.get("cgn-retryable"), r.trailer?.get("cgn-retry-pair")]).toEqual(["false", "true"])
  })

  it("prefill engine down: UNAVAILABLE", async () => {
    await p.stop()
    const r = await collect(pAgent.client, { prompt, bootstrap: { host: "127.0.0.1", port: bootPort, room: "7" } })
    expect([r.status, r.details]).toEqual(["UNAVAILABLE", expect.stringMatching(/engine unreachable/)])
    // its decode leg waits on this node's bootstrap server: no other prefill node can take this leg alone
    expect([r.trailer?.get("cgn-retryable"), r.trailer?.get("cgn-retry-pair")]).toEqual(["false", "true"])
  })
})

describe("admission through the real gRPC server", () => {
  let sim: SimHandle
  let agent: Agent
  beforeAll(async () => {
    sim = await startSim({ flavor: "vllm", args: ["serve", "m", "--sim-mode", "echo", "--sim-itl", "100ms"] })
    agent = await startAgent(sim.url, "vllm", { role: "both", max_inflight: 2, max_queue: 1 })
  })
  afterAll(async () => {
    await agent?.close()
    await sim?.stop()
  })

  it("a burst above max_inflight + max_queue: exactly 3 served, 3 RESOURCE_EXHAUSTED at once", async () => {
    // Ten tokens at 100 ms each keep the admitted streams open well past the burst's arrival.
    const prompt = Array.from({ length: 10 }, (_, i) => `w${i}`).join(" ")
    const results = await Promise.all(Array.from({ length: 6 }, () => collect(agent.client, { prompt })))
    const by = (s: string) => results.filter((r) => r.status === s)
    expect(by("OK")).toHaveLength(3)
    expect(by("RESOURCE_EXHAUSTED")).toHaveLength(3)
    for (const r of by("OK")) expect(r.text).toBe(prompt)
    for (const r of by("RESOURCE_EXHAUSTED")) {
      expect(r.details).toMatch(/overloaded: .*max_inflight = 2.*max_queue = 1/)
      expect(r.deltas).toBe(0)
    }
    // The queued one waited for a slot.
    expect(Math.max(...by("OK").map((r) => r.final?.timings?.queueMs ?? 0))).toBeGreaterThan(0)
  })
})
