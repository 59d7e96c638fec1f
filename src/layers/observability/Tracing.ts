/**
 * Tracing: spans exported over OTLP/HTTP (JSON) through @effect/opentelemetry's Node SDK, configured by the
 * standard OTEL_* environment with `[agent].otlp_endpoint` as an override (services/observability/OtelSettings.ts); with
 * no endpoint, nothing (Effect's no-op tracer). Spans are flushed when the layer's scope closes, at the
 * end of shutdown, within TRACE_FLUSH_TIMEOUT: a collector that accepts and never answers (black-holed) costs
 * the shutdown that long, and a warning says the buffered spans were dropped. The agent's own polling (probes,
 * scrapes, the admin endpoints) makes no spans: see layers/admin/Admin.ts and layers/node/NodeStatus.ts.
 * A failing collector is counted and logged (TraceExportMonitor.ts): spans exported, failed and dropped on the batch
 * processor's full queue are `cgn_agent_trace_spans_total{outcome}` and the `tracing` section of /status
 * (TraceExportStatus, which main mirrors).
 *
 * Why not @opentelemetry/sdk-node's NodeSDK, which reads the same environment: it pulls in every exporter
 * (gRPC, protobuf, Zipkin, Prometheus) and the auto-instrumentation loader, many megabytes the agent never
 * loads; the few variables that decide whether and where to export, the export timeout and the batch settings
 * (OTEL_BSP_*) are read here (services/observability/OtelSettings.ts), and the OTLP exporter reads its own (headers,
 * compression, TLS files). The SDK is imported only when traces are exported:
 * an agent without an endpoint never loads it (several MiB of heap).
 */
import type { MeterProvider } from "@opentelemetry/api"
import type { BufferConfig, SpanProcessor } from "@opentelemetry/sdk-trace-base"
import { Duration, Effect, Layer, Option } from "effect"
import type { AgentConfig } from "../../services/config/Config.ts"
import { type Env, otlpTraceSettings } from "../../services/observability/OtelSettings.ts"
import { TracesExported } from "../../services/observability/TraceContext.ts"
import { TraceExportStatus } from "../../services/observability/TraceExports.ts"
import { VERSION } from "../../version.ts"

/** How long the spans still buffered at shutdown may take to reach the collector; past it they are dropped. */
export const TRACE_FLUSH_TIMEOUT = Duration.seconds(3)
/**
 * The SDK's own release after that flush (provider.forceFlush, then shutdown): nothing is left to send when the
 * flush worked, and when it did not, a second wait on the same collector would only delay the exit.
 */
export const SDK_SHUTDOWN_TIMEOUT = Duration.millis(250)

/**
 * Flushes `processor` when the scope closes, on Effect's Clock: @effect/opentelemetry's provider release bounds
 * its flush too (NodeSdk.layerTracerProvider, `shutdownTimeout`, 3 s by default) but says nothing when the bound
 * cuts it, so the drain's spans vanished without a word. The OTLP exporter's own timeout (10 s by default,
 * OTEL_EXPORTER_OTLP_TIMEOUT) is no bound here: the environment can raise it.
 */
const flushOnRelease = (processor: SpanProcessor, url: string): Layer.Layer<never> =>
  Layer.effectDiscard(
    Effect.addFinalizer(() =>
      Effect.tryPromise(() => processor.forceFlush()).pipe(
        Effect.timeoutOption(TRACE_FLUSH_TIMEOUT),
        Effect.flatMap(
          Option.match({
            onNone: () =>
              Effect.logWarning(
                `tracing: the collector did not take the last spans within ${Duration.format(TRACE_FLUSH_TIMEOUT)}; they are dropped`,
                { url }
              ),
            onSome: () => Effect.void
          })
        ),
        Effect.catch((e) =>
          Effect.logWarning("tracing: the last spans could not be exported; they are dropped", {
            url,
            error: String(e.cause ?? e)
          })
        )
      )
    )
  )

/** The OTLP trace exporter the environment and config ask for, or no layer at all. */
export const layer = (config: AgentConfig, env: Env = process.env): Layer.Layer<never> => {
  const settings = otlpTraceSettings(config.agent.otlp_endpoint, env)
  if (settings === undefined) return Layer.empty
  const sdk = Layer.unwrap(
    Effect.gen(function* () {
      const [NodeSdk, { OTLPTraceExporter }, { BatchSpanProcessor }, TraceExportMonitor] = yield* Effect.promise(() =>
        Promise.all([
          import("@effect/opentelemetry/NodeSdk"),
          import("@opentelemetry/exporter-trace-otlp-http"),
          import("@opentelemetry/sdk-trace-base"),
          import("./TraceExportMonitor.ts")
        ])
      )
      const monitor = yield* TraceExportMonitor.make(settings.shown)
      const exporter = new OTLPTraceExporter({
        url: settings.url,
        ...(settings.timeoutMillis === undefined ? {} : { timeoutMillis: settings.timeoutMillis })
      })
      // selfObsMeterProvider is a BatchSpanProcessorOptions field of @opentelemetry/sdk-trace, which sdk-trace-base's
      // BatchSpanProcessor passes on with the rest of its config but does not declare (github.com/open-telemetry/
      // opentelemetry-js, packages/opentelemetry-sdk-trace-base/src/BatchSpanProcessor-shim.ts). The queue_full test
      // in test/observability/tracing.test.ts fails if an upgrade stops passing it.
      const buffer: BufferConfig & { readonly selfObsMeterProvider: MeterProvider } = {
        ...settings.batch,
        selfObsMeterProvider: monitor.meterProvider
      }
      const processor = new BatchSpanProcessor(monitor.exporter(exporter), buffer)
      const provider = NodeSdk.layer(() => ({
        resource: {
          serviceName: settings.serviceName,
          serviceVersion: VERSION,
          attributes: { "service.instance.id": config.agent.node_id, "cgn.cluster": config.cluster.name }
        },
        spanProcessor: processor,
        shutdownTimeout: SDK_SHUTDOWN_TIMEOUT
      }))
      // Built after the provider, so its flush runs before the provider's release.
      return flushOnRelease(processor, settings.shown).pipe(
        Layer.provideMerge(provider),
        Layer.merge(Layer.succeed(TraceExportStatus)(monitor.status))
      )
    })
  )
  const warn = Layer.effectDiscard(
    Effect.forEach(settings.warnings, (w) => Effect.logWarning(`tracing: ${w}`), { discard: true })
  )
  return Layer.mergeAll(sdk, warn, Layer.succeed(TracesExported)(true))
}
