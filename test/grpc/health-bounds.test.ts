// grpc.health.v1's bounds (layers/grpc/Health.ts, services/grpc/HealthRequests.ts, layers/grpc/HealthListener.ts):
// no caller input grows the agent's memory through health. Unknown names are answered without being stored (Check
// NOT_FOUND, Watch SERVICE_UNKNOWN on a stream that stays open), a name over 1 KiB is refused INVALID_ARGUMENT, Watch
// streams are capped per server, and the health-only listener takes small requests and 100 streams a connection.
import * as http2 from "node:http2"
import * as v8 from "node:v8"
import { runInNewContext } from "node:vm"
import { Effect, Exit, Scope } from "effect"
import { HealthImplementation } from "grpc-health-check"
import { type ClientError, createChannel, createClient, Status } from "nice-grpc"
import { HealthDefinition } from "nice-grpc-server-health"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { HealthCheckResponse_ServingStatus as S } from "../../src/gen/grpc/health/v1/health.ts"
import { addHealth, PublishedHealth } from "../../src/layers/grpc/Health.ts"
import * as HealthListener from "../../src/layers/grpc/HealthListener.ts"
import { Http2GrpcServer } from "../../src/layers/grpc/http2/Server.ts"
import { AGENT_SERVICE } from "../../src/services/grpc/GrpcServer.ts"
import { lookupName, MAX_SERVICE_NAME_BYTES } from "../../src/services/grpc/HealthRequests.ts"

/** A server with Health alone, from `health`, as the main server adds it (its 4 MiB-class message limit). */
const serve = async (health: HealthImplementation, maxWatches?: number, maxWatchesPerPeer?: number) => {
  const server = new Http2GrpcServer({ maxReceiveMessageLength: 4 * 1024 * 1024 })
  addHealth(server, health, {
    ...(maxWatches === undefined ? {} : { maxWatches }),
    ...(maxWatchesPerPeer === undefined ? {} : { maxWatchesPerPeer })
  })
  const port = await server.listen("127.0.0.1", 0)
  return { server, address: `127.0.0.1:${port}` }
}

/** The error a call failed with (or "ok"). */
const failure = (p: Promise<unknown>): Promise<ClientError | "ok"> =>
  p.then(
    () => "ok" as const,
    (e: unknown) => e as ClientError
  )

const varint = (n: number): Buffer => {
  const out: Array<number> = []
  for (; n > 127; n >>>= 7) out.push((n & 127) | 128)
  out.push(n)
  return Buffer.from(out)
}

/** One gRPC frame of HealthCheckRequest { service: name } (field 1, length-delimited). */
const requestFrame = (name: string): Buffer => {
  const body = Buffer.from(name)
  const message = Buffer.concat([Buffer.from([0x0a]), varint(body.length), body])
  const frame = Buffer.alloc(5 + message.length)
  frame.writeUInt32BE(message.length, 1)
  message.copy(frame, 5)
  return frame
}

/** A Watch of `name` on `session` as a raw HTTP/2 stream, its one request sent. */
const openWatch = (session: http2.ClientHttp2Session, name = ""): http2.ClientHttp2Stream => {
  const stream = session.request({
    ":method": "POST",
    ":path": "/grpc.health.v1.Health/Watch",
    "content-type": "application/grpc",
    te: "trailers"
  })
  stream.on("error", () => {})
  stream.end(requestFrame(name))
  return stream
}

/**
 * Opens `names.length` Watch streams on one raw HTTP/2 connection, waits until each has its response headers (the
 * handler ran), then resets them all (RST_STREAM CANCEL, a caller's cancel) and closes the connection.
 */
