// The OTLP export outcomes' state machine (services/observability/TraceExports.ts) with explicit times: one warning
// when exports start failing, at most one more per minute while they keep failing (with the count since the last
// one), one info line when an export succeeds again; the counts behind cgn_agent_trace_spans_total and /status.
import { describe, expect, it } from "vitest"
import {
  describeExportError,
  type ExportNotice,
  type ExportOutcome,
  initialState,
  recordExport,
  recordQueueFull,
  type TraceExportState,
  view
} from "../../src/services/observability/TraceExports.ts"

const T0 = Date.UTC(2026, 0, 1)
const s = 1000

/** Runs the outcomes at their times from the start state; the notices, in order. */
const run = (steps: ReadonlyArray<readonly [number, ExportOutcome]>, from: TraceExportState = initialState) => {
  let state = from
  const notices: Array<ExportNotice> = []
  for (const [at, outcome] of steps) {
    const [next, notice] = recordExport(state, outcome, T0 + at)
    state = next
    notices.push(notice)
  }
  return { state, notices }
}

const ok = (spans: number): ExportOutcome => ({ items: spans })
const fail = (spans: number, error = "HTTP 503"): ExportOutcome => ({ items: spans, error })

describe("trace export outcomes", () => {
  it("warns once when exports start failing, not at each failed export within the minute", () => {
    const { notices } = run([
      [0, ok(3)],
      [5 * s, fail(2)],
      [10 * s, fail(4)],
      [15 * s, fail(1)],
      [64 * s, fail(1)]
    ])
    expect(notices.map((n) => n._tag)).toEqual(["Quiet", "StartedFailing", "Quiet", "Quiet", "Quiet"])
    expect(notices[1]).toEqual({ _tag: "StartedFailing", error: "HTTP 503", items: 2 })
  })

  it("repeats the warning at most once a minute while exports keep failing, with the count since the last one", () => {
    const { notices } = run([
      [0, fail(2, "ECONNREFUSED")],
      [20 * s, fail(3, "ECONNREFUSED")],
      [40 * s, fail(5, "HTTP 500")],
      [60 * s, fail(7, "HTTP 500")],
      [61 * s, fail(1, "HTTP 500")],
      [119 * s, fail(1, "HTTP 500")],
      [120 * s, fail(2, "HTTP 502")]
    ])
    expect(notices.map((n) => n._tag)).toEqual([
      "StartedFailing",
      "Quiet",
      "Quiet",
      "StillFailing",
      "Quiet",
      "Quiet",
      "StillFailing"
    ])
    // Since the first warning (at 0): the exports at 20, 40 and 60 s; the last error.
    expect(notices[3]).toEqual({ _tag: "StillFailing", error: "HTTP 500", exports: 3, items: 15, failingForMs: 60 * s })
    // Since the second (at 60 s): 61, 119 and 120 s.
    expect(notices[6]).toEqual({ _tag: "StillFailing", error: "HTTP 502", exports: 3, items: 4, failingForMs: 120 * s })
  })

  it("says once that exports work again, with the spell's failed exports, spans and length; then a new spell warns", () => {
    const { state, notices } = run([
      [0, fail(2)],
      [30 * s, fail(3)],
      [45 * s, ok(4)],
      [50 * s, ok(1)],
      [55 * s, fail(6, "HTTP 400 Bad Request")]
    ])
    expect(notices).toEqual([
      { _tag: "StartedFailing", error: "HTTP 503", items: 2 },
      { _tag: "Quiet" },
      { _tag: "Recovered", exports: 2, items: 5, failedForMs: 45 * s },
      { _tag: "Quiet" },
      { _tag: "StartedFailing", error: "HTTP 400 Bad Request", items: 6 }
    ])
    expect(state).toMatchObject({ exported: 5, failed: 11, queueFull: 0 })
  })

  it("counts spans by outcome, and /status shows a failing spell while it lasts", () => {
    const failing = recordQueueFull(
      run([
        [0, ok(10)],
        [5 * s, fail(3, "ECONNREFUSED: connect")]
      ]).state,
      7
    )
    expect(view(failing, "http://c:4318/v1/traces")).toEqual({
      url: "http://c:4318/v1/traces",
      spans: { exported: 10, failed: 3, queue_full: 7 },
      failing: true,
      failing_since: new Date(T0 + 5 * s).toISOString(),
      last_error: "ECONNREFUSED: connect"
    })
    const recovered = run([[9 * s, ok(1)]], failing).state
    expect(view(recovered, "u")).toEqual({
      url: "u",
      spans: { exported: 11, failed: 3, queue_full: 7 },
      failing: false
    })
  })
})

describe("describeExportError", () => {
  // The OTLP exporter's error (otlp-exporter-base types.ts): an HTTP status as `code`, the answer's body as `data`.
  class OTLPExporterError extends Error {
    readonly code: number | undefined
    readonly data: string | undefined
    constructor(message: string, code?: number, data?: string) {
      super(message)
      this.code = code
      this.data = data
    }
  }
  it.each([
    [
      "an HTTP status and the collector's answer",
      new OTLPExporterError("Not Found", 404, "no\n route"),
      "HTTP 404 Not Found: no route"
    ],
    [
      "an HTTP status without a body",
      new OTLPExporterError("Internal Server Error", 500),
      "HTTP 500 Internal Server Error"
    ],
    [
      "a connection error, its code already in the message",
      Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:9"), { code: "ECONNREFUSED" }),
      "connect ECONNREFUSED 127.0.0.1:9"
    ],
    [
      "a connection error's code",
      Object.assign(new Error("socket hang up"), { code: "ECONNRESET" }),
      "ECONNRESET: socket hang up"
    ],
    [
      "a retried status (the exporter drops it)",
      new OTLPExporterError("Export failed with retryable status"),
      "Export failed with retryable status"
    ],
    ["no error", undefined, "export failed"]
  ])("%s", (_name, error, expected) => {
    expect(describeExportError(error)).toBe(expected)
  })

  it("keeps at most 200 characters of the collector's answer", () => {
    expect(describeExportError(new OTLPExporterError("Bad Request", 400, "x".repeat(500)))).toBe(
      `HTTP 400 Bad Request: ${"x".repeat(200)}`
    )
  })
})
