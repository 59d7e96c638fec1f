// What the gRPC server says of calls it ended before their handler ran (layers/grpc/rejectionReport.ts): a warning
// per method and reason at most once a minute, with how many went unlogged; a caller's cancel or deadline not at all.
import { Effect } from "effect"
import { Status } from "nice-grpc-common"
import { describe, expect, it } from "vitest"
import { rejectionReport } from "../../src/layers/grpc/rejectionReport.ts"
import { toGrpcFailure } from "../../src/services/grpc/GrpcStatus.ts"
import { CallCancelled, ProtocolViolation, UndecodableRequest } from "../../src/services/grpc/TransportErrors.ts"
import { captureMessages } from "../support/logCapture.ts"

const GENERATE = "/cgn.agent.v1.Agent/Generate"

describe("rejectionReport", () => {
  it("logs each method and reason once a minute, with the count left unlogged, and never a cancel", () => {
    const seen = captureMessages()
    let now = 0
    const report = rejectionReport(
      (e) => Effect.runSync(e.pipe(seen.provide)),
      () => now
    )
    const broken = toGrpcFailure(new ProtocolViolation({ detail: "the request carried no message" }))
    expect(broken.code).toBe(Status.INTERNAL)
    report(GENERATE, broken)
    report(GENERATE, broken)
    report(GENERATE, toGrpcFailure(new UndecodableRequest({ method: GENERATE, detail: "bad bytes" })))
    report(GENERATE, toGrpcFailure(new CallCancelled({})))
    now = 61_000
    report(GENERATE, broken)
    expect(seen.lines).toEqual([
      expect.stringMatching(/^gRPC call refused before it ran: .*the request carried no message/),
      expect.stringMatching(/^gRPC call refused before it ran: .*bad bytes/),
      expect.stringMatching(/^gRPC call refused before it ran: .*the request carried no message/)
    ])
  })
})