const watchAndCancel = async (address: string, names: ReadonlyArray<string>): Promise<void> => {
  const session = http2.connect(`http://${address}`)
  session.on("error", () => {})
  const streams = names.map((name) => openWatch(session, name))
  await Promise.all(streams.map((s) => new Promise((ok) => s.once("response", ok))))
  await Promise.all(
    streams.map(
      (s) =>
        new Promise<void>((ok) => {
          s.once("close", () => ok())
          s.close(http2.constants.NGHTTP2_CANCEL)
        })
    )
  )
  await new Promise<void>((ok) => session.close(() => ok()))
}

describe("service names (lookupName)", () => {
  it('knows "" and the Agent service, and bounds a name in UTF-8 bytes', () => {
    expect(lookupName("")).toBe("known")
    expect(lookupName(AGENT_SERVICE)).toBe("known")
    expect(lookupName("grpc.health.v1.Health")).toBe("unknown")
    expect(lookupName("x".repeat(MAX_SERVICE_NAME_BYTES))).toBe("unknown")
    expect(lookupName("x".repeat(MAX_SERVICE_NAME_BYTES + 1))).toBe("too_long")
    // 2 bytes each: 512 fit, 513 (fewer UTF-16 units than the bound) do not
    expect(lookupName("é".repeat(MAX_SERVICE_NAME_BYTES / 2))).toBe("unknown")
    expect(lookupName("é".repeat(MAX_SERVICE_NAME_BYTES / 2 + 1))).toBe("too_long")
  })
})

describe("Health on the agent's server", () => {
  const health = new HealthImplementation()
  health.setStatus("", "SERVING")
  health.setStatus(AGENT_SERVICE, "SERVING")
  let server: Http2GrpcServer
  let address = ""
  beforeAll(async () => {
    ;({ server, address } = await serve(health, undefined, 100_000)) // one test address opens 500 Watches at once
  })
  afterAll(() => server.destroy())

  it("Check of an unknown name: NOT_FOUND, without quoting the name back", async () => {
    const channel = createChannel(address)
    try {
      const client = createClient(HealthDefinition, channel)
      expect((await client.check({ service: "" })).status).toBe(S.SERVING)
      const err = await failure(client.check({ service: "no.such.Service" }))
      expect(err).toMatchObject({ code: Status.NOT_FOUND })
      expect((err as ClientError).details).not.toContain("no.such.Service")
    } finally {
      channel.close()
    }
  })

  it("a name over 1 KiB: INVALID_ARGUMENT on Check and on Watch, before any lookup", async () => {
    const channel = createChannel(address)
    try {
      const client = createClient(HealthDefinition, channel)
      const long = "x".repeat(MAX_SERVICE_NAME_BYTES + 1)
      const checked = await failure(client.check({ service: long }))
      expect(checked).toMatchObject({ code: Status.INVALID_ARGUMENT })
      expect((checked as ClientError).details).toBe("service name is 1025 bytes; at most 1024")
      const watched = await failure(client.watch({ service: long })[Symbol.asyncIterator]().next())
      expect(watched).toMatchObject({ code: Status.INVALID_ARGUMENT })
      // at the bound: answered as unknown
      await expect(client.check({ service: "x".repeat(MAX_SERVICE_NAME_BYTES) })).rejects.toMatchObject({
        code: Status.NOT_FOUND
      })
    } finally {
      channel.close()
    }
  })

  it("Watch of an unknown name: SERVICE_UNKNOWN, then the stream stays open until the caller ends it", async () => {
    const channel = createChannel(address)
    const abort = new AbortController()
    try {
      const client = createClient(HealthDefinition, channel)
      const iter = client.watch({ service: "no.such.Service" }, { signal: abort.signal })[Symbol.asyncIterator]()
      expect((await iter.next()).value?.status).toBe(S.SERVICE_UNKNOWN)
      let settled = false
      const next = iter.next().finally(() => {
        settled = true
      })
      // Round trips on the same connection: the server answered them, the Watch still has nothing more.
      for (let i = 0; i < 3; i++) await client.check({ service: "" })
      expect(settled).toBe(false)
      expect(server.open.calls).toBe(1)
      abort.abort()
      await expect(next).rejects.toThrow()
    } finally {
      channel.close()
    }
  })

  it("Watch of a known name not yet given a status: SERVICE_UNKNOWN, then its status once given", async () => {
    const later = new HealthImplementation()
    later.setStatus("", "SERVING")
    const own = await serve(later)
    const channel = createChannel(own.address)
    const abort = new AbortController()
    try {
      const iter = createClient(HealthDefinition, channel)
        .watch({ service: AGENT_SERVICE }, { signal: abort.signal })
        [Symbol.asyncIterator]()
      expect((await iter.next()).value?.status).toBe(S.SERVICE_UNKNOWN)
      later.setStatus(AGENT_SERVICE, "NOT_SERVING")
      expect((await iter.next()).value?.status).toBe(S.NOT_SERVING)
    } finally {
      abort.abort()
      channel.close()
      own.server.destroy()
    }
  })

  it("closed Watch streams of distinct names leave nothing behind (heap after a forced GC)", async () => {
    // --expose-gc for this worker, then the gc function from a fresh context (v8.setFlagsFromString: Node docs).
    v8.setFlagsFromString("--expose-gc")
    const gc = runInNewContext("gc") as () => void
    const heapUsed = (): number => {
      for (let i = 0; i < 3; i++) gc()
      return process.memoryUsage().heapUsed
    }
    let id = 0
    // Names of 1000 bytes, each distinct, all unknown: the dependency alone kept every one (~12.6 MB per 10k).
    const names = (k: number) =>
      Array.from({ length: k }, () => {
        const prefix = `svc-${id++}-`
        return prefix + "z".repeat(1000 - prefix.length)
      })
    await watchAndCancel(address, names(100)) // warm-up: the code paths, the first connection
    const before = heapUsed()
    for (let round = 0; round < 16; round++) await watchAndCancel(address, names(500))
    const retained = heapUsed() - before
    // 8000 names of 1000 bytes: ~10 MB when each name stays; measured ~0.4 MB (code, caches) when none does.
    expect(retained, `heap retained: ${retained} bytes`).toBeLessThan(3_000_000)
  })
})

