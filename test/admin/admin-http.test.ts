// Admin HTTP over real loopback with test layers: every endpoint, /metrics as Prometheus text, the
// bearer-token rules, the refusal to start on a non-loopback address without a token, a clear error when
// the address is in use, and a release that clients stalled mid-request cannot hold up.
import * as http from "node:http"
import * as net from "node:net"
import { Context, Effect, Exit, Layer, Logger, Scope } from "effect"
import { afterEach, describe, expect, it } from "vitest"
import * as AdminLive from "../../src/layers/admin/Admin.ts"
import { ADMIN_METHODS } from "../../src/layers/admin/methods.ts"
import * as ConfigLayer from "../../src/layers/config/Config.ts"
import { engineFor } from "../../src/layers/engine/backends/index.ts"
import { AdminServer, authorize, fromWebPage, readiness } from "../../src/services/admin/Admin.ts"
import { Config } from "../../src/services/config/Config.ts"
import { EngineProcess, type EngineState, type ExitRecord } from "../../src/services/engine/EngineProcess.ts"
import { parsePromText } from "../../src/services/engine/PromText.ts"
import { isLoopbackHost } from "../../src/services/net/HostPort.ts"
import { Cordon, CordonPersistError, make as makeCordon } from "../../src/services/node/Cordon.ts"
import { Drain } from "../../src/services/node/Drain.ts"
import { Metrics } from "../../src/services/observability/Metrics.ts"
import * as CordonTest from "../../src/testing/Cordon.ts"
import * as MetricsTest from "../../src/testing/Metrics.ts"
import * as NodeStatusLayer from "../../src/testing/NodeStatus.ts"
import { NodeStatusTest } from "../../src/testing/NodeStatus.ts"
import * as NvmlTest from "../../src/testing/Nvml.ts"

const exit: ExitRecord = {
  run: 0,
  pid: 4242,
  code: 1,
  signal: null,
  startedAt: Date.parse("2025-01-01T00:00:00Z"),
  endedAt: Date.parse("2025-01-01T00:00:05Z"),
  runtimeMs: 5000,
  reason: "exited",
  endedBy: { kind: "exited" },
  lastLines: ["[stderr] CUDA out of memory"],
  oomKills: undefined,
  memoryLimitBytes: undefined,
  hint: "the engine ran out of GPU memory while loading"
}
/** A later run the kernel's OOM killer ended: its kills in the agent's memory cgroup and the cgroup's limit. */
const oomExit: ExitRecord = {
  ...exit,
  run: 1,
  code: null,
  signal: "SIGKILL",
  startedAt: exit.endedAt,
  endedAt: exit.endedAt + 5000,
  oomKills: 2,
  memoryLimitBytes: 8 * 2 ** 30,
  hint: undefined
}

const fakeEngine = Layer.effect(
  EngineProcess,
  Effect.map(Config, (config) => {
    const state: EngineState = { _tag: "Ready", since: exit.endedAt + 1000, run: 1 }
    return {
      plan: engineFor(config.engine.kind).render(config),
      state: Effect.succeed(state),
      changes: Effect.never as never,
      awaitReady: Effect.void,
      restarts: Effect.succeed(1),
      exits: Effect.succeed([oomExit, exit]),
      pid: Effect.succeed(4321),
      restart: () => Effect.succeed("restarting" as const),
      stop: Effect.void
    }
  })
)

type Services = AdminServer | Metrics | Drain | Cordon | NodeStatusTest

let scope: Scope.Closeable | undefined
afterEach(async () => {
  if (scope) await Effect.runPromise(Scope.close(scope, Exit.void))
  scope = undefined
})

