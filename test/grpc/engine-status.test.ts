// EngineStatus's one table of what an engine failure decides (services/grpc/EngineStatus.ts): each row's gRPC code,
// whether another node may take the call, whether it counts against the node; a status of no row takes its range's;
// GrpcStatus.ts's functions answer from it alone.
import { Status } from "nice-grpc-common"
import { describe, expect, it } from "vitest"
import { EngineError } from "../../src/services/engine/EngineClient.ts"
import {
  type EngineDecisions,
  EXPLICIT_STATUSES,
  engineDecisions,
  engineStatus,
  engineStatusKey,
  engineStatusTable,
  noStatusTable,
  outputFault
} from "../../src/services/grpc/EngineStatus.ts"
import {
  endsUnavailable,
  engineErrorCode,
  engineFailedCall,
  engineFailure,
  httpStatusToGrpc,
  statusName
} from "../../src/services/grpc/GrpcStatus.ts"

/** A row as read: [code's name, retry elsewhere, counts against the node]. */
const read = (d: EngineDecisions) => [statusName(d.code), d.retryElsewhere, d.failsCall] as const

// Written out, not derived: a row whose decision changes fails here (README "Situation | Status", `cgn-retryable`,
// engine.failed_calls_unhealthy).
const expected = {
  400: ["INVALID_ARGUMENT", false, false],
  401: ["INTERNAL", true, true],
  403: ["INTERNAL", true, true],
  404: ["NOT_FOUND", false, false],
  408: ["DEADLINE_EXCEEDED", true, false],
  413: ["RESOURCE_EXHAUSTED", false, false],
  422: ["INVALID_ARGUMENT", false, false],
  429: ["RESOURCE_EXHAUSTED", true, false],
  501: ["UNIMPLEMENTED", false, false],
  503: ["UNAVAILABLE", true, false],
  "5xx": ["UNAVAILABLE", true, true],
  other: ["INTERNAL", true, false]
} as const

const reasons = ["Http", "Connect", "Stream", "Timeout", "Protocol", "Local"] as const

describe("the engine status table", () => {
  it("gives every row's decisions", () => {
    expect(Object.fromEntries(Object.entries(engineStatusTable).map(([k, d]) => [k, read(d)]))).toEqual(expected)
  })

  it("has a row for each explicit status and each range, and nothing else", () => {
    expect(Object.keys(engineStatusTable).sort()).toEqual([...EXPLICIT_STATUSES.map(String), "5xx", "other"].sort())
    for (const s of EXPLICIT_STATUSES) expect(engineStatusKey(s)).toBe(s)
  })

  it("a status in no explicit row gets its range's", () => {
    const ranges = {
      "5xx": [500, 502, 504, 505, 507, 599, 600, 999, Number.POSITIVE_INFINITY],
      other: [405, 409, 410, 418, 451, 499, 100, 200, 302, 0, -1, 400.5, Number.NaN]
    } as const
    for (const [range, statuses] of Object.entries(ranges))
      for (const s of statuses) {
        expect([s, engineStatusKey(s)]).toEqual([s, range])
        expect([s, read(engineStatus(s))]).toEqual([s, expected[range as keyof typeof ranges]])
      }
  })

  it("a failure with no status goes by its reason; an output fault is the request's, whatever its status", () => {
    expect(Object.fromEntries(Object.entries(noStatusTable).map(([k, d]) => [k, read(d)]))).toEqual({
      Http: ["UNAVAILABLE", true, true],
      Stream: ["UNAVAILABLE", true, true],
      Connect: ["UNAVAILABLE", true, true],
      Timeout: ["DEADLINE_EXCEEDED", true, false],
      Protocol: ["INTERNAL", true, false],
      // the agent's host could not connect (its descriptor limit): this node's, not the engine's
      Local: ["UNAVAILABLE", true, false]
    })
    expect(read(outputFault)).toEqual(["INTERNAL", false, false])
    // whose failure it is, decided in the row: only Local is the agent's own (cgn-error-source agent)
    const agents = [...Object.entries(noStatusTable), ...Object.entries(engineStatusTable)]
      .filter(([, d]) => d.agentReason !== undefined)
      .map(([k, d]) => [k, d.agentReason])
    expect(agents).toEqual([["Local", "agent_resources"]])
  })

  it("picks an output fault's row first, then the status's where the engine answered with one, else the reason's", () => {
    for (const reason of reasons) {
      expect(engineDecisions({ reason })).toBe(noStatusTable[reason])
      expect(engineDecisions({ reason, fault: "output" })).toBe(outputFault)
      for (const status of [400, 401, 413, 429, 500, 501, 503, 409]) {
        // an HTTP answer's status, or a stream error object's numeric code; other reasons have no status of theirs
        const row = reason === "Http" || reason === "Stream" ? engineStatus(status) : noStatusTable[reason]
        expect(engineDecisions({ reason, status })).toBe(row)
        expect(engineDecisions({ reason, status, fault: "output" })).toBe(outputFault)
      }
    }
  })
})

describe("GrpcStatus answers from the table", () => {
  const statuses = [undefined, ...Array.from({ length: 700 }, (_, i) => i)]

  it("the code of an HTTP status is its row's", () => {
    for (const s of statuses) if (s !== undefined) expect([s, httpStatusToGrpc(s)]).toEqual([s, engineStatus(s).code])
  })

  it("an engine failure's code, retry and count are its row's", () => {
    for (const reason of reasons)
      for (const status of statuses)
        for (const fault of [undefined, "output"] as const) {
          const e = new EngineError({
            reason,
            message: "m",
            ...(status === undefined ? {} : { status }),
            ...(fault === undefined ? {} : { fault })
          })
          const d = engineDecisions(e)
          const f = engineFailure(e)
          const at = [reason, status, fault]
          expect([at, f.code, f.retryElsewhere]).toEqual([at, d.code, d.retryElsewhere])
          expect([at, engineFailedCall(e)]).toEqual([at, d.failsCall ? f.message : undefined])
          // the code an engine's answer gives, an output fault's mark aside (EngineCut explains UNAVAILABLE ones)
          expect([at, engineErrorCode(e)]).toEqual([
            at,
            engineDecisions({ reason, ...(status === undefined ? {} : { status }) }).code
          ])
          expect([at, endsUnavailable(e)]).toEqual([at, engineErrorCode(e) === Status.UNAVAILABLE])
        }
  })
})
