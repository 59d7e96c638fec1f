// [agent].listen_health (layers/grpc/HealthListener.ts): a plaintext listener that serves grpc.health.v1 alone, with
// the main server's status (Check exact at once, Watch within its period), NOT_FOUND for unknown services and
// nothing else (Agent is UNIMPLEMENTED there). Also reflection under v1alpha on the main server.
import * as http2 from "node:http2"
import { Cause, Effect, Exit, Layer, Logger, ManagedRuntime, Scope } from "effect"
import { ClientError, createChannel, createClient, Status } from "nice-grpc"
import { HealthDefinition } from "nice-grpc-server-health"
import { ServerReflectionService } from "nice-grpc-server-reflection"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { AgentDefinition } from "../../src/gen/cgn/agent/v1/agent.ts"
import { HealthCheckResponse_ServingStatus as S } from "../../src/gen/grpc/health/v1/health.ts"
import { layerWith as grpcLayerWith } from "../../src/layers/grpc/GrpcServer.ts"
import * as HealthListener from "../../src/layers/grpc/HealthListener.ts"
import { State } from "../../src/services/engine/EngineState.ts"
import { AGENT_SERVICE, GrpcServer } from "../../src/services/grpc/GrpcServer.ts"
import { Metrics } from "../../src/services/observability/Metrics.ts"
import { EngineProcessControl } from "../../src/testing/EngineProcess.ts"
import { layerTest as metricsLayerTest } from "../../src/testing/Metrics.ts"
import { agentDeps } from "../support/agentDeps.ts"
import { pollUntil } from "../support/poll.ts"

/** One Health Check of "" on a new HTTP/2 connection to `address`, closed after: its grpc-status (none when refused). */
const checkOnce = (address: string) =>
  new Promise<string | undefined>((resolve) => {
    const session = http2.connect(`http://${address}`)
    session.on("error", () => {})
    session.on("close", () => resolve(undefined))
    const req = session.request({
      ":method": "POST",
      ":path": "/grpc.health.v1.Health/Check",
      "content-type": "application/grpc",
      te: "trailers"
    })
    req.on("error", () => {})
    req.on("trailers", (t) => {
      resolve(t["grpc-status"] as string)
      session.close()
    })
    req.resume()
    // An empty HealthCheckRequest: the message prefix alone (flag 0, length 0).
    req.end(Buffer.alloc(5))
  })

/** An empty ServerReflectionRequest, made through the published service definition (its message classes live in
 * the package's files, not its API). */
const reflectionRequest = () => ServerReflectionService.serverReflectionInfo.requestDeserialize(Buffer.alloc(0))

// A v1alpha client: the same messages as v1 under the older name (grpc-proto grpc/reflection/v1alpha/reflection.proto).
const ReflectionV1Alpha = {
  serverReflectionInfo: {
    ...ServerReflectionService.serverReflectionInfo,
    path: "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
  }
} as const

const { deps } = agentDeps("http://127.0.0.1:9")
const rt = ManagedRuntime.make(
  grpcLayerWith({ address: "127.0.0.1:0", shutdownGraceMs: 500 }).pipe(Layer.provideMerge(deps))
)
let healthAddress = ""
let mainAddress = ""

beforeAll(async () => {
  mainAddress = (await rt.runPromise(GrpcServer)).address
})
afterAll(async () => {
  await rt.dispose()
})