/** Starts the admin server; with `logs`, its log lines go there ("<level> <message> <fields>"). */
const start = async (
  agent: Record<string, unknown> = {},
  logs?: Array<string>,
  cordon: Layer.Layer<Cordon> = CordonTest.layerMemory
) => {
  const config = ConfigLayer.layerFromObject({ models: { m: { hf_repo: "org/m" } }, agent })
  const deps = Layer.mergeAll(
    MetricsTest.layerTest,
    NodeStatusLayer.layerTest({ nodeId: "node-a" }),
    Drain.layer,
    NvmlTest.layerFixed([]),
    cordon,
    fakeEngine
  ).pipe(Layer.provideMerge(config))
  const logger = Logger.make(({ logLevel, message }) =>
    logs?.push(
      `${logLevel} ${[message]
        .flat()
        .map((m) => (typeof m === "string" ? m : JSON.stringify(m)))
        .join(" ")}`
    )
  )
  const app = AdminLive.layer({ extras: { registration: Effect.succeed({ state: "standalone" }) } }).pipe(
    Layer.provideMerge(deps),
    Layer.provide(logs === undefined ? Layer.empty : Logger.layer([logger]))
  )
  scope = await Effect.runPromise(Scope.make())
  const ctx = await Effect.runPromise(Layer.buildWithScope(app, scope))
  const run = <A>(eff: Effect.Effect<A, never, Services>) => Effect.runPromise(Effect.provideContext(eff, ctx))
  const url = Context.get(ctx, AdminServer).url
  return { url, run }
}

/** A raw TCP client of the admin port: what a stalled or half-dead HTTP client looks like to the server. */
const rawClient = async (url: string) => {
  const socket = net.connect(Number(new URL(url).port), "127.0.0.1")
  await new Promise<void>((resolve, reject) => {
    socket.once("connect", () => resolve())
    socket.once("error", reject)
  })
  socket.on("error", () => undefined)
  let received = ""
  const waiters: Array<() => void> = []
  socket.on("data", (d: Buffer) => {
    received += d.toString("latin1")
    for (const w of waiters.splice(0)) w()
  })
  const closed = new Promise<void>((resolve) => socket.once("close", () => resolve()))
  /** Resolves once the server's answers so far contain `text`. */
  const seen = (text: string): Promise<void> =>
    received.includes(text) ? Promise.resolve() : new Promise((resolve) => waiters.push(() => resolve(seen(text))))
  return { socket, closed, seen }
}