describe("PublishedHealth on Watch", () => {
  it("sends each watcher a status once: a change of one name's status sends nothing to the other's watchers", async () => {
    const published = new PublishedHealth()
    published.publish("SERVING", "SERVING")
    const { server, address } = await serve(published.implementation)
    const channel = createChannel(address)
    const abort = new AbortController()
    try {
      const client = createClient(HealthDefinition, channel)
      const watches = ["", AGENT_SERVICE].map((service) =>
        client.watch({ service }, { signal: abort.signal })[Symbol.asyncIterator]()
      )
      const seen: Array<Array<S>> = [[], []]
      const next = async (i: number) => {
        const r = await watches[i]?.next()
        if (r !== undefined && !r.done) seen[i]?.push(r.value.status)
      }
      await Promise.all([next(0), next(1)])
      published.publish("SERVING", "NOT_SERVING") // cordoned: only the Agent service changes
      published.publish("NOT_SERVING", "NOT_SERVING") // engine down: only "" changes
      published.publish("SERVING", "SERVING") // both change: the last message of each, after any repeat
      for (const i of [0, 1]) while (seen[i]?.at(-1) !== S.SERVING || (seen[i]?.length ?? 0) < 3) await next(i)
      expect(seen).toEqual([
        [S.SERVING, S.NOT_SERVING, S.SERVING],
        [S.SERVING, S.NOT_SERVING, S.SERVING]
      ])
    } finally {
      abort.abort()
      channel.close()
      server.destroy()
    }
  })
})