describe("the health-only listener", () => {
  // A scope that outlives each test: the listener is built once for the file.
  let close: (() => Promise<void>) | undefined
  beforeAll(async () => {
    const server = await rt.runPromise(GrpcServer)
    const scope = await rt.runPromise(Scope.make())
    const listener = await rt.runPromise(Scope.provide(HealthListener.serve("127.0.0.1:0", server.healthState), scope))
    healthAddress = listener.address
    close = () => rt.runPromise(Scope.close(scope, Exit.void))
  })
  afterAll(async () => {
    await close?.()
  })

  it("answers a plaintext Check with the main server's status, at once on every change", async () => {
    const channel = createChannel(healthAddress)
    const health = createClient(HealthDefinition, channel)
    const ctl = await rt.runPromise(EngineProcessControl)
    try {
      expect((await health.check({ service: "" })).status).toBe(S.SERVING)
      expect((await health.check({ service: AGENT_SERVICE })).status).toBe(S.SERVING)
      await rt.runPromise(ctl.set(State.Unhealthy({ reason: "probe failed", since: Date.now(), run: 0 })))
      expect((await health.check({ service: "" })).status).toBe(S.NOT_SERVING)
      await rt.runPromise(ctl.set(State.Ready({ since: Date.now(), run: 0 })))
      expect((await health.check({ service: "" })).status).toBe(S.SERVING)
      await expect(health.check({ service: "no.such.Service" })).rejects.toMatchObject({ code: Status.NOT_FOUND })
    } finally {
      channel.close()
    }
  })

  it("streams changes to Watch", async () => {
    const channel = createChannel(healthAddress)
    const health = createClient(HealthDefinition, channel)
    const ctl = await rt.runPromise(EngineProcessControl)
    const abort = new AbortController()
    try {
      const seen: Array<number> = []
      for await (const r of health.watch({ service: "" }, { signal: abort.signal })) {
        seen.push(r.status)
        if (seen.length === 1)
          await rt.runPromise(ctl.set(State.Unhealthy({ reason: "probe failed", since: Date.now(), run: 0 })))
        else break
      }
      expect(seen).toEqual([S.SERVING, S.NOT_SERVING])
    } finally {
      abort.abort()
      channel.close()
      await rt.runPromise(ctl.set(State.Ready({ since: Date.now(), run: 0 })))
    }
  })

  it("serves nothing but health: Agent is UNIMPLEMENTED there", async () => {
    const channel = createChannel(healthAddress)
    try {
      const err = await createClient(AgentDefinition, channel)
        .listModels({})
        .catch((e: unknown) => e)
      expect(err).toBeInstanceOf(ClientError)
      expect((err as ClientError).code).toBe(Status.UNIMPLEMENTED)
    } finally {
      channel.close()
    }
  })
})

describe("the health-only listener's connection caps", () => {
  it("closes a peer's connection past agent.max_connections_per_peer at accept while its one runs a Watch; in place of an idle one, it is admitted", async () => {
    const server = await rt.runPromise(GrpcServer)
    const scope = await rt.runPromise(Scope.make())
    const channels: Array<ReturnType<typeof createChannel>> = []
    const abort = new AbortController()
    // the listener's guard events, "counted and logged alike" as the main server's (HealthListener.ts, README)
    const warnings: Array<[unknown, Record<string, unknown>]> = []
    const logger = Logger.make(({ logLevel, message }) => {
      const [text, fields] = [message].flat() as [unknown, Record<string, unknown>]
      if (logLevel === "Warn") warnings.push([text, fields])
    })
    try {
      const { listener, metrics } = await rt.runPromise(
        Scope.provide(
          Effect.all({
            listener: HealthListener.serve("127.0.0.1:0", server.healthState, {
              maxConnectionsPerPeer: 1,
              maxConnections: 0
            }),
            metrics: Metrics
          }).pipe(Effect.provide(Layer.merge(metricsLayerTest, Logger.layer([logger])))),
          scope
        )
      )
      // A channel of its own each (grpc-js shares one connection among channels to the same target otherwise).
      const own = { "grpc.use_local_subchannel_pool": 1 }
      const first = createChannel(listener.address, undefined, own)
      channels.push(first)
      // The first connection stays open (the channel keeps it), a Watch on it: the peer's one, busy.
      const watch = createClient(HealthDefinition, first)
        .watch({ service: "" }, { signal: abort.signal })
        [Symbol.asyncIterator]()
      expect((await watch.next()).value?.status).toBe(S.SERVING)
      const second = createChannel(listener.address, undefined, own)
      await expect(createClient(HealthDefinition, second).check({ service: "" })).rejects.toMatchObject({
        code: Status.UNAVAILABLE
      })
      // Closed at once: a refused channel reconnects in the background (grpc-js backs off, 1 s and up), and at a cap
      // of 1 its reconnect could take the place a later step of this test waits for.
      second.close()
      // The first connection is untouched; once its Watch ends it is idle, and a new one takes its place.
      expect((await createClient(HealthDefinition, first).check({ service: "" })).status).toBe(S.SERVING)
      abort.abort()
      await watch.next().catch(() => undefined)
      // A call after the cancel on the same connection: the server has read the cancel when it answers.
      expect((await createClient(HealthDefinition, first).check({ service: "" })).status).toBe(S.SERVING)
      // Refused until the first has been idle a second (services/grpc/ConnectionCaps.ts SETTLED_IDLE_MS).
      // Each try a bare HTTP/2 connection, one Check on it: a grpc-js channel refused reconnects in the background,
      // and at a cap of 1 such a reconnect could take the place this waits for.
      const status = await pollUntil("a third connection admitted", () => checkOnce(listener.address))
      expect(status).toBe("0")
      const refused = (await rt.runPromise(metrics.render)).body
        .split("\n")
        .find((l) => l.startsWith('cgn_agent_grpc_connections_refused_total{reason="peer_limit"}'))
      expect(refused).toEqual(expect.stringMatching(/ [1-9]\d*$/))
      // logged at most once per peer and reason a minute (guardReport.ts), however often it was refused
      expect(warnings.filter(([, f]) => f?.reason === "peer_limit")).toEqual([
        [
          "gRPC connection refused: its peer already holds agent.max_connections_per_peer connections",
          expect.objectContaining({ peer: expect.stringContaining("127.0.0.1"), reason: "peer_limit", limit: 1 })
        ]
      ])
    } finally {
      abort.abort()
      for (const c of channels) c.close()
      await rt.runPromise(Scope.close(scope, Exit.void))
    }
  })
})

