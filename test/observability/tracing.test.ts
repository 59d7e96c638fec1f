// Traces over OTLP: with [agent].otlp_endpoint set, each Generate is one span, a child of the caller's
// traceparent, exported over OTLP/HTTP to a collector (a loopback HTTP server here); the engine request
// carries that span as its parent. Without it, the caller's traceparent goes to the engine unchanged.
// The standard OTEL_* environment decides too (endpoint alone exports, service name, disabled), and the
// built agent's own polling (admin probes and scrapes, the engine load scrape) makes no spans.
import * as http from "node:http"
import type { AddressInfo } from "node:net"
import { Effect, Layer, Logger, ManagedRuntime } from "effect"
import { createChannel, createClient, Metadata } from "nice-grpc"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { AgentDefinition } from "../../src/gen/cgn/agent/v1/agent.ts"
import { decodeConfigObject } from "../../src/layers/config/Config.ts"
import { layerWith as grpcLayerWith } from "../../src/layers/grpc/GrpcServer.ts"
import * as MetricsLive from "../../src/layers/observability/Metrics.ts"
import * as Tracing from "../../src/layers/observability/Tracing.ts"
import { State } from "../../src/services/engine/EngineState.ts"
import { GrpcServer } from "../../src/services/grpc/GrpcServer.ts"
import { Metrics } from "../../src/services/observability/Metrics.ts"
import { DEFAULT_SERVICE_NAME, type Env, otlpTraceSettings } from "../../src/services/observability/OtelSettings.ts"
import { parseTraceparent, tracestateToPass } from "../../src/services/observability/TraceContext.ts"
import { TraceExportStatus } from "../../src/services/observability/TraceExports.ts"
import { EngineClientRecorder, TestLayers, textChunk } from "../../src/testing/index.ts"
import * as MetricsTest from "../../src/testing/Metrics.ts"
import { killAllAgents, simAgentConfig, startAgent } from "../support/agent.ts"
import { pollUntil } from "../support/poll.ts"