describe("the Watch cap", () => {
  it("refuses a Watch past maxWatches with RESOURCE_EXHAUSTED, takes one again once a Watch ends", async () => {
    const health = new HealthImplementation()
    health.setStatus("", "SERVING")
    const { server, address } = await serve(health, 3)
    const channel = createChannel(address)
    const aborts = [new AbortController(), new AbortController(), new AbortController()]
    try {
      const client = createClient(HealthDefinition, channel)
      const watch = (signal?: AbortSignal) =>
        client
          .watch({ service: "" }, signal === undefined ? {} : { signal })
          [Symbol.asyncIterator]()
          .next()
      for (const a of aborts) expect((await watch(a.signal)).value?.status).toBe(S.SERVING)
      expect(await failure(watch())).toMatchObject({ code: Status.RESOURCE_EXHAUSTED })
      expect((await client.check({ service: "" })).status).toBe(S.SERVING)
      aborts[0]?.abort()
      // The cancel reaches the server in its own time: polled, bounded.
      let admitted = false
      for (let i = 0; i < 200 && !admitted; i++) {
        const abort = new AbortController()
        const r = await failure(watch(abort.signal))
        admitted = r === "ok"
        abort.abort()
        if (!admitted) expect(r).toMatchObject({ code: Status.RESOURCE_EXHAUSTED })
      }
      expect(admitted).toBe(true)
    } finally {
      for (const a of aborts) a.abort()
      channel.close()
      server.destroy()
    }
  })
})

describe("the health-only listener's bounds", () => {
  const health = new HealthImplementation()
  health.setStatus("", "SERVING")
  let address = ""
  let scope: Scope.Closeable
  beforeAll(async () => {
    scope = Effect.runSync(Scope.make())
    address = (await Effect.runPromise(Scope.provide(HealthListener.serve("127.0.0.1:0", health), scope))).address
  })
  afterAll(() => Effect.runPromise(Scope.close(scope, Exit.void)))

  it("takes requests of at most 2 KiB: a larger one ends RESOURCE_EXHAUSTED unread", async () => {
    const channel = createChannel(address)
    try {
      const client = createClient(HealthDefinition, channel)
      expect(
        // 2 KiB written out, not read from the constant: a larger bound would still pass a test relative to it
        await failure(client.check({ service: "x".repeat(2 * 1024) }))
      ).toMatchObject({ code: Status.RESOURCE_EXHAUSTED })
      expect(
        await failure(
          client
            .watch({ service: "x".repeat(1_000_000) })
            [Symbol.asyncIterator]()
            .next()
        )
      ).toMatchObject({ code: Status.RESOURCE_EXHAUSTED })
      // a name at the bound fits
      expect(await failure(client.check({ service: "x".repeat(MAX_SERVICE_NAME_BYTES) }))).toMatchObject({
        code: Status.NOT_FOUND
      })
    } finally {
      channel.close()
    }
  })

  it("lets a connection hold 100 streams at once (SETTINGS_MAX_CONCURRENT_STREAMS)", async () => {
    const session = http2.connect(`http://${address}`)
    session.on("error", () => {})
    try {
      await new Promise((ok) => session.once("remoteSettings", ok))
      expect(session.remoteSettings.maxConcurrentStreams).toBe(HealthListener.MAX_HEALTH_STREAMS)
      expect(HealthListener.MAX_HEALTH_STREAMS).toBe(100)
    } finally {
      session.destroy()
    }
  })
})

