// The live readiness probe (layers/engine/probe.ts) against real loopback servers: each outcome the supervisor
// acts on (ready, "not yet" with its phase, the attempt's own timeout), and the completion probe's POST. Then who
// holds the port that answers (layers/engine/portHolder.ts): the /proc tables read, and real listeners in this
// process's group and in another's.
import { spawn } from "node:child_process"
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http"
import type { AddressInfo } from "node:net"
import { assert, it as effectIt } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import { TestClock } from "effect/testing"
import { afterEach, describe, expect, it } from "vitest"
import { listenerInodes, portHolder, portHolderOf, socketInode } from "../../src/layers/engine/portHolder.ts"
import { probeOnce } from "../../src/layers/engine/probe.ts"
import { readStat } from "../../src/layers/engine/processGroup.ts"
import { settle } from "../support/poll.ts"
import { freePort } from "../support/ports.ts"

const servers: Array<Server> = []
afterEach(async () => {
  for (const s of servers.splice(0)) {
    s.closeAllConnections()
    await new Promise((r) => s.close(r))
  }
})

/** A loopback HTTP server with `handler`; resolves to its base URL. */
const serve = async (handler: (req: IncomingMessage, res: ServerResponse) => void): Promise<string> => {
  const s = createServer(handler)
  servers.push(s)
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", r))
  return `http://127.0.0.1:${(s.address() as AddressInfo).port}`
}

const run = (probe: Parameters<typeof probeOnce>[0], timeoutMs = 2_000) =>
  Effect.runPromise(probeOnce(probe, timeoutMs))

