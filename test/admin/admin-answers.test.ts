// The admin server's one error-status table (services/admin/AdminAnswers.ts), row by row: every refusal and failure an
// admin route or gate answers, with the status it had before the table (the routes read it; the HTTP tests in this
// folder see the same statuses over loopback). The whole table is compared, so a row added, dropped or changed shows.
import { describe, expect, it } from "vitest"
import { adminStatus } from "../../src/services/admin/AdminAnswers.ts"
import { restartAnswer } from "../../src/services/admin/EngineRestart.ts"
import { State } from "../../src/services/engine/EngineState.ts"

describe("adminStatus: each admin error's tag to its HTTP status", () => {
  it("has one row per tag, each with its status", () => {
    expect(adminStatus).toEqual({
      MisdirectedHost: 421,
      WrongMethod: 405,
      TokenMissing: 401,
      TokenWrong: 401,
      FromWebPage: 403,
      BodyTooLarge: 413,
      BodyReadFailed: 400,
      InvalidQuery: 400,
      CordonReasonInvalid: 400,
      NodeDraining: 409,
      EngineNotReady: 409,
      EngineNotSpawned: 409,
      ProfileBusy: 409,
      UnknownGpu: 404,
      GpuNotIdentified: 409,
      CordonPersistError: 500,
      XidRecordError: 500,
      InspectorError: 500
    })
  })

  it("restartAnswer's refusals take their status from the table; its successes stay 202", () => {
    const starting = State.Starting({ phase: "spawning", since: 0, run: 1 })
    expect(restartAnswer("not-ready", starting).status).toBe(adminStatus.EngineNotReady)
    expect(restartAnswer("not-spawned", starting).status).toBe(adminStatus.EngineNotSpawned)
    expect(restartAnswer("draining", starting).status).toBe(adminStatus.NodeDraining)
    expect(restartAnswer("restarting", starting).status).toBe(202)
    expect(restartAnswer("backoff-ended", starting).status).toBe(202)
  })
})