interface OtlpSpan {
  /** The resource's service.name (added by the collector below). */
  service?: string | undefined
  /** The resource's attributes (added by the collector below). */
  resource?: OtlpSpan["attributes"]
  readonly name: string
  readonly traceId: string
  readonly spanId: string
  readonly parentSpanId?: string
  readonly attributes: ReadonlyArray<{ readonly key: string; readonly value: Readonly<Record<string, unknown>> }>
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
          const name = rs.resource.attributes.find((a) => a.key === "service.name")?.value.stringValue
          const service = typeof name === "string" ? name : undefined
          for (const ss of rs.scopeSpans)
            for (const span of ss.spans) exported.push({ ...span, service, resource: rs.resource.attributes })
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

describe("tracestateToPass (W3C Trace Context: passed on as received)", () => {
  it("passes a list on as it came; drops one that is no header value or is past 512 characters", () => {
    expect(tracestateToPass("congo=t61rcWkgMzE, rojo=00f067aa0ba902b7")).toBe(
      "congo=t61rcWkgMzE, rojo=00f067aa0ba902b7"
    )
    expect(tracestateToPass(undefined)).toBeUndefined()
    expect(tracestateToPass("")).toBeUndefined()
    expect(tracestateToPass("a=b\nc=d")).toBeUndefined()
    expect(tracestateToPass(`a=${"x".repeat(511)}`)).toBeUndefined()
    expect(tracestateToPass(`a=${"x".repeat(510)}`)).toHaveLength(512)
  })
})

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
    // the resource says which node and cluster made it: every agent of a cluster exports under one service.name
    expect(span!.resource).toContainEqual({ key: "service.instance.id", value: { stringValue: "tr-1" } })
    expect(span!.resource).toContainEqual({ key: "cgn.cluster", value: { stringValue: "default" } }) // cluster.name unset
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

/** A collector whose answer the test sets: 200, 503, 400 with a reason, or held (no answer until `release`). */
const controlledCollector = async () => {
  const state = { mode: "ok" as "ok" | "503" | "400" | "hold", requests: 0, held: [] as Array<http.ServerResponse> }
  const answer = (res: http.ServerResponse) => res.writeHead(200, { "content-type": "application/json" }).end("{}")
  const server = http.createServer((req, res) => {
    req.resume()
    req.on("end", () => {
      state.requests++
      if (state.mode === "503") res.writeHead(503).end()
      else if (state.mode === "400") res.writeHead(400).end("resource spans: invalid trace id")
      else if (state.mode === "hold") state.held.push(res)
      else answer(res)
    })
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  return {
    state,
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    release: () => {
      state.mode = "ok"
      for (const res of state.held.splice(0)) answer(res)
    },
    close: () => new Promise<void>((resolve) => server.close(() => resolve()))
  }
}

/** A loopback port nothing listens on: connections to it are refused. */
const refusedUrl = async () => {
  const server = http.createServer()
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  const { port } = server.address() as AddressInfo
  await new Promise<void>((resolve) => server.close(() => resolve()))
  return `http://127.0.0.1:${port}`
}

interface LogLine {
  readonly level: string
  readonly text: string
  readonly fields: Record<string, unknown>
}

/** Tracing to `endpoint` with the test registry mirrored (as main wires it) and the log lines kept. */
const monitored = (endpoint: string, env: Env) => {
  const decoded = decodeConfigObject(
    { agent: { node_id: "tr-2", otlp_endpoint: endpoint }, models: { m: { hf_repo: "org/m" } } },
    undefined
  )
  if (decoded._tag === "Failure") throw decoded.failure
  const logs: Array<LogLine> = []
  const logger = Logger.make(({ logLevel, message }) => {
    const [text, fields] = [message].flat() as [unknown, unknown]
    logs.push({ level: String(logLevel), text: String(text), fields: (fields ?? {}) as Record<string, unknown> })
  })
  const rt = ManagedRuntime.make(
    Layer.effectDiscard(Effect.flatMap(TraceExportStatus, MetricsLive.mirrorTraceExports)).pipe(
      Layer.provideMerge(MetricsTest.layerTest),
      Layer.provideMerge(Tracing.layer(decoded.success, env)),
      Layer.provide(Logger.layer([logger]))
    )
  )
  const status = async () => {
    const get = await rt.runPromise(TraceExportStatus)
    if (get === undefined) throw new Error("no TraceExportStatus while traces are exported")
    return Effect.runPromise(get)
  }
  return {
    rt,
    logs,
    status,
    /** Ends `n` spans at once. */
    spans: (n = 1) =>
      rt.runPromise(
        Effect.forEach(Array.from({ length: n }), () => Effect.withSpan(Effect.void, "probe"), { discard: true })
      ),
    metrics: () => rt.runPromise(Effect.flatMap(Metrics, (m) => m.render)).then((r) => r.body),
    lines: (text: string) => logs.filter((l) => l.text.includes(text))
  }
}

const failing = "tracing: exports to the collector are failing; their spans are dropped"
const recovered = "tracing: exports to the collector work again"
// Exports 10 ms after a span ends, not 5 s, and within 500 ms: no retry fits (the exporter's first waits about 1 s),
// so a failing export fails at once.
const PROMPT: Env = { OTEL_BSP_SCHEDULE_DELAY: "10", OTEL_EXPORTER_OTLP_TRACES_TIMEOUT: "500" }

describe("a failing collector", () => {
  it("answering 503: failed spans counted, one warning for several failed exports; answering again: one info line", async () => {
    const collector = await controlledCollector()
    collector.state.mode = "503"
    const t = monitored(collector.url, PROMPT)
    try {
      for (let i = 1; i <= 3; i++) {
        await t.spans()
        await pollUntil(`failed export ${i}`, async () => (await t.status()).spans.failed >= i)
      }
      expect(collector.state.requests, "the exports reached the collector").toBeGreaterThanOrEqual(3)
      // One warning for the three failed exports, and no other (a repeat comes a minute later at the earliest).
      const warnings = t.logs.filter((l) => l.level === "Warn")
      expect(
        warnings.map((l) => l.text),
        JSON.stringify(t.logs)
      ).toEqual([failing])
      expect(warnings[0]!.fields).toMatchObject({
        url: `${collector.url}/v1/traces`,
        error: "Export failed with retryable status",
        spans: 1
      })
      expect(await t.status()).toMatchObject({ failing: true, last_error: "Export failed with retryable status" })

      collector.state.mode = "ok"
      await t.spans(2)
      await pollUntil("an export taken", async () => (await t.status()).spans.exported >= 2)
      const infos = t.lines(recovered)
      expect(infos).toHaveLength(1)
      expect(infos[0]!.level).toBe("Info")
      expect(infos[0]!.fields).toMatchObject({ url: `${collector.url}/v1/traces`, failed_exports: 3, dropped_spans: 3 })
      expect(t.logs.filter((l) => l.level === "Warn")).toHaveLength(1)
      const page = await t.metrics()
      expect(page).toMatch(/^cgn_agent_trace_spans_total\{outcome="failed"\} 3$/m)
      expect(page).toMatch(/^cgn_agent_trace_spans_total\{outcome="exported"\} 2$/m)
      expect(page).toMatch(/^cgn_agent_trace_spans_total\{outcome="queue_full"\} 0$/m)
      expect(await t.status()).toMatchObject({ failing: false })
    } finally {
      await t.rt.dispose()
      await collector.close()
    }
  })

  it("refusing connections: failed spans counted, one warning naming the connection error", async () => {
    const url = await refusedUrl()
    const t = monitored(url, PROMPT)
    try {
      for (let i = 1; i <= 2; i++) {
        await t.spans()
        await pollUntil(`failed export ${i}`, async () => (await t.status()).spans.failed >= i)
      }
      const warnings = t.logs.filter((l) => l.level === "Warn")
      expect(
        warnings.map((l) => l.text),
        JSON.stringify(t.logs)
      ).toEqual([failing])
      expect(warnings[0]!.fields).toMatchObject({
        url: `${url}/v1/traces`,
        error: expect.stringContaining("ECONNREFUSED")
      })
      expect(await t.metrics()).toMatch(/^cgn_agent_trace_spans_total\{outcome="failed"\} 2$/m)
    } finally {
      await t.rt.dispose()
    }
  })

  it("answering 400: the warning names the status and the collector's reason", async () => {
    const collector = await controlledCollector()
    collector.state.mode = "400"
    const t = monitored(collector.url, PROMPT)
    try {
      await t.spans()
      await pollUntil("a failed export", async () => (await t.status()).spans.failed >= 1)
      expect(t.lines(failing).map((l) => l.fields.error)).toEqual([
        "HTTP 400 Bad Request: resource spans: invalid trace id"
      ])
    } finally {
      await t.rt.dispose()
      await collector.close()
    }
  })

  it("holding an export: the spans the batch processor drops on its full queue are counted as queue_full", async () => {
    const collector = await controlledCollector()
    collector.state.mode = "hold"
    const t = monitored(collector.url, {
      OTEL_BSP_MAX_QUEUE_SIZE: "4",
      OTEL_BSP_MAX_EXPORT_BATCH_SIZE: "2",
      OTEL_BSP_SCHEDULE_DELAY: "60000"
    })
    try {
      // 2 fill a batch and go out (held), 4 fill the queue, 3 are dropped.
      await t.spans(9)
      expect((await t.status()).spans).toEqual({ exported: 0, failed: 0, queue_full: 3 })
      expect(await t.metrics()).toMatch(/^cgn_agent_trace_spans_total\{outcome="queue_full"\} 3$/m)
      await pollUntil("the held export", () => collector.state.held.length > 0)
      collector.release()
      await pollUntil("the queue sent", async () => (await t.status()).spans.exported === 6)
      expect(t.logs.filter((l) => l.level === "Warn")).toEqual([])
    } finally {
      collector.release()
      await t.rt.dispose()
      await collector.close()
    }
  })

  it("without an endpoint: no status and no samples (the family is declared, for the rules that read it)", async () => {
    const decoded = decodeConfigObject({ agent: { node_id: "tr-3" }, models: { m: { hf_repo: "org/m" } } }, undefined)
    if (decoded._tag === "Failure") throw decoded.failure
    const rt = ManagedRuntime.make(
      Layer.effectDiscard(Effect.flatMap(TraceExportStatus, MetricsLive.mirrorTraceExports)).pipe(
        Layer.provideMerge(MetricsTest.layerTest),
        Layer.provideMerge(Tracing.layer(decoded.success, {}))
      )
    )
    try {
      expect(await rt.runPromise(TraceExportStatus)).toBeUndefined()
      const page = (await rt.runPromise(Effect.flatMap(Metrics, (m) => m.render))).body
      expect(page).toContain("# TYPE cgn_agent_trace_spans_total counter")
      expect(page).not.toMatch(/^cgn_agent_trace_spans_total/m)
    } finally {
      await rt.dispose()
    }
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
      "OTEL_TRACES_EXPORTER naming another exporter: a warning",
      c,
      { OTEL_TRACES_EXPORTER: "otlp,zipkin" },
      { url: `${c}/v1/traces`, warnings: [expect.stringContaining("OTEL_TRACES_EXPORTER=zipkin")] }
    ],
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
    ],
    [
      "the path goes before a query; what may be a secret is not shown (a password, a query's values)",
      "https://u:pw@collector:4318/otlp/?token=s3cr3t",
      { OTEL_EXPORTER_OTLP_PROTOCOL: "grpc" },
      {
        url: "https://u:pw@collector:4318/otlp/v1/traces?token=s3cr3t",
        shown: "https://***@collector:4318/otlp/v1/traces?token=***",
        warnings: [expect.not.stringContaining("s3cr3t")]
      }
    ]
  ])("%s", (_name, config, env, expected) => {
    const got = otlpTraceSettings(config, env)
    if (expected === undefined) expect(got).toBeUndefined()
    else expect(got).toMatchObject(expected)
  })

  it("reads the exporter's timeout and the batch processor's settings from the environment handed in", () => {
    const got = otlpTraceSettings(c, {
      OTEL_EXPORTER_OTLP_TIMEOUT: "2000",
      OTEL_EXPORTER_OTLP_TRACES_TIMEOUT: "500",
      OTEL_BSP_MAX_QUEUE_SIZE: "64",
      OTEL_BSP_MAX_EXPORT_BATCH_SIZE: "16",
      OTEL_BSP_SCHEDULE_DELAY: "soon",
      OTEL_BSP_EXPORT_TIMEOUT: "0"
    })
    // A malformed or zero value is left to the SDK, which reads the variable itself.
    expect(got).toMatchObject({ timeoutMillis: 500, batch: { maxQueueSize: 64, maxExportBatchSize: 16 } })
    expect(Object.keys(got!.batch).sort()).toEqual(["maxExportBatchSize", "maxQueueSize"])
    expect(otlpTraceSettings(c, { OTEL_EXPORTER_OTLP_TIMEOUT: "2000" })).toMatchObject({ timeoutMillis: 2000 })
    expect(otlpTraceSettings(c, {})).not.toHaveProperty("timeoutMillis")
  })
})

describe("the built agent's own polling", () => {
  afterAll(() => killAllAgents())

  it("makes no spans of its polling (admin probes, scrapes, the engine load scrape): the life cycle, the engine's start and Generate only; shows the export counts", {
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
    // main mirrors the export counts: a /status section and the series, each outcome from 0 (none exported yet).
    const status = (await (await fetch(`${agent.adminUrl}/status`)).json()) as { readonly tracing?: unknown }
    expect(status.tracing).toEqual({
      url: `${collectorUrl}/v1/traces`,
      spans: { exported: 0, failed: 0, queue_full: 0 },
      failing: false
    })
    expect(await (await fetch(`${agent.adminUrl}/metrics`)).text()).toMatch(
      /^cgn_agent_trace_spans_total\{outcome="failed"\} 0$/m
    )
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
    // Exactly the life cycle's steps (each once: the engine's one run started once) and the call: a span per
    // probe, scrape or engine poll would add to the list.
    expect(mine.map((s) => s.name).sort()).toEqual(
      [
        "Agent.drain",
        "EngineProcess.holdStateDir",
        "EngineProcess.make",
        "EngineProcess.reclaim",
        "cgn.agent.Generate",
        "cgn.agent.engine.start"
      ].sort()
    )
    const start = mine.find((s) => s.name === "cgn.agent.engine.start")
    expect(start?.attributes).toEqual(
      expect.arrayContaining([
        { key: "cgn.engine.run", value: { intValue: 0 } },
        { key: "cgn.engine.kind", value: { stringValue: "vllm" } },
        { key: "cgn.engine.ready", value: { boolValue: true } }
      ])
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
    // version 00 has exactly these four fields (W3C Trace Context §3.2.4); only a later version may add more
    [`${callerHeader}-extra`, undefined],
    [`${callerHeader}0`, undefined],
    ["garbage", undefined],
    [undefined, undefined]
  ])("%s", (header, expected) => {
    expect(parseTraceparent(header)).toEqual(expected)
  })
})