describe("probeOnce", () => {
  it("200 is ready; 503 is 'loading' with the status; the body is drained so the connection is reused", async () => {
    let status = 503
    const sockets = new Set<unknown>()
    const url = await serve((req, res) => {
      sockets.add(req.socket)
      res.writeHead(status).end("x".repeat(100_000))
    })
    // undici puts a socket back in its pool one event-loop turn after the body closed (fetch does the same);
    // the supervisor's probes are seconds apart. An undrained body would keep it busy: a new socket each time.
    const probe = async () => {
      const r = await run({ kind: "http", url: `${url}/health` })
      await new Promise((resolve) => setImmediate(resolve))
      return r
    }
    expect(await probe()).toEqual({ ok: false, reason: "HTTP 503", phase: "loading" })
    status = 200
    expect(await probe()).toEqual({ ok: true })
    expect(await probe()).toEqual({ ok: true })
    expect(sockets.size).toBe(1)
  })

  it("only 200 is ready (the module's contract): another 2xx is 'loading' with its status", async () => {
    let status = 204
    const url = await serve((_req, res) => res.writeHead(status).end())
    expect(await run({ kind: "http", url: `${url}/health` })).toEqual({
      ok: false,
      reason: "HTTP 204",
      phase: "loading"
    })
    status = 202
    const body = { model: "m", prompt: "hi", max_tokens: 1 }
    expect(await run({ kind: "completion", url: `${url}/v1/completions`, body })).toEqual({
      ok: false,
      reason: "HTTP 202",
      phase: "loading"
    })
  })

  it("a closed port is 'connection refused', waiting for the port", async () => {
    const port = await freePort()
    expect(await run({ kind: "http", url: `http://127.0.0.1:${port}/health` })).toEqual({
      ok: false,
      reason: "connection refused",
      phase: "waiting for port"
    })
  })

  it("a server that never answers is bounded by the attempt's timeout, and the request is aborted", async () => {
    let closed: () => void = () => undefined
    const aborted = new Promise<void>((r) => {
      closed = r
    })
    const url = await serve((req) => {
      req.socket.once("close", closed)
    })
    expect(await run({ kind: "http", url: `${url}/health` }, 200)).toEqual({
      ok: false,
      reason: "no answer within 200 ms",
      phase: "probe timeout"
    })
    await aborted
  })

  effectIt.effect("the attempt ends at its timeout on the Clock, not later", () =>
    Effect.gen(function* () {
      let arrived: () => void = () => undefined
      const atServer = new Promise<void>((r) => {
        arrived = r
      })
      // a server that takes the request and never answers
      const url = yield* Effect.promise(() => serve(() => arrived()))
      const fiber = yield* Effect.forkChild(probeOnce({ kind: "http", url: `${url}/health` }, 1_000))
      // the request is at the server: the attempt, and its bound, run
      yield* Effect.promise(() => atServer)
      yield* TestClock.adjust(999)
      assert.isUndefined(fiber.pollUnsafe(), "no verdict before the bound")
      yield* TestClock.adjust(1)
      yield* settle(
        "the verdict at the bound",
        Effect.sync(() => fiber.pollUnsafe() !== undefined),
        5_000
      )
      assert.deepStrictEqual(yield* Fiber.join(fiber), {
        ok: false,
        reason: "no answer within 1000 ms",
        phase: "probe timeout"
      })
    })
  )

  it("a model list's 200 that lists the served model still loading (meta: null, a newer llama-server) is 'loading'", async () => {
    let body = ""
    const url = await serve((_req, res) => res.writeHead(200, { "content-type": "application/json" }).end(body))
    const probe = async (modelList: string | undefined) => {
      const r = await run({ kind: "http", url: `${url}/v1/models`, ...(modelList === undefined ? {} : { modelList }) })
      await new Promise((resolve) => setImmediate(resolve))
      return r
    }
    const card = (id: string, meta: unknown) => ({ id, object: "model", owned_by: "llamacpp", meta })
    const list = (...data: ReadonlyArray<unknown>) => JSON.stringify({ object: "list", data })
    const loading = { ok: false, reason: "the model list shows the model still loading (meta: null)", phase: "loading" }
    body = list(card("m", null))
    expect(await probe("m")).toEqual(loading)
    // Not a model list (ready_probe_url set): its 200 is ready whatever it says
    expect(await probe(undefined)).toEqual({ ok: true })
    // A server naming its only model otherwise: that card is ours
    body = list(card("/models/m.gguf", null))
    expect(await probe("m")).toEqual(loading)
    // Only the served model's card counts: a gateway listing another model loading, ours loaded, is ready; ours
    // loading beside another loaded is not
    body = list(card("m", { n_ctx: 4096 }), card("other", null))
    expect(await probe("m")).toEqual({ ok: true })
    body = list(card("other", { n_ctx: 4096 }), card("m", null))
    expect(await probe("m")).toEqual(loading)
    body = list(card("a", null), card("b", null))
    expect(await probe("m")).toEqual({ ok: true })
    // Loaded; cards without a meta key (vLLM, SGLang, a gateway); no cards; an answer that is no JSON: the 200 stands
    for (const b of [
      list(card("m", { n_ctx: 4096 })),
      list({ id: "m", object: "model", max_model_len: 4096 }),
      list(),
      "not json"
    ]) {
      body = b
      expect(await probe("m")).toEqual({ ok: true })
    }
    // Entries that are not objects are no cards: the only card left is ours; a null entry is skipped, not a failure
    body = list("x", card("other", null))
    expect(await probe("m")).toEqual(loading)
    body = list(null, card("m", null))
    expect(await probe("m")).toEqual(loading)
    // A listing within the bytes read (1 MiB), a gateway's of some 100 KiB, is read whole: ours loading is 'loading'
    body = list(card("m", null), { id: "x".repeat(100 * 1024) })
    expect(await probe("m")).toEqual(loading)
    // A listing over the bytes read is taken at its 200, unread
    body = list(card("m", null), { id: "x".repeat(1024 * 1024) })
    expect(await probe("m")).toEqual({ ok: true })
    body = list(card("m", null))
    expect(await probe("m")).toEqual(loading)
  })

  it("a body that breaks off after its status: the status answers, unless it is the model list to be read", async () => {
    // Headers and part of the promised body, then the connection is cut (undici: a body shorter than its length).
    let status = 503
    const url = await serve((req, res) => {
      res.writeHead(status, { "content-type": "application/json", "content-length": "1000" })
      res.write('{"object":"list","data":[', () => req.socket.destroy())
    })
    expect(await run({ kind: "http", url: `${url}/health` })).toEqual({
      ok: false,
      reason: "HTTP 503",
      phase: "loading"
    })
    expect(await run({ kind: "http", url: `${url}/v1/models`, modelList: "m" })).toEqual({
      ok: false,
      reason: "HTTP 503",
      phase: "loading"
    })
    status = 200
    expect(await run({ kind: "http", url: `${url}/health` })).toEqual({ ok: true })
    // The list whose card says whether the model loads never came whole: no verdict from it
    const cut = await run({ kind: "http", url: `${url}/v1/models`, modelList: "m" })
    if (cut.ok) return expect.unreachable("a model list cut short is not ready")
    expect(cut.reason).toMatch(/^UND_ERR_\w+: \w|ECONNRESET/)
    expect(cut.phase).toBe(`unreachable (${cut.reason})`)
  })

  it("a completion probe POSTs its JSON body", async () => {
    let seen: { method: string | undefined; type: string | undefined; body: string } | undefined
    const url = await serve((req, res) => {
      let body = ""
      req.setEncoding("utf8")
      req.on("data", (c: string) => {
        body += c
      })
      req.on("end", () => {
        seen = { method: req.method, type: req.headers["content-type"], body }
        res.writeHead(200).end("{}")
      })
    })
    const body = { model: "m", prompt: "hi", max_tokens: 1 }
    expect(await run({ kind: "completion", url: `${url}/v1/completions`, body })).toEqual({ ok: true })
    expect(seen).toEqual({ method: "POST", type: "application/json", body: JSON.stringify(body) })
  })

  it("a connection closed before any answer is 'not yet', its phase naming undici's code and words", async () => {
    const url = await serve((req) => req.socket.destroy())
    const r = await run({ kind: "http", url: `${url}/health` })
    if (r.ok) return expect.unreachable("a closed connection is not an answer")
    expect(r.reason).toMatch(/^UND_ERR_\w+: \w|ECONNRESET/)
    expect(r.phase).toBe(`unreachable (${r.reason})`)
  })

  it("a host that does not resolve is 'unreachable (...)', not a port still closed", async () => {
    // .invalid never resolves (RFC 2606); a machine without a DNS server answers EAI_AGAIN instead.
    const r = await run({ kind: "http", url: "http://engine.invalid:8000/health" })
    if (r.ok) return expect.unreachable("engine.invalid resolved")
    expect(r.reason).toMatch(/^getaddrinfo (ENOTFOUND|EAI_AGAIN) engine\.invalid$/)
    expect(r.phase).toBe(`unreachable (${r.reason})`)
  })
})

