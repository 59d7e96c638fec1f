// Traces over OTLP: with [agent].otlp_endpoint set, each Generate is one span, a child of the caller's
// traceparent, exported over OTLP/HTTP to a collector (a loopback HTTP server here); the engine request
// carries that span as its parent. Without it, the caller's traceparent goes to the engine unchanged.
// The standard OTEL_* environment decides too (endpoint alone exports, service name, disabled), and the
// built agent's own polling (admin probes and scrapes, the engine load scrape) makes no spans.
import * as http from "node:http"
import type { AddressInfo } from "node:net"
import { Effect, Layer, ManagedRuntime } from "effect"
import { createChannel, createClient, Metadata } from "nice-grpc"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { AgentDefinition } from "../../src/gen/cgn/agent/v1/agent.ts"
import { decodeConfigObject } from "../../src/layers/config/Config.ts"
import { layerWith as grpcLayerWith } from "../../src/layers/grpc/GrpcServer.ts"
import * as Tracing from "../../src/layers/observability/Tracing.ts"
import { State } from "../../src/services/engine/EngineState.ts"
import { GrpcServer } from "../../src/services/grpc/GrpcServer.ts"
import { DEFAULT_SERVICE_NAME, type Env, otlpTraceSettings } from "../../src/services/observability/OtelSettings.ts"
import { parseTraceparent } from "../../src/services/observability/TraceContext.ts"
import { EngineClientRecorder, TestLayers, textChunk } from "../../src/testing/index.ts"
import { killAllAgents, simAgentConfig, startAgent } from "../support/agent.ts"

interface OtlpSpan {
  /** The resource's service.name (added by the collector below). */
  service?: string | undefined
  readonly name: string
  readonly traceId: string
  readonly spanId: string
  readonly parentSpanId?: string
  readonly attributes: ReadonlyArray<{ readonly key: string; readonly value: { readonly stringValue?: string } }>
}

const exported: OtlpSpan[] = []
let collector: http.Server
let collectorUrl = ""

beforeAll(async () => {
  collector = http.createServer((req, res) => {
    const body: Buffer[] = []
    req.on("data", (c: Buffer) => body.push(c))
    req.on("end", () => {
      if (req.url === "/v1/traces") {
        const doc = JSON.parse(Buffer.concat(body).toString("utf8")) as {
          resourceSpans: Array<{ resource: Pick<OtlpSpan, "attributes">; scopeSpans: Array<{ spans: OtlpSpan[] }> }>
        }
        for (const rs of doc.resourceSpans) {
          const service = rs.resource.attributes.find((a) => a.key === "service.name")?.value.stringValue
          for (const ss of rs.scopeSpans) for (const span of ss.spans) exported.push({ ...span, service })
        }
      }
      res.writeHead(200, { "content-type": "application/json" }).end("{}")
    })
  })
  await new Promise<void>((resolve) => collector.listen(0, "127.0.0.1", resolve))
  collectorUrl = `http://127.0.0.1:${(collector.address() as AddressInfo).port}`
})
afterAll(() => new Promise<void>((resolve) => collector.close(() => resolve())))

const agentWith = (agent: Record<string, unknown>, env: Env = {}) => {
  const raw = { agent: { node_id: "tr-1", ...agent }, models: { m: { hf_repo: "org/m" } } }
  const decoded = decodeConfigObject(raw, undefined)
  if (decoded._tag === "Failure") throw decoded.failure
  return ManagedRuntime.make(
    grpcLayerWith({ address: "127.0.0.1:0", shutdownGraceMs: 500 }).pipe(
      Layer.provideMerge(
        Layer.mergeAll(
          TestLayers.Config(raw),
          TestLayers.EngineClient({ chunks: [textChunk("traced", "stop")] }),
          TestLayers.EngineProcess({ initial: State.Ready({ since: Date.now(), run: 0 }) }),
          TestLayers.NodeStatus({ state: "ready" })
        )
      ),
      Layer.provideMerge(Tracing.layer(decoded.success, env))
    )
  )
}

