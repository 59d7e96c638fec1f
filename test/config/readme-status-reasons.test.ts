// README's table of `cgn-reason` values and of engine statuses (between <!-- section:reasons --> and
// <!-- /section:reasons -->, under "Status codes") against the code's tables: GrpcStatus.ts statusTable (and the
// refusals' rejectedFailure, the engine's engineFailure) and EngineStatus.ts engineStatusTable. Every reason the code
// can send has one row and every row names one; each row's gRPC code and `cgn-retryable` are the code's. A new
// ending, or a changed code or retry decision, without its row fails here.
import * as fs from "node:fs"
import * as path from "node:path"
import { describe, expect, it } from "vitest"
import { EngineError } from "../../src/services/engine/EngineClient.ts"
import {
  type EngineStatusKey,
  EXPLICIT_STATUSES,
  engineStatusTable,
  noStatusTable
} from "../../src/services/grpc/EngineStatus.ts"
import { GenerateRejected, RejectReasons } from "../../src/services/grpc/Generate.ts"
import {
  engineFailure,
  type GenerateError,
  type GrpcFailure,
  rejectedFailure,
  statusName,
  statusTable
} from "../../src/services/grpc/GrpcStatus.ts"

const README = fs.readFileSync(path.join(import.meta.dirname, "..", "..", "README.md"), "utf8")
const START = "<!-- section:reasons -->"
const END = "<!-- /section:reasons -->"
const section = README.slice(README.indexOf(START), README.indexOf(END))

/** What `cgn-retryable` reads for a row's retry decision (README: "if nothing went out" is true only then). */
const IF_NOTHING = "if nothing went out"
const retryCell = (retryElsewhere: boolean | undefined): string => (retryElsewhere === true ? IF_NOTHING : "`false`")

/** The table cells of one row. */
const cells = (line: string): Array<string> =>
  line
    .slice(1, -1)
    .split("|")
    .map((c) => c.trim())

/** A code cell's code: its first backquoted word (`UNAVAILABLE` (Health `Watch` only) -> UNAVAILABLE). */
const codeOf = (cell: string): string | undefined => /^`([A-Z_]+)`/.exec(cell)?.[1]

interface Expected {
  readonly code: string
  readonly retry: string
}

const expected = (f: GrpcFailure): Expected => ({ code: statusName(f.code), retry: retryCell(f.retryElsewhere) })

/** Every `cgn-reason` the code sends, with its code and retry decision, from the tables themselves. */
const codeReasons = (): Map<string, Expected> => {
  const out = new Map<string, Expected>()
  const add = (f: GrpcFailure): void => {
    out.set(f.trailers["cgn-reason"]!, expected(f))
  }
  for (const reason of RejectReasons) add(rejectedFailure(new GenerateRejected({ reason, message: "m" })))
  // Every other agent and transport row reads only the error's message (EngineRunEnded: its engine and `by` too,
  // both optional here); the engine's rows are below.
  for (const [tag, row] of Object.entries(statusTable)) {
    if (tag === "GenerateRejected" || tag === "EngineError") continue
    add((row as (e: GenerateError) => GrpcFailure)({ _tag: tag, message: "m" } as unknown as GenerateError))
  }
  // An engine failure with no status to go by: its reason's row (Local is the agent's `agent_resources`).
  for (const reason of Object.keys(noStatusTable) as Array<keyof typeof noStatusTable>)
    add(engineFailure(new EngineError({ reason, message: "m" })))
  add(engineFailure(new EngineError({ reason: "Http", status: 500, message: "m", fault: "output" })))
  return out
}

const reasonRows = section
  .split("\n")
  .filter((l) => /^\| `[a-z_]+` \|/.test(l))
  .map((l) => {
    const [reason, code, retry] = cells(l) as [string, string, string]
    return { reason: reason.replaceAll("`", ""), code, retry }
  })

/** The engine-status rows: `400, 422`, `other 5xx`, `any other`. */
const statusRows = section
  .split("\n")
  .filter((l) => /^\| (\d{3}(, \d{3})*|other 5xx|any other) \|/.test(l))
  .map((l) => {
    const [statuses, code, retry] = cells(l) as [string, string, string]
    const keys: Array<EngineStatusKey> =
      statuses === "other 5xx"
        ? ["5xx"]
        : statuses === "any other"
          ? ["other"]
          : (statuses.split(", ").map(Number) as Array<EngineStatusKey>)
    return { statuses, keys, code, retry }
  })

/** Reasons whose code and retry depend on the engine's status: their cells point at the status table. */
const BY_STATUS: Record<string, keyof typeof noStatusTable> = { engine_http: "Http", engine_stream: "Stream" }

describe("README cgn-reason table", () => {
  it("has rows to compare", () => {
    expect(reasonRows.length).toBeGreaterThan(20)
    expect(statusRows.length).toBeGreaterThan(5)
  })

  it("has one row per reason the code sends, and none it does not", () => {
    const names = reasonRows.map((r) => r.reason)
    expect(new Set(names).size).toBe(names.length)
    expect([...names].sort()).toEqual([...codeReasons().keys()].sort())
  })

  it("gives each reason the code's gRPC code and cgn-retryable", () => {
    const code = codeReasons()
    for (const row of reasonRows) {
      const want = code.get(row.reason)!
      const byStatus = BY_STATUS[row.reason]
      if (byStatus !== undefined) {
        // by the status table, and without a status as the reason's own row decides
        expect(row.code, row.reason).toMatch(/^by `cgn-engine-status` \(below\)/)
        expect(row.retry, row.reason).toMatch(/^by `cgn-engine-status` \(below\)/)
        if (byStatus === "Stream") {
          expect(row.code, row.reason).toContain(`\`${want.code}\` without one`)
          expect(row.retry, row.reason).toContain(`${want.retry} without one`)
        }
        continue
      }
      expect({ reason: row.reason, code: codeOf(row.code), retry: row.retry }).toEqual({
        reason: row.reason,
        code: want.code,
        retry: want.retry
      })
    }
  })
})

describe("README engine status table", () => {
  it("covers every row of engineStatusTable once", () => {
    const keys = statusRows.flatMap((r) => r.keys)
    expect(new Set(keys).size).toBe(keys.length)
    expect(keys.map(String).sort()).toEqual([...EXPLICIT_STATUSES.map(String), "5xx", "other"].sort())
  })

  it("gives each status the code's gRPC code and cgn-retryable", () => {
    for (const row of statusRows)
      for (const key of row.keys) {
        const d = engineStatusTable[key]
        expect({ status: key, code: codeOf(row.code), retry: row.retry }).toEqual({
          status: key,
          code: statusName(d.code),
          retry: retryCell(d.retryElsewhere)
        })
      }
  })
})