describe("portHolder", () => {
  const header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode"
  // 8000 = 0x1F40: a listener (0A) on 0.0.0.0, a connection to it (01), and a listener on another port
  const tcp = [
    header,
    "   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4711 1 0000000000000000 100 0 0 10 0",
    "   1: 0100007F:1F40 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000  1000        0 4712 1 0000000000000000 20 4 30 10 -1",
    "   2: 0100007F:1F41 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4713 1 0000000000000000 100 0 0 10 0"
  ].join("\n")
  const tcp6 = [
    header,
    "   0: 00000000000000000000000001000000:1F40 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4714 1 0000000000000000 100 0 0 10 0"
  ].join("\n")

  it("reads the listeners on a port from /proc/net/tcp and tcp6, and socket inodes from fd links", () => {
    expect(listenerInodes(tcp, 8000)).toEqual(["4711"])
    expect(listenerInodes(tcp6, 8000)).toEqual(["4714"])
    expect(listenerInodes(tcp, 8002)).toEqual([])
    expect(listenerInodes("", 8000)).toEqual([])
    expect(socketInode("socket:[4711]")).toBe("4711")
    expect(socketInode("pipe:[4711]")).toBeUndefined()
    expect(socketInode("/dev/null")).toBeUndefined()
  })

  it("the engine's when its group holds a listener; another's only when every member's sockets were read", () => {
    expect(portHolderOf(["4711"], new Set(["9", "4711"]), true)).toBe("engine")
    expect(portHolderOf(["4711"], new Set(["9"]), true)).toBe("other")
    expect(portHolderOf(["4711"], new Set(["9"]), false)).toBe("unknown")
    expect(portHolderOf([], new Set(["4711"]), true)).toBe("unknown")
  })

  it("a listener of this process's group is its own; one of another group is another's; none is unknown", async () => {
    const ownGroup = readStat(process.pid)?.pgrp
    if (ownGroup === undefined) return expect.unreachable("no /proc here")
    const url = await serve((_req, res) => res.end())
    const ownPort = Number(new URL(url).port)
    expect(portHolder(ownPort, ownGroup)).toBe("engine")

    // a listener in a process of its own group, as a service that took the engine's port
    const other = spawn(
      process.execPath,
      [
        "-e",
        "const s = require('node:net').createServer().listen(0, '127.0.0.1', () => console.log(s.address().port))"
      ],
      { detached: true, stdio: ["ignore", "pipe", "ignore"] }
    )
    const exited = new Promise((r) => other.once("exit", r))
    try {
      const port = await new Promise<number>((resolve) => other.stdout?.once("data", (c: Buffer) => resolve(Number(c))))
      expect(portHolder(port, ownGroup)).toBe("other")
      expect(portHolder(port, other.pid!)).toBe("engine")
    } finally {
      other.kill("SIGKILL")
      await exited
    }
    expect(portHolder(await freePort(), ownGroup)).toBe("unknown")
  })
})