const generateWith = async (rt: ReturnType<typeof agentWith>, traceparent: string) => {
  const server = await rt.runPromise(GrpcServer)
  const channel = createChannel(server.address)
  const client = createClient(AgentDefinition, channel)
  for await (const _ of client.generate(
    { requestId: "req-t", prompt: "hi" },
    { metadata: Metadata({ traceparent }) }
  )) {
    // drain the stream
  }
  channel.close()
  const requests = await rt.runPromise(Effect.flatMap(EngineClientRecorder, (r) => r.requests))
  return requests.at(-1)?.options?.traceparent
}

const caller = { traceId: "0af7651916cd43dd8448eb211c80319c", spanId: "b7ad6b7169203331" }
const callerHeader = `00-${caller.traceId}-${caller.spanId}-01`

describe("tracing", () => {
  it("exports one span per Generate, child of the caller's traceparent, and the engine gets that span", async () => {
    const rt = agentWith({ otlp_endpoint: collectorUrl })
    let sent: string | undefined
    try {
      sent = await generateWith(rt, callerHeader)
    } finally {
      await rt.dispose() // flushes the batch processor
    }
    const span = exported.find((s) => s.name === "cgn.agent.Generate")
    expect(span, JSON.stringify(exported)).toBeDefined()
    expect(span!.traceId).toBe(caller.traceId)
    expect(span!.parentSpanId).toBe(caller.spanId)
    expect(span!.attributes).toContainEqual({ key: "cgn.request_id", value: { stringValue: "req-t" } })
    // The engine's parent is the agent's span: same trace, the exported span's id.
    expect(parseTraceparent(sent)).toEqual({ traceId: caller.traceId, spanId: span!.spanId, sampled: true })
  })

  it("without an OTLP endpoint the caller's traceparent reaches the engine unchanged", async () => {
    const rt = agentWith({})
    try {
      expect(await generateWith(rt, callerHeader)).toBe(callerHeader)
    } finally {
      await rt.dispose()
    }
  })
})

describe("tracing from the OTEL_* environment", () => {
  it("OTEL_EXPORTER_OTLP_ENDPOINT alone exports, as OTEL_SERVICE_NAME", async () => {
    const rt = agentWith({}, { OTEL_EXPORTER_OTLP_ENDPOINT: `${collectorUrl}/`, OTEL_SERVICE_NAME: "svc-env" })
    let sent: string | undefined
    try {
      sent = await generateWith(rt, callerHeader)
    } finally {
      await rt.dispose()
    }
    const span = exported.find((s) => s.name === "cgn.agent.Generate" && s.service === "svc-env")
    expect(span, JSON.stringify(exported)).toBeDefined()
    expect(parseTraceparent(sent)?.spanId).toBe(span!.spanId)
  })

  it("OTEL_SDK_DISABLED=true wins over the configured endpoint: nothing exported, traceparent passed on", async () => {
    const before = exported.length
    const rt = agentWith({ otlp_endpoint: collectorUrl }, { OTEL_SDK_DISABLED: "true", OTEL_SERVICE_NAME: "svc-off" })
    try {
      expect(await generateWith(rt, callerHeader)).toBe(callerHeader)
    } finally {
      await rt.dispose()
    }
    expect(exported.slice(before)).toEqual([])
  })
})