describe("binding", () => {
  it("a listener on an address in use fails with GrpcListenError naming the key, the address and the reason", async () => {
    const server = await rt.runPromise(GrpcServer)
    const exit = await rt.runPromiseExit(Effect.scoped(HealthListener.serve(mainAddress, server.healthState)))
    const error = Exit.isFailure(exit) ? Cause.squash(exit.cause) : undefined
    expect(error).toMatchObject({ _tag: "GrpcListenError", address: mainAddress })
    expect((error as Error).message).toBe(
      `agent.listen_health = "${mainAddress}": listen EADDRINUSE: address already in use ${mainAddress}`
    )
  })
})

describe("reflection v1alpha", () => {
  it("lists the services under grpc.reflection.v1alpha too (older clients speak only that)", async () => {
    const channel = createChannel(mainAddress)
    try {
      const client = createClient(ReflectionV1Alpha, channel)
      async function* requests() {
        const list = reflectionRequest()
        list.setListServices("*")
        yield list
      }
      const names: Array<string> = []
      for await (const a of client.serverReflectionInfo(requests()))
        for (const s of a.getListServicesResponse()?.getServiceList() ?? []) names.push(s.getName())
      expect(names).toEqual([AGENT_SERVICE, "grpc.health.v1.Health"])
    } finally {
      channel.close()
    }
  })
})

describe("shutdown", () => {
  it("ends open Watch streams with UNAVAILABLE, so the server closes without waiting out its grace", async () => {
    // A grace far above the test timeout: a Watch left open would hold tryShutdown until it.
    const own = ManagedRuntime.make(
      grpcLayerWith({ address: "127.0.0.1:0", shutdownGraceMs: 600_000 }).pipe(Layer.provideMerge(deps))
    )
    const channel = createChannel((await own.runPromise(GrpcServer)).address)
    try {
      const iter = createClient(HealthDefinition, channel).watch({ service: "" })[Symbol.asyncIterator]()
      expect((await iter.next()).value?.status).toBe(S.SERVING)
      const closed = own.dispose()
      // NOT_SERVING first (a watcher learns before the stream ends), then the status.
      expect((await iter.next()).value?.status).toBe(S.NOT_SERVING)
      const err = await iter.next().catch((e: unknown) => e)
      await closed
      expect(err).toBeInstanceOf(ClientError)
      expect((err as ClientError).code).toBe(Status.UNAVAILABLE)
    } finally {
      channel.close()
    }
  })
})