describe("the Watch cap per client address", () => {
  /** A Watch of "" from `from` on its own connection: its first answer's grpc-status (undefined: a message came). */
  const watchFrom = (port: number, from: string) =>
    new Promise<{ status: string | undefined; session: http2.ClientHttp2Session }>((resolve) => {
      const session = http2.connect(`http://127.0.0.1:${port}`, { localAddress: from } as http2.ClientSessionOptions)
      session.on("error", () => {})
      const req = openWatch(session)
      req.on("data", () => resolve({ status: undefined, session }))
      req.on("response", (h) => {
        const status = h["grpc-status"] as string | undefined
        if (status !== undefined) resolve({ status, session })
      })
    })

  /** `n` Watches of "" from `from` on one connection: each one's first answer (undefined: a message came, else grpc-status and grpc-message). */
  const watchesFrom = (port: number, from: string, n: number) => {
    const session = http2.connect(`http://127.0.0.1:${port}`, { localAddress: from } as http2.ClientSessionOptions)
    session.on("error", () => {})
    const answers = Array.from(
      { length: n },
      () =>
        new Promise<string | undefined>((resolve) => {
          const req = openWatch(session)
          req.on("data", () => resolve(undefined))
          req.on("response", (h) => {
            if (h["grpc-status"] !== undefined)
              resolve(`${h["grpc-status"]} ${decodeURIComponent(String(h["grpc-message"]))}`)
          })
        })
    )
    return { session, answers: Promise.all(answers) }
  }

  it("at the defaults, as the agent serves Health: 256 Watches from one address, 4,096 on the server; one more of either is refused", async () => {
    const health = new HealthImplementation()
    health.setStatus("", "SERVING")
    const { server, address } = await serve(health)
    const port = Number(address.split(":")[1])
    const sessions: Array<http2.ClientHttp2Session> = []
    const open = (from: string, n: number) => {
      const w = watchesFrom(port, from, n)
      sessions.push(w.session)
      return w.answers
    }
    const exhausted = String(Status.RESOURCE_EXHAUSTED)
    try {
      const first = await open("127.0.0.40", 257)
      expect(first.filter((a) => a === undefined)).toHaveLength(256)
      expect(first.filter((a) => a !== undefined)).toEqual([
        `${exhausted} 256 Watch streams from this client address are open on this server already; use Check, or Watch again later`
      ])
      // 15 more addresses' 256 each: 4,096 in all, every one open
      const rest = await Promise.all(Array.from({ length: 15 }, (_, i) => open(`127.0.0.${41 + i}`, 256)))
      expect(rest.flat().every((a) => a === undefined)).toBe(true)
      expect(await open("127.0.0.56", 1)).toEqual([
        `${exhausted} 4096 Watch streams are open on this server already; use Check, or Watch again later`
      ])
    } finally {
      for (const s of sessions) s.destroy()
      server.destroy()
    }
  })

  it("gives an address's places back as its Watches end: 256 opened and closed, then one more is served", async () => {
    const health = new HealthImplementation()
    health.setStatus("", "SERVING")
    const { server, address } = await serve(health)
    const port = Number(address.split(":")[1])
    const sessions: Array<http2.ClientHttp2Session> = []
    try {
      const all = watchesFrom(port, "127.0.0.57", 256)
      sessions.push(all.session)
      expect((await all.answers).every((a) => a === undefined)).toBe(true)
      all.session.destroy()
      // The cancels reach the server in their own time: polled, bounded.
      let answer: string | undefined = "none yet"
      for (let i = 0; i < 200 && answer !== undefined; i++) {
        const one = watchesFrom(port, "127.0.0.57", 1)
        sessions.push(one.session)
        answer = (await one.answers)[0]
        one.session.destroy()
      }
      expect(answer).toBeUndefined()
    } finally {
      for (const s of sessions) s.destroy()
      server.destroy()
    }
  })

  it("refuses one address's Watch past maxWatchesPerPeer; another address still watches", async () => {
    const health = new HealthImplementation()
    health.setStatus("", "SERVING")
    const { server, address } = await serve(health, 10, 2)
    const port = Number(address.split(":")[1])
    const sessions: Array<http2.ClientHttp2Session> = []
    try {
      const open = async (from: string) => {
        const r = await watchFrom(port, from)
        sessions.push(r.session)
        return r.status
      }
      expect([await open("127.0.0.21"), await open("127.0.0.21")]).toEqual([undefined, undefined])
      expect(await open("127.0.0.21")).toBe(String(Status.RESOURCE_EXHAUSTED))
      expect(await open("127.0.0.22")).toBeUndefined()
    } finally {
      for (const s of sessions) s.destroy()
      server.destroy()
    }
  })
})