describe("otlpTraceSettings", () => {
  const c = "http://collector:4318"
  it.each([
    ["nothing set", undefined, {}, undefined],
    ["config endpoint", `${c}/`, {}, { url: `${c}/v1/traces`, serviceName: DEFAULT_SERVICE_NAME }],
    ["base endpoint", undefined, { OTEL_EXPORTER_OTLP_ENDPOINT: c }, { url: `${c}/v1/traces` }],
    [
      "traces endpoint as it is, over the base",
      undefined,
      { OTEL_EXPORTER_OTLP_ENDPOINT: "http://x:1", OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: `${c}/custom` },
      { url: `${c}/custom` }
    ],
    [
      "config overrides the environment",
      "http://cfg:4318",
      { OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: `${c}/custom` },
      { url: "http://cfg:4318/v1/traces" }
    ],
    ["blank is unset", undefined, { OTEL_EXPORTER_OTLP_ENDPOINT: " " }, undefined],
    ["OTEL_SDK_DISABLED", c, { OTEL_SDK_DISABLED: "TRUE" }, undefined],
    ["OTEL_SDK_DISABLED=false", c, { OTEL_SDK_DISABLED: "false" }, { url: `${c}/v1/traces` }],
    ["OTEL_TRACES_EXPORTER=none", c, { OTEL_TRACES_EXPORTER: "none" }, undefined],
    [
      "OTEL_SERVICE_NAME",
      c,
      { OTEL_SERVICE_NAME: "a", OTEL_RESOURCE_ATTRIBUTES: "service.name=b" },
      { serviceName: "a" }
    ],
    [
      "service.name in resource attributes",
      c,
      { OTEL_RESOURCE_ATTRIBUTES: "k=v,service.name=my%20agent" },
      { serviceName: "my agent" }
    ],
    [
      "grpc protocol: a warning",
      c,
      { OTEL_EXPORTER_OTLP_PROTOCOL: "grpc" },
      { warnings: [expect.stringContaining("grpc")] }
    ]
  ])("%s", (_name, config, env, expected) => {
    const got = otlpTraceSettings(config, env)
    if (expected === undefined) expect(got).toBeUndefined()
    else expect(got).toMatchObject(expected)
  })
})

describe("the built agent's own polling", () => {
  afterAll(() => killAllAgents())

  it("makes no spans of its polling (admin probes, scrapes, the engine load scrape): the life cycle and Generate only", {
    timeout: 120_000
  }, async () => {
    const { config } = await simAgentConfig({ nodeId: "tr-e2e" })
    const agent = await startAgent({
      config,
      env: { OTEL_EXPORTER_OTLP_ENDPOINT: collectorUrl, OTEL_SERVICE_NAME: "svc-e2e" },
      readyTimeoutMs: 60_000
    })
    for (let i = 0; i < 3; i++) {
      for (const path of ["/healthz", "/readyz", "/metrics"]) await (await fetch(`${agent.adminUrl}${path}`)).text()
    }
    const channel = createChannel(agent.grpcAddress)
    try {
      for await (const _ of createClient(AgentDefinition, channel).generate({ requestId: "e2e", prompt: "hi" })) {
        // drain the stream
      }
    } finally {
      channel.close()
    }
    expect(await agent.stop("SIGTERM", 30_000)).toEqual({ code: 0, signal: null })
    const mine = exported.filter((s) => s.service === "svc-e2e")
    // Exactly the life cycle's steps (each once) and the call: a span per probe, scrape or engine poll would add
    // to the list.
    expect(mine.map((s) => s.name).sort()).toEqual(
      [
        "Agent.drain",
        "EngineProcess.holdStateDir",
        "EngineProcess.make",
        "EngineProcess.reclaim",
        "cgn.agent.Generate"
      ].sort()
    )
  })
})

describe("parseTraceparent", () => {
  it.each([
    [callerHeader, { ...caller, sampled: true }],
    [`00-${caller.traceId}-${caller.spanId}-00`, { ...caller, sampled: false }],
    [`00-${caller.traceId}-${caller.spanId}-03`, { ...caller, sampled: true }],
    [`ff-${caller.traceId}-${caller.spanId}-01`, undefined],
    [`00-${"0".repeat(32)}-${caller.spanId}-01`, undefined],
    [`00-${caller.traceId}-${"0".repeat(16)}-01`, undefined],
    [`00-${caller.traceId.toUpperCase()}-${caller.spanId}-01`, undefined],
    ["garbage", undefined],
    [undefined, undefined]
  ])("%s", (header, expected) => {
    expect(parseTraceparent(header)).toEqual(expected)
  })
})
