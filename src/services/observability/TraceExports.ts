/**
 * What became of the spans the agent tried to export over OTLP: the counts behind `cgn_agent_trace_spans_total`
 * and the `tracing` section of /status, and when to tell the operator that the collector is failing. Pure: the
 * time is an argument (layers/observability/TraceExportMonitor.ts feeds it from Effect's Clock), so the warning's
 * rhythm is tested with explicit times.
 *
 * The rhythm: one warning when exports start failing, at most one more per FAILING_REPEAT while they keep failing
 * (with the count since the last one), one info line when an export succeeds again. A dead collector costs the
 * log a line a minute, not one per batch (every 5 s by default, OTEL_BSP_SCHEDULE_DELAY).
 */
import { Context, Duration, type Effect } from "effect"

/** The least time between two warnings of one failing spell. */
export const FAILING_REPEAT = Duration.minutes(1)
const REPEAT_MS = Duration.toMillis(FAILING_REPEAT)

/** Exports failing since `since`, the last one with `error`; the `*SinceWarning` counts reset at each warning. */
export interface FailingSpell {
  readonly since: number
  readonly lastWarningAt: number
  readonly error: string
  readonly exports: number
  readonly items: number
  readonly exportsSinceWarning: number
  readonly itemsSinceWarning: number
}

export interface TraceExportState {
  /** Spans the collector took. */
  readonly exported: number
  /** Spans in exports that failed (after the exporter's own retries): dropped. */
  readonly failed: number
  /** Spans the batch processor dropped because its queue was full (OTEL_BSP_MAX_QUEUE_SIZE, 2048 by default). */
  readonly queueFull: number
  readonly failing: FailingSpell | undefined
}

export const initialState: TraceExportState = { exported: 0, failed: 0, queueFull: 0, failing: undefined }

/** One export's result: `error` set when it failed. */
export interface ExportOutcome {
  /** What the export carried: spans here; the KV queue's overflow log (layers/kv/overflowLog.ts) counts batches. */
  readonly items: number
  readonly error?: string | undefined
}

/** What to log after an export. */
export type ExportNotice =
  | { readonly _tag: "Quiet" }
  | { readonly _tag: "StartedFailing"; readonly error: string; readonly items: number }
  | {
      readonly _tag: "StillFailing"
      readonly error: string
      /** Since the previous warning. */
      readonly exports: number
      readonly items: number
      readonly failingForMs: number
    }
  | { readonly _tag: "Recovered"; readonly exports: number; readonly items: number; readonly failedForMs: number }

const quiet: ExportNotice = { _tag: "Quiet" }

/** The state after one export at `now` (ms), and what to log about it. */
export const recordExport = (
  state: TraceExportState,
  outcome: ExportOutcome,
  now: number
): readonly [TraceExportState, ExportNotice] => {
  const spell = state.failing
  if (outcome.error === undefined) {
    const next = { ...state, exported: state.exported + outcome.items, failing: undefined }
    if (spell === undefined) return [next, quiet]
    return [
      next,
      { _tag: "Recovered", exports: spell.exports, items: spell.items, failedForMs: Math.max(0, now - spell.since) }
    ]
  }
  const failed = state.failed + outcome.items
  if (spell === undefined) {
    const started: FailingSpell = {
      since: now,
      lastWarningAt: now,
      error: outcome.error,
      exports: 1,
      items: outcome.items,
      exportsSinceWarning: 0,
      itemsSinceWarning: 0
    }
    return [
      { ...state, failed, failing: started },
      { _tag: "StartedFailing", error: outcome.error, items: outcome.items }
    ]
  }
  const counted: FailingSpell = {
    ...spell,
    error: outcome.error,
    exports: spell.exports + 1,
    items: spell.items + outcome.items,
    exportsSinceWarning: spell.exportsSinceWarning + 1,
    itemsSinceWarning: spell.itemsSinceWarning + outcome.items
  }
  if (now - spell.lastWarningAt < REPEAT_MS) return [{ ...state, failed, failing: counted }, quiet]
  return [
    { ...state, failed, failing: { ...counted, lastWarningAt: now, exportsSinceWarning: 0, itemsSinceWarning: 0 } },
    {
      _tag: "StillFailing",
      error: outcome.error,
      exports: counted.exportsSinceWarning,
      items: counted.itemsSinceWarning,
      failingForMs: now - spell.since
    }
  ]
}
/** The state after the batch processor dropped `spans` on a full queue (no log line: the failing exports say why). */
export const recordQueueFull = (state: TraceExportState, spans: number): TraceExportState => ({
  ...state,
  queueFull: state.queueFull + spans
})

/** The most of a collector's error answer a log line carries. */
const MAX_BODY = 200

/**
 * One line for an export's error: an HTTP status the collector answered (the OTLP exporter's OTLPExporterError
 * carries it as a numeric `code`, its body as `data`), a connection error's code (ECONNREFUSED, ...), else the
 * message. The exporter retries a 429, 502, 503 or 504 and a refused or reset connection within its timeout
 * (OTEL_EXPORTER_OTLP_TIMEOUT, 10 s); a connection's error survives the retries, a retried status does not: "Export
 * failed with retryable status" (github.com/open-telemetry/opentelemetry-js,
 * experimental/packages/otlp-exporter-base/src/otlp-export-delegate.ts and src/transport/http-transport-utils.ts).
 */
export const describeExportError = (error: unknown): string => {
  if (!(error instanceof Error)) return error === undefined ? "export failed" : String(error)
  const { code, data } = error as { readonly code?: unknown; readonly data?: unknown }
  const message = error.message.trim()
  if (typeof code === "number") {
    // The collector's answer often says why (a 400's validation error, a 413's limit): its start, on one line.
    const body = typeof data === "string" ? data.replace(/\s+/g, " ").trim().slice(0, MAX_BODY) : ""
    return `HTTP ${code}${message === "" ? "" : ` ${message}`}${body === "" ? "" : `: ${body}`}`
  }
  if (typeof code === "string" && !message.includes(code)) return `${code}: ${message}`
  return message === "" ? error.name : message
}

/** What became of a span: the `outcome` label of `cgn_agent_trace_spans_total`. */
export type TraceSpanOutcome = "exported" | "failed" | "queue_full"

/** The `tracing` section of /status. */
export interface TraceExportView {
  readonly url: string
  /** Spans since the start, by outcome (see TraceExportState). */
  readonly spans: Readonly<Record<TraceSpanOutcome, number>>
  readonly failing: boolean
  /** While failing: when it started (ISO 8601) and the last export's error. */
  readonly failing_since?: string
  readonly last_error?: string
}

export const view = (state: TraceExportState, url: string): TraceExportView => ({
  url,
  spans: { exported: state.exported, failed: state.failed, queue_full: state.queueFull },
  failing: state.failing !== undefined,
  ...(state.failing === undefined
    ? {}
    : { failing_since: new Date(state.failing.since).toISOString(), last_error: state.failing.error })
})

/**
 * The export counts, while traces are exported (layers/observability/Tracing.ts provides it); undefined when they
 * are not, and then there is nothing to count, show or mirror.
 */
export const TraceExportStatus = Context.Reference<Effect.Effect<TraceExportView> | undefined>(
  "cgn-agent/TraceExportStatus",
  { defaultValue: () => undefined }
)
