/**
 * Tracing: spans exported over OTLP/HTTP (JSON) through @effect/opentelemetry's Node SDK, configured by the
 * standard OTEL_* environment with `[agent].otlp_endpoint` as an override (services/observability/OtelSettings.ts); with
 * no endpoint, nothing (Effect's no-op tracer). Spans are flushed when the layer's scope closes, at the
 * end of shutdown. The agent's own polling (probes, scrapes, the admin endpoints) makes no spans: see
 * layers/admin/Admin.ts and layers/node/NodeStatus.ts.
 *
 * Why not @opentelemetry/sdk-node's NodeSDK, which reads the same environment: it pulls in every exporter
 * (gRPC, protobuf, Zipkin, Prometheus) and the auto-instrumentation loader, many megabytes the agent never
 * loads; the few variables that decide whether and where to export are read here, and the OTLP exporter
 * reads its own (headers, timeout, compression, TLS files). The SDK is imported only when traces are exported:
 * an agent without an endpoint never loads it (several MiB of heap).
 */
import { Effect, Layer } from "effect"
import type { AgentConfig } from "../../services/config/Config.ts"
import { type Env, otlpTraceSettings } from "../../services/observability/OtelSettings.ts"
import { TracesExported } from "../../services/observability/TraceContext.ts"
import { VERSION } from "../../version.ts"

/** The OTLP trace exporter the environment and config ask for, or no layer at all. */
export const layer = (config: AgentConfig, env: Env = process.env): Layer.Layer<never> => {
  const settings = otlpTraceSettings(config.agent.otlp_endpoint, env)
  if (settings === undefined) return Layer.empty
  const sdk = Layer.unwrap(
    Effect.promise(async () => {
      const [NodeSdk, { OTLPTraceExporter }, { BatchSpanProcessor }] = await Promise.all([
        import("@effect/opentelemetry/NodeSdk"),
        import("@opentelemetry/exporter-trace-otlp-http"),
        import("@opentelemetry/sdk-trace-base")
      ])
      return NodeSdk.layer(() => ({
        resource: {
          serviceName: settings.serviceName,
          serviceVersion: VERSION,
          attributes: { "service.instance.id": config.agent.node_id, "cgn.cluster": config.cluster.name }
        },
        spanProcessor: new BatchSpanProcessor(new OTLPTraceExporter({ url: settings.url }))
      }))
    })
  )
  const warn = Layer.effectDiscard(
    Effect.forEach(settings.warnings, (w) => Effect.logWarning(`tracing: ${w}`), { discard: true })
  )
  return Layer.mergeAll(sdk, warn, Layer.succeed(TracesExported)(true))
}
