/**
 * Watches the OTLP trace exports (layers/observability/Tracing.ts): every export's outcome and every span the batch
 * processor drops on a full queue is counted (services/observability/TraceExports.ts), and a failing collector is
 * logged: a warning when exports start failing, at most one more a minute while they keep failing, an info line
 * when one succeeds again. OpenTelemetry itself reports these through its `diag` logger, silent by default, so a
 * dead collector cost every span without a word.
 *
 * The SDK calls the exporter with plain callbacks; each outcome runs a short synchronous effect with the context the
 * layer was built in (its logger, its Clock), so the time comes from Effect's Clock.
 */
import { createNoopMeter, type Meter, type MeterProvider, type MetricAttributes } from "@opentelemetry/api"
import type { SpanExporter } from "@opentelemetry/sdk-trace-base"
import { Clock, Duration, Effect, Ref } from "effect"
import {
  describeExportError,
  type ExportNotice,
  type ExportOutcome,
  initialState,
  recordExport,
  recordQueueFull,
  type TraceExportView,
  view
} from "../../services/observability/TraceExports.ts"

type ExportResult = Parameters<Parameters<SpanExporter["export"]>[1]>[0]

/** ExportResultCode.SUCCESS (@opentelemetry/core, not a dependency of the agent: the enum's value is its API). */
const SUCCESS = 0

/**
 * The batch processor's self-observability counter (OpenTelemetry semantic conventions, "SDK metrics":
 * otel.sdk.processor.span.processed) and the `error.type` it carries for a span dropped on a full queue.
 */
const PROCESSED = "otel.sdk.processor.span.processed"
const QUEUE_FULL = "queue_full"

export interface TraceExportMonitor {
  /** Wraps the OTLP exporter: counts and logs each export's outcome, then hands it to the processor unchanged. */
  readonly exporter: (inner: SpanExporter) => SpanExporter
  /**
   * For the batch processor's `selfObsMeterProvider` option (experimental in @opentelemetry/sdk-trace 2.x, the one
   * public way it reports the spans it drops on a full queue: BatchSpanProcessorBase `_addToBuffer` adds them to
   * otel.sdk.processor.span.processed with error.type queue_full; github.com/open-telemetry/opentelemetry-js,
   * packages/sdk-trace/src/export/BatchSpanProcessorBase.ts and SpanProcessorMetrics.ts). Every other instrument is
   * a no-op.
   */
  readonly meterProvider: MeterProvider
  readonly status: Effect.Effect<TraceExportView>
}

const logNotice = (notice: ExportNotice, url: string): Effect.Effect<void> => {
  switch (notice._tag) {
    case "Quiet":
      return Effect.void
    case "StartedFailing":
      return Effect.logWarning("tracing: exports to the collector are failing; their spans are dropped", {
        url,
        error: notice.error,
        spans: notice.items
      })
    case "StillFailing":
      return Effect.logWarning("tracing: exports to the collector are still failing", {
        url,
        error: notice.error,
        failing_for: Duration.format(Duration.millis(notice.failingForMs)),
        exports_since_last_warning: notice.exports,
        spans_since_last_warning: notice.items
      })
    case "Recovered":
      return Effect.logInfo("tracing: exports to the collector work again", {
        url,
        failed_for: Duration.format(Duration.millis(notice.failedForMs)),
        failed_exports: notice.exports,
        dropped_spans: notice.items
      })
  }
}

/** A monitor for exports to `url`, logging through the context it is made in. */
export const make = (url: string): Effect.Effect<TraceExportMonitor> =>
  Effect.gen(function* () {
    const state = yield* Ref.make(initialState)
    const run = Effect.runSyncWith(yield* Effect.context<never>())
    const record = (outcome: ExportOutcome) =>
      Effect.gen(function* () {
        const now = yield* Clock.currentTimeMillis
        const notice = yield* Ref.modify(state, (s) => {
          const [next, n] = recordExport(s, outcome, now)
          return [n, next] as const
        })
        yield* logNotice(notice, url)
      })

    const exporter = (inner: SpanExporter): SpanExporter => ({
      export: (spans, resultCallback) =>
        inner.export(spans, (result: ExportResult) => {
          try {
            const failed = result.code !== SUCCESS
            run(record({ items: spans.length, error: failed ? describeExportError(result.error) : undefined }))
          } catch {
            // Only a defect (a logger that throws) lands here. The processor waits on the callback below, and a
            // throw would reach the exporter's promise chain instead: the count is lost, the export is not.
          }
          resultCallback(result)
        }),
      shutdown: () => inner.shutdown(),
      ...(inner.forceFlush === undefined ? {} : { forceFlush: () => inner.forceFlush!() })
    })

    const onQueueFull = (spans: number) => run(Ref.update(state, (s) => recordQueueFull(s, spans)))
    const noop = createNoopMeter()
    const meter: Meter = Object.assign(Object.create(noop) as Meter, {
      createCounter: (name: string) =>
        name === PROCESSED
          ? {
              add: (value: number, attributes?: MetricAttributes) => {
                if (attributes?.["error.type"] === QUEUE_FULL) onQueueFull(value)
              }
            }
          : noop.createCounter(name)
    })

    return {
      exporter,
      meterProvider: { getMeter: () => meter },
      status: Effect.map(Ref.get(state), (s) => view(s, url))
    }
  })
