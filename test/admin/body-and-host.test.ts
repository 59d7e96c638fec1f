// Admin HTTP's request limits over real loopback: every body is read up to ADMIN_BODY_LIMIT (a Content-Length over
// it is 413 unread, a body growing past it is cut and its connection closed, a failed read does nothing), and on a
// loopback bind a Host naming anything but loopback (DNS rebinding) is 421 on every path.
import * as net from "node:net"
import { PassThrough } from "node:stream"
import { Context, Effect, Exit, Layer, Scope } from "effect"
import type { HttpServerRequest } from "effect/http"
import { HttpServerResponse } from "effect/http"
import { afterEach, describe, expect, it } from "vitest"
import * as AdminLive from "../../src/layers/admin/Admin.ts"
import { ADMIN_BODY_LIMIT, ADMIN_BODY_TIMEOUT_MS, readBody, withBody } from "../../src/layers/admin/body.ts"
import * as ConfigLayer from "../../src/layers/config/Config.ts"
import { engineFor } from "../../src/layers/engine/backends/index.ts"
import { AdminServer } from "../../src/services/admin/Admin.ts"
import { hostAllowedOnLoopback, misdirectedReason } from "../../src/services/admin/HostHeader.ts"
import { Config } from "../../src/services/config/Config.ts"
import { EngineProcess } from "../../src/services/engine/EngineProcess.ts"
import { Cordon } from "../../src/services/node/Cordon.ts"
import { Drain } from "../../src/services/node/Drain.ts"
import * as CordonTest from "../../src/testing/Cordon.ts"
import * as MetricsTest from "../../src/testing/Metrics.ts"
import * as NodeStatusLayer from "../../src/testing/NodeStatus.ts"
import * as NvmlTest from "../../src/testing/Nvml.ts"

const fakeEngine = Layer.effect(
  EngineProcess,
  Effect.map(Config, (config) => ({
    plan: engineFor(config.engine.kind).render(config),
    state: Effect.succeed({ _tag: "Ready", since: 0, run: 0 } as const),
    changes: Effect.never as never,
    awaitReady: Effect.void,
    restarts: Effect.succeed(0),
    exits: Effect.succeed([]),
    pid: Effect.succeed(4321),
    restart: () => Effect.succeed("restarting" as const),
    stop: Effect.void
  }))
)

let scope: Scope.Closeable | undefined
afterEach(async () => {
  if (scope) await Effect.runPromise(Scope.close(scope, Exit.void))
  scope = undefined
})

const start = async (agent: Record<string, unknown> = { listen_admin: "127.0.0.1:0" }) => {
  const config = ConfigLayer.layerFromObject({ models: { m: { hf_repo: "org/m" } }, agent })
  const deps = Layer.mergeAll(
    MetricsTest.layerTest,
    NodeStatusLayer.layerTest({ nodeId: "node-a" }),
    Drain.layer,
    NvmlTest.layerFixed([]),
    CordonTest.layerMemory,
    fakeEngine
  ).pipe(Layer.provideMerge(config))
  scope = await Effect.runPromise(Scope.make())
  const ctx = await Effect.runPromise(Layer.buildWithScope(AdminLive.layer().pipe(Layer.provideMerge(deps)), scope))
  const cordoned = () =>
    Effect.runPromise(
      Effect.provideContext(
        Effect.flatMap(Cordon, (c) => c.cordoned),
        ctx
      )
    )
  return { url: Context.get(ctx, AdminServer).url, port: Context.get(ctx, AdminServer).port, cordoned }
}