/** Rejects when `p` takes longer than `ms`. */
const within = <A>(what: string, ms: number, p: Promise<A>): Promise<A> => {
  let timer: NodeJS.Timeout | undefined
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} took longer than ${ms} ms`)), ms)
  })
  return Promise.race([p, late]).finally(() => clearTimeout(timer))
}

const get = async (url: string, init?: RequestInit) => {
  const res = await fetch(url, init)
  return { status: res.status, type: res.headers.get("content-type") ?? "", text: await res.text(), res }
}

describe("admin HTTP on loopback", () => {
  it("serves /healthz, /metrics as Prometheus text, and 404 for unknown paths", async () => {
    const { url, run } = await start({ listen_admin: "127.0.0.1:0" })
    expect(url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/)
    expect(await get(`${url}/healthz`)).toMatchObject({ status: 200, text: "ok" })

    await run(Effect.map(Metrics, (m) => m.requests.inc({ role: "both", model: "m", grpc_code: "OK" }, 2)))
    const metrics = await get(`${url}/metrics`)
    expect(metrics.status).toBe(200)
    expect(metrics.type).toBe("text/plain; version=0.0.4; charset=utf-8")
    const lines = metrics.text.split("\n").filter((l) => l.trim() !== "" && !l.startsWith("#"))
    const samples = parsePromText(metrics.text)
    expect(samples.length).toBe(lines.length) // every sample line parses
    expect(samples).toContainEqual({
      name: "cgn_agent_requests_total",
      labels: { role: "both", model: "m", grpc_code: "OK" },
      value: 2
    })
    expect(metrics.text).toContain("# TYPE cgn_agent_time_to_first_token_seconds histogram")

    expect((await get(`${url}/nope`)).status).toBe(404)
    expect((await get(`${url}/drain`)).status).toBe(405) // GET: only POST drains, and says so
    for (const method of ["PUT", "PATCH", "DELETE"]) {
      const r = await fetch(`${url}/drain`, { method })
      expect({ method, status: r.status, allow: r.headers.get("allow") }).toEqual({
        method,
        status: 405,
        allow: "POST, OPTIONS"
      })
    }
  })

  it("a method a known path does not serve is 405 with Allow, OPTIONS 204 with it, from one table; unknown paths 404", async () => {
    const { url, run } = await start({ listen_admin: "127.0.0.1:0", admin_token: "s3cret" })
    const wrong = async (method: string, path: string, headers: Record<string, string> = {}) => {
      const r = await fetch(`${url}${path}`, { method, headers })
      return { method, path, status: r.status, allow: r.headers.get("allow"), body: await r.text() }
    }
    for (const path of ["/healthz", "/readyz", "/metrics", "/status"]) {
      for (const method of ["POST", "PUT", "PATCH", "DELETE"]) {
        expect(await wrong(method, path)).toEqual({
          method,
          path,
          status: 405,
          allow: "GET, HEAD, OPTIONS",
          body: JSON.stringify({ error: `use GET ${path}` })
        })
      }
    }
    // every path of the table, both ways: the served method is never 405, any other answered method is
    for (const [path, allowed] of Object.entries(ADMIN_METHODS)) {
      const other = allowed === "GET" ? "POST" : "GET"
      const allow = allowed === "GET" ? "GET, HEAD, OPTIONS" : "POST, OPTIONS"
      expect(await wrong(other, path)).toMatchObject({ status: 405, allow })
      // OPTIONS says the same, with no CORS permission for a web page's preflight
      const options = await fetch(`${url}${path}`, { method: "OPTIONS", headers: { origin: "http://evil.example" } })
      expect([options.status, options.headers.get("allow")]).toEqual([204, allow])
      expect(options.headers.get("access-control-allow-origin")).toBeNull()
    }
    expect((await wrong("OPTIONS", "/nope")).status).toBe(404)
    // a POST to a GET path from a web page pulls nothing either way; the gate still answers the served method
    expect((await wrong("POST", "/status", { origin: "http://evil.example" })).status).toBe(405)
    expect((await wrong("GET", "/status")).status).toBe(401)
    expect(await run(Effect.flatMap(Drain, (d) => d.draining))).toBe(false)
    for (const method of ["GET", "POST", "DELETE"]) expect((await wrong(method, "/nope")).status).toBe(404)
    // probes and scrapes stay open with a token set, HEAD too (the router's fallback to GET)
    for (const path of ["/healthz", "/metrics"]) {
      expect((await wrong("GET", path)).status).toBe(200)
      expect((await wrong("HEAD", path)).status).toBe(200)
    }
    expect((await wrong("HEAD", "/drain")).status).toBe(405)
  })

  it("answers /readyz from the node state and drain, /status with forensics and extras, /drain idempotently", async () => {
    const { url, run } = await start({ listen_admin: "127.0.0.1:0" })
    const notReady = await get(`${url}/readyz`)
    expect(notReady.status).toBe(503)
    expect(notReady.text).toBe("starting (engine starting)")

    await run(Effect.flatMap(NodeStatusTest, (t) => t.setState("ready")))
    expect(await get(`${url}/readyz`)).toMatchObject({ status: 200, text: "ready" })

    const status = await get(`${url}/status`)
    expect(status.status).toBe(200)
    const body = JSON.parse(status.text)
    expect(body.health).toMatchObject({ nodeId: "node-a", state: "ready" })
    expect(body.registration).toEqual({ state: "standalone" })
    expect(body.engine.state._tag).toBe("Ready")
    expect(body.engine.restarts).toBe(1)
    expect(body.engine.pid).toBe(4321)
    expect(body.engine.exits).toEqual([
      {
        run: 1,
        pid: 4242,
        code: null,
        signal: "SIGKILL",
        reason: "exited",
        startedAt: "2025-01-01T00:00:05.000Z",
        endedAt: "2025-01-01T00:00:10.000Z",
        runtimeMs: 5000,
        oomKills: 2,
        memoryLimitBytes: 8589934592,
        // none known: null, as oomKills
        hint: null,
        lastLines: ["[stderr] CUDA out of memory"]
      },
      {
        run: 0,
        pid: 4242,
        code: 1,
        signal: null,
        reason: "exited",
        startedAt: "2025-01-01T00:00:00.000Z",
        endedAt: "2025-01-01T00:00:05.000Z",
        runtimeMs: 5000,
        // unknown: null, not left out, so a reader tells "not known" from "no such field"
        oomKills: null,
        memoryLimitBytes: null,
        hint: "the engine ran out of GPU memory while loading",
        lastLines: ["[stderr] CUDA out of memory"]
      }
    ])

    // A web page in a browser on the host (a cross-site form POST needs no preflight) neither drains nor reads.
    const fromPage = await get(`${url}/drain`, { method: "POST", headers: { origin: "http://evil.example" } })
    expect(fromPage.status).toBe(403)
    expect(fromPage.text).toMatch(/web page/)
    expect((await get(`${url}/status`, { headers: { "sec-fetch-site": "cross-site" } })).status).toBe(403)
    expect(await run(Effect.flatMap(Drain, (d) => d.draining))).toBe(false)

    const first = await get(`${url}/drain`, { method: "POST" })
    expect(first.status).toBe(202)
    expect(JSON.parse(first.text)).toEqual({ draining: true, alreadyDraining: false })
    const second = await get(`${url}/drain`, { method: "POST" })
    expect(JSON.parse(second.text)).toEqual({ draining: true, alreadyDraining: true })
    expect(await run(Effect.flatMap(Drain, (d) => d.draining))).toBe(true)
    // Starts after the drain began, two at once, answer false: the POST above began it (one true of eight starts
    // at once: test/node/drain.test.ts).
    const [a, b] = await run(Effect.flatMap(Drain, (d) => Effect.all([d.start, d.start], { concurrency: 2 })))
    expect([a, b]).toEqual([false, false])
    expect(await get(`${url}/readyz`)).toMatchObject({ status: 503, text: "draining" })
    expect((await get(`${url}/healthz`)).status).toBe(200) // liveness stays up while draining
  })
})

describe("admin HTTP release", () => {
  it("drops clients stalled mid-request instead of waiting for them (the agent's exit after a drain)", async () => {
    const { url } = await start({ listen_admin: "127.0.0.1:0" })
    // A client that stalled halfway through its request headers (or whose host vanished): node:http's close
    // waits for it until headersTimeout (60 s, checked every 30 s).
    const headers = await rawClient(url)
    headers.socket.write("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    // A client answered while its body is still owed.
    const body = await rawClient(url)
    body.socket.write("POST /drain HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\nabc")
    await body.seen("HTTP/1.1 202")
    // An idle keep-alive client. Connections are accepted in order, so once it is answered the server holds
    // the two above.
    const idle = await rawClient(url)
    idle.socket.write("GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    await idle.seen("HTTP/1.1 503")

    try {
      const s = scope!
      scope = undefined
      const started = performance.now()
      // Bounded well below node's 60 s, well above CLOSE_GRACE (1 s) on a loaded machine.
      await within("closing the admin server", 10_000, Effect.runPromise(Scope.close(s, Exit.void)))
      console.log(`admin server released in ${(performance.now() - started).toFixed(0)} ms`)
      await within(
        "the server closing the stalled connections",
        5_000,
        Promise.all([headers.closed, body.closed, idle.closed])
      )
      await expect(fetch(`${url}/healthz`)).rejects.toThrow() // not listening any more
    } finally {
      for (const c of [headers, body, idle]) c.socket.destroy()
    }
  })
})

describe("admin HTTP listener errors", () => {
  it("an error the listening socket emits after listen (a failed accept) is logged and the server goes on serving", async () => {
    const logs: Array<string> = []
    const { url } = await start({ listen_admin: "127.0.0.1:0" }, logs)
    const port = Number(new URL(url).port)
    // The layer's node:http server, as Node lists it among the handles that keep the process alive.
    const handles = (process as unknown as { _getActiveHandles(): Array<unknown> })._getActiveHandles()
    const server = handles.find(
      (h): h is http.Server => h instanceof http.Server && (h.address() as net.AddressInfo | null)?.port === port
    )
    expect(server).toBeDefined()
    // What node:net's onconnection emits when accept(2) fails (lib/net.js): ENFILE, ENOBUFS, or EMFILE once
    // libuv's reserve fd is gone. Unheard, emit() throws it: in the daemon, an uncaught exception that ends it.
    const error = Object.assign(new Error("accept ENFILE"), { code: "ENFILE", errno: -23, syscall: "accept" })
    expect(() => server!.emit("error", error)).not.toThrow()
    expect(logs).toContainEqual(
      expect.stringMatching(/^Error admin HTTP listener error; still serving .*accept ENFILE/)
    )
    expect(await get(`${url}/healthz`)).toMatchObject({ status: 200, text: "ok" })
    expect(server!.listening).toBe(true)
  })
})

describe("admin HTTP auth", () => {
  it("requires the configured bearer token for /status and /drain, never for probes and metrics", async () => {
    const { url, run } = await start({ listen_admin: "127.0.0.1:0", admin_token: "s3cret" })
    const missing = await get(`${url}/status`)
    expect(missing.status).toBe(401)
    expect(missing.res.headers.get("www-authenticate")).toContain("Bearer")
    expect((await get(`${url}/status`, { headers: { authorization: "Bearer wrong" } })).status).toBe(401)
    expect((await get(`${url}/drain`, { method: "POST", headers: { authorization: "Basic czNjcmV0" } })).status).toBe(
      401
    )
    expect(await run(Effect.flatMap(Drain, (d) => d.draining))).toBe(false)
    expect((await get(`${url}/status`, { headers: { authorization: "Bearer s3cret" } })).status).toBe(200)
    const drained = await get(`${url}/drain`, { method: "POST", headers: { authorization: "bearer s3cret" } })
    expect(drained.status).toBe(202)
    for (const path of ["/healthz", "/metrics"]) expect((await get(`${url}${path}`)).status).toBe(200)
    expect((await get(`${url}/readyz`)).status).toBe(503)
  })

  it("refuses to start on a non-loopback address without a token, before binding", async () => {
    const config = ConfigLayer.layerFromObject({
      models: { m: { hf_repo: "org/m" } },
      agent: { listen_admin: "0.0.0.0:0" }
    })
    const deps = Layer.mergeAll(
      MetricsTest.layerTest,
      NodeStatusLayer.layerTest(),
      Drain.layer,
      NvmlTest.layerFixed([]),
      CordonTest.layerMemory,
      fakeEngine
    ).pipe(Layer.provideMerge(config))
    const result = await Effect.runPromise(
      Effect.scoped(Layer.build(AdminLive.layer().pipe(Layer.provide(deps)))).pipe(Effect.flip)
    )
    expect(result._tag).toBe("AdminTokenRequired")
    expect(result.message).toContain('agent.listen_admin = "0.0.0.0:0" is not a loopback address')
    expect(result.message).toContain("CGN_AGENT_ADMIN_TOKEN") // the variable the k8s manifests set
  })

  it("an address in use fails with AdminListenError naming the key and the system's reason", async () => {
    const taken = net.createServer()
    await new Promise<void>((r) => taken.listen(0, "127.0.0.1", r))
    const listen = `127.0.0.1:${(taken.address() as net.AddressInfo).port}`
    try {
      const config = ConfigLayer.layerFromObject({
        models: { m: { hf_repo: "org/m" } },
        agent: { listen_admin: listen }
      })
      const deps = Layer.mergeAll(
        MetricsTest.layerTest,
        NodeStatusLayer.layerTest(),
        Drain.layer,
        NvmlTest.layerFixed([]),
        CordonTest.layerMemory,
        fakeEngine
      ).pipe(Layer.provideMerge(config))
      const result = await Effect.runPromise(
        Effect.scoped(Layer.build(AdminLive.layer().pipe(Layer.provide(deps)))).pipe(Effect.flip)
      )
      expect(result._tag).toBe("AdminListenError")
      expect(result.message).toBe(
        `agent.listen_admin = "${listen}": listen EADDRINUSE: address already in use ${listen}`
      )
    } finally {
      await new Promise((r) => taken.close(r))
    }
  })

  it("pure rules: loopback hosts, token decisions, readiness reasons", () => {
    for (const h of ["127.0.0.1", "127.1.2.3", "localhost", "::1", "[::1]", "::ffff:127.0.0.1"]) {
      expect(isLoopbackHost(h)).toBe(true)
    }
    for (const h of ["0.0.0.0", "::", "[::]", "10.0.0.5", "128.0.0.1", "example.com"])
      expect(isLoopbackHost(h)).toBe(false)
    const table: Array<[boolean, string | undefined, string | undefined, string]> = [
      [true, undefined, undefined, "open"],
      [true, "t", undefined, "missing"],
      [true, "t", "Bearer t", "allowed"],
      [false, undefined, "Bearer t", "missing"],
      [false, "t", "Bearer x", "wrong"],
      [false, "t", "Bearer tt", "wrong"],
      [false, "t", "Bearer  t ", "allowed"],
      [false, "t", "Token t", "missing"]
    ]
    for (const [loopback, token, header, want] of table) expect(authorize({ loopback, token, header })).toBe(want)
    // A web page gets nothing from the open loopback listener; with a token, the token decides.
    expect(authorize({ loopback: true, token: undefined, header: undefined, webPage: true })).toBe("browser")
    expect(authorize({ loopback: true, token: "t", header: "Bearer t", webPage: true })).toBe("allowed")
    expect(
      [
        [undefined, undefined],
        [undefined, "none"],
        ["http://evil.example", undefined],
        ["null", undefined],
        [undefined, "cross-site"],
        [undefined, "same-origin"]
      ].map(([origin, site]) => fromWebPage(origin, site))
    ).toEqual([false, false, true, true, true, true])
    const h = NodeStatusLayer.testNodeHealth({
      state: "unhealthy",
      engine: { kind: "vllm", model: "m", phase: "unhealthy", restarts: 2, detail: "probe timeout" }
    })
    expect(readiness(h, false)).toEqual({ ready: false, reason: "unhealthy (engine unhealthy: probe timeout)" })
    expect(readiness({ ...h, state: "ready" }, true)).toEqual({ ready: false, reason: "draining" })
  })
})

describe("admin HTTP cordon", () => {
  const post = (url: string, body?: string, headers: Record<string, string> = {}) =>
    get(url, { method: "POST", headers: { "content-type": "application/json", ...headers }, ...(body ? { body } : {}) })

  it("POST /cordon and /uncordon: idempotent answers, the reason in /status, 409 under a drain, 405 for GET", async () => {
    const { url, run } = await start()
    for (const path of ["/cordon", "/uncordon"]) {
      const wrong = await get(`${url}${path}`)
      expect(wrong.status).toBe(405)
      expect(wrong.res.headers.get("allow")).toBe("POST, OPTIONS")
    }
    expect((await post(`${url}/cordon`, "{not json")).status).toBe(400)
    expect((await post(`${url}/cordon`, JSON.stringify({ reason: "a\nb" }))).status).toBe(400)
    expect((await post(`${url}/cordon`, JSON.stringify({ reason: "x".repeat(257) }))).status).toBe(400)
    expect(await run(Effect.flatMap(Cordon, (c) => c.cordoned))).toBe(false)

    const first = await post(`${url}/cordon`, JSON.stringify({ reason: "GPU 3 Xid 79" }))
    expect(first.status).toBe(202)
    expect(JSON.parse(first.text)).toMatchObject({ cordoned: true, alreadyCordoned: false })
    const again = await post(`${url}/cordon`)
    expect(JSON.parse(again.text)).toMatchObject({ cordoned: true, alreadyCordoned: true })
    const status = JSON.parse((await get(`${url}/status`)).text)
    expect(status.cordon).toMatchObject({ reason: "GPU 3 Xid 79" })
    expect(Date.parse(status.cordon.since)).not.toBeNaN()

    expect(JSON.parse((await post(`${url}/uncordon`)).text)).toEqual({ cordoned: false, wasCordoned: true })
    expect(JSON.parse((await post(`${url}/uncordon`)).text)).toEqual({ cordoned: false, wasCordoned: false })
    expect(JSON.parse((await get(`${url}/status`)).text).cordon).toBeNull()

    await post(`${url}/cordon`)
    await post(`${url}/drain`)
    const refused = await post(`${url}/uncordon`)
    expect(refused.status).toBe(409)
    expect(refused.text).toMatch(/draining/)
    expect(await run(Effect.flatMap(Cordon, (c) => c.cordoned))).toBe(true)
  })

  it("needs the bearer token when one is set, and refuses web pages on open loopback", async () => {
    const { url, run } = await start({ listen_admin: "127.0.0.1:0", admin_token: "s3cret" })
    for (const path of ["/cordon", "/uncordon"]) {
      expect((await post(`${url}${path}`)).status).toBe(401)
      expect((await post(`${url}${path}`, undefined, { authorization: "Bearer wrong" })).status).toBe(401)
    }
    expect(await run(Effect.flatMap(Cordon, (c) => c.cordoned))).toBe(false)
    expect((await post(`${url}/cordon`, undefined, { authorization: "Bearer s3cret" })).status).toBe(202)
    expect(await run(Effect.flatMap(Cordon, (c) => c.cordoned))).toBe(true)
    expect((await post(`${url}/uncordon`, undefined, { authorization: "Bearer s3cret" })).status).toBe(202)
    expect(await run(Effect.flatMap(Cordon, (c) => c.cordoned))).toBe(false)
    await Effect.runPromise(Scope.close(scope!, Exit.void))
    scope = undefined

    const open = await start()
    const fromPage = await post(`${open.url}/cordon`, undefined, { origin: "http://evil.example" })
    expect(fromPage.status).toBe(403)
    expect(await open.run(Effect.flatMap(Cordon, (c) => c.cordoned))).toBe(false)
  })

  it("a cordon that cannot be persisted is a 500 that says why, and the node stays as it was", async () => {
    const failing = Layer.effect(
      Cordon,
      makeCordon(undefined, {
        write: () => Effect.fail(new CordonPersistError({ file: "/s/cordon.json", reason: "EROFS: read-only" })),
        remove: Effect.void
      })
    )
    const { url, run } = await start({}, undefined, failing)
    const res = await post(`${url}/cordon`)
    expect(res.status).toBe(500)
    expect(JSON.parse(res.text).error).toMatch(/EROFS: read-only/)
    expect(await run(Effect.flatMap(Cordon, (c) => c.cordoned))).toBe(false)
    expect((await get(`${url}/healthz`)).status).toBe(200)
  })
})