/** Rejects when `p` takes longer than `ms`. */
const within = <A>(what: string, ms: number, p: Promise<A>): Promise<A> => {
  let timer: NodeJS.Timeout | undefined
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} took longer than ${ms} ms`)), ms)
  })
  return Promise.race([p, late]).finally(() => clearTimeout(timer))
}

/** A raw client: writes `head`, then what the test writes; `answer` is what came back once the server closed. */
const raw = async (port: number, head: string) => {
  const socket = net.connect(port, "127.0.0.1")
  await new Promise<void>((resolve, reject) => {
    socket.once("connect", () => resolve())
    socket.once("error", reject)
  })
  socket.on("error", () => undefined)
  let received = ""
  socket.on("data", (d: Buffer) => {
    received += d.toString("latin1")
  })
  const answer = new Promise<string>((resolve) => socket.once("close", () => resolve(received)))
  socket.write(head)
  return { socket, answer }
}

describe("admin request bodies", () => {
  it("a Content-Length over the limit is 413 at once, nothing read, and nothing cordoned", async () => {
    const { port, cordoned } = await start()
    // 1 GiB announced, none sent: only an answer that reads nothing comes back before the body would
    const { answer } = await raw(port, "POST /cordon HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1073741824\r\n\r\n")
    const text = await within("the 413", 5000, answer)
    expect(text).toMatch(/^HTTP\/1\.1 413 /)
    expect(text.toLowerCase()).toContain("connection: close")
    expect(text).toContain(`request body over ${ADMIN_BODY_LIMIT} bytes`)
    expect(await cordoned()).toBe(false)
  })

  it("a chunked body growing past the limit is cut: 413, the connection closed while the client still sends", async () => {
    const { port, cordoned } = await start()
    const { socket, answer } = await raw(
      port,
      "POST /cordon HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"
    )
    // an endless body: 4 KiB chunks until the server closes the connection
    const chunk = `1000\r\n${"x".repeat(4096)}\r\n`
    let sent = 0
    const pump = () => {
      while (!socket.destroyed && socket.write(chunk)) sent += 4096
      if (!socket.destroyed) socket.once("drain", pump)
    }
    socket.once("close", () => socket.removeAllListeners("drain"))
    pump()
    const text = await within("the cut", 10_000, answer)
    expect(text).toMatch(/^HTTP\/1\.1 413 /)
    expect(sent).toBeLessThan(64 * 1024 * 1024)
    expect(await cordoned()).toBe(false)
  })

  it("a body within the limit is read as before", async () => {
    const { url, cordoned } = await start()
    const res = await fetch(`${url}/cordon`, { method: "POST", body: JSON.stringify({ reason: "r".repeat(256) }) })
    expect(res.status).toBe(202)
    expect(await cordoned()).toBe(true)
  })

  it("a read that fails is 400 and the route's handler never runs", async () => {
    const source = new PassThrough()
    const request = { headers: {}, source } as unknown as HttpServerRequest.HttpServerRequest
    let ran = false
    const answered = Effect.runPromise(
      withBody(() =>
        Effect.sync(() => {
          ran = true
          return HttpServerResponse.text("done")
        })
      )(request)
    )
    source.write("{")
    source.destroy(new Error("aborted"))
    const res = await answered
    expect(res.status).toBe(400)
    // closed: what is left of a body cut short is not read on
    expect(res.headers.connection).toBe("close")
    expect(ran).toBe(false)
  })

  it("a body that does not arrive whole in time (a Content-Length never filled) fails the read, not held for minutes", async () => {
    const source = new PassThrough()
    const request = { headers: { "content-length": "10" }, source } as unknown as HttpServerRequest.HttpServerRequest
    source.write("{")
    const failed = await Effect.runPromise(Effect.flip(readBody(request, ADMIN_BODY_LIMIT, 50)))
    expect(failed).toMatchObject({ _tag: "BodyReadFailed", reason: "the body did not arrive whole within 50 ms" })
    source.destroy()
  })
})

describe("admin request bodies: the README's bounds (a body is read up to 16 KiB, whole within 10 s)", () => {
  /** `readBody` of `bytes` bytes, announced by `headers` (none: chunked). */
  const bodyOf = (headers: Record<string, string>, bytes: number) => {
    const source = new PassThrough()
    const request = { headers, source } as unknown as HttpServerRequest.HttpServerRequest
    const read = Effect.runPromiseExit(readBody(request))
    source.end(Buffer.alloc(bytes, 0x61))
    return read
  }

  it("a body of exactly 16 KiB is read, announced or chunked; one byte more is refused", async () => {
    expect(ADMIN_BODY_LIMIT).toBe(16 * 1024)
    for (const headers of [{ "content-length": String(ADMIN_BODY_LIMIT) }, {}]) {
      const exact = await bodyOf(headers, ADMIN_BODY_LIMIT)
      expect(Exit.isSuccess(exact) && exact.value.length, JSON.stringify(headers)).toBe(ADMIN_BODY_LIMIT)
    }
    for (const headers of [{ "content-length": String(ADMIN_BODY_LIMIT + 1) }, {}]) {
      expect(Exit.isFailure(await bodyOf(headers, ADMIN_BODY_LIMIT + 1)), JSON.stringify(headers)).toBe(true)
    }
  })

  it("the body's deadline is 10 s", () => {
    expect(ADMIN_BODY_TIMEOUT_MS).toBe(10_000)
  })
})

describe("admin Host check (DNS rebinding)", () => {
  const withHost = (port: number, path: string, host: string) =>
    within(
      `GET ${path} Host ${host}`,
      5000,
      raw(port, `GET ${path} HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`).then((c) => c.answer)
    )

  it("on loopback, a Host naming anything but loopback is 421 on every path; loopback names pass with any port", async () => {
    const { port } = await start()
    for (const path of ["/status", "/metrics", "/healthz", "/nope"]) {
      const text = await withHost(port, path, `rebind.example:${port}`)
      expect(text).toMatch(/^HTTP\/1\.1 421 /)
      // the body every admin refusal has: JSON, its `error` the reason
      expect(text).toMatch(/\r\ncontent-type: application\/json\r\n/i)
      expect(JSON.parse(text.slice(text.indexOf("\r\n\r\n") + 4))).toEqual({
        error: misdirectedReason(`rebind.example:${port}`)
      })
    }
    for (const host of ["127.0.0.1", `127.0.0.1:${port}`, "localhost:1", "LOCALHOST.", "127.3.2.1:80", "[::1]:9091"]) {
      expect(await withHost(port, "/status", host)).toMatch(/^HTTP\/1\.1 200 /)
    }
    const post = await raw(
      port,
      "POST /cordon HTTP/1.1\r\nHost: 10.0.0.5:9091\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    expect(await post.answer).toMatch(/^HTTP\/1\.1 421 /)
  })

  it("off loopback (a token then required) any Host is served, as a kubelet probe or a scrape sends it", async () => {
    const { port } = await start({ listen_admin: "0.0.0.0:0", admin_token: "s3cret" })
    expect(await withHost(port, "/healthz", `10.1.2.3:${port}`)).toMatch(/^HTTP\/1\.1 200 /)
    expect(await withHost(port, "/metrics", "node-7.cluster.local")).toMatch(/^HTTP\/1\.1 200 /)
  })

  it("pure rule", () => {
    for (const ok of [
      undefined,
      "localhost",
      "localhost:9091",
      "127.0.0.1:1",
      "127.1",
      "[::1]",
      "[::ffff:127.0.0.1]:9"
    ])
      expect(hostAllowedOnLoopback(ok)).toBe(true)
    for (const bad of ["evil.example", "evil.example:9091", "10.0.0.1", "[::2]", "evil@127.0.0.1", "127.0.0.1/x", ""])
      expect(hostAllowedOnLoopback(bad)).toBe(false)
  })
})
