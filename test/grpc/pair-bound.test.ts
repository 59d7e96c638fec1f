// Whether a failed Generate leg is bound to its P/D pair (Handoff.ts boundToPair, GrpcFailure.pairBound: the status
// says cgn-retry-pair, the router retries both legs as a new pair), pure: every role x handoff x how far the call got.
// The rule's users (the handler's refusals and failures, the server's refusals before the handler) are covered end to
// end by grpc.test.ts and pd.test.ts.
import { Result } from "effect"
import { describe, expect, it } from "vitest"
import type { Role } from "../../src/services/config/ConfigSchema.ts"
import type { HandoffProtocol } from "../../src/services/engine/Engine.ts"
import { boundToPair, hostsRendezvous, type LegPlan, planLeg } from "../../src/services/grpc/Handoff.ts"
import { PREFILL_PARAMS } from "../support/nixlParams.ts"

const ROLES: ReadonlyArray<Role> = ["both", "prefill", "decode"]
const HANDOFFS: ReadonlyArray<HandoffProtocol | undefined> = ["kv_transfer_params", "bootstrap", undefined]

const P_PARAMS = PREFILL_PARAMS

/** The leg planLeg makes of a well-formed request for this node; undefined: it refuses every one. */
const planned = (role: Role, handoff: HandoffProtocol | undefined): LegPlan | undefined => {
  const leg = planLeg({
    role,
    handoff,
    body: { prompt: "p" },
    ...(handoff === "bootstrap" ? { bootstrap: { host: "p0", port: 8998, room: 7 } } : {}),
    ...(handoff === "kv_transfer_params" && role === "decode" ? { kvTransferParams: P_PARAMS } : {})
  })
  return Result.isSuccess(leg) ? leg.success : undefined
}

type Stage = "refused before its plan" | "refused once planned" | "failed once the engine was asked"
const STAGES: ReadonlyArray<Stage> = [
  "refused before its plan",
  "refused once planned",
  "failed once the engine was asked"
]

/**
 * The decision, one row per node (role, handoff), one column per stage; "-": the stage is never reached (planLeg refuses
 * a P/D role on an engine with no handoff). Bound: every call on an SGLang prefill node (the decode leg waits on its
 * bootstrap server), and a decode leg once its engine may have read the handoff or joined the room.
 */
const TABLE: Readonly<Record<string, readonly [boolean, boolean | "-", boolean | "-"]>> = {
  "both kv_transfer_params": [false, false, false],
  "both bootstrap": [false, false, false],
  "both none": [false, false, false],
  "prefill kv_transfer_params": [false, false, false],
  "prefill bootstrap": [true, true, true],
  "prefill none": [false, "-", "-"],
  "decode kv_transfer_params": [false, false, true],
  "decode bootstrap": [false, false, true],
  "decode none": [false, "-", "-"]
}

const decided = (role: Role, handoff: HandoffProtocol | undefined): ReadonlyArray<boolean | "-"> => {
  const leg = planned(role, handoff)
  return STAGES.map((stage) => {
    if (stage === "refused before its plan") return boundToPair({ role, handoff, leg: undefined, engineAsked: false })
    if (leg === undefined) return "-"
    return boundToPair({ role, handoff, leg, engineAsked: stage === "failed once the engine was asked" })
  })
}

describe("boundToPair: every role x handoff x stage", () => {
  const cells = ROLES.flatMap((role) => HANDOFFS.map((handoff) => [role, handoff] as const))

  it("the table covers every node", () => {
    expect(Object.keys(TABLE).sort()).toEqual(cells.map(([r, h]) => `${r} ${h ?? "none"}`).sort())
  })

  it.each(cells)("%s over %s", (role, handoff) => {
    expect(decided(role, handoff)).toEqual(TABLE[`${role} ${handoff ?? "none"}`])
  })

  it("reads the leg's tag, not the role: a decode leg is bound once asked, a prefill or normal one is not", () => {
    const body = { prompt: "p" }
    const legs: ReadonlyArray<LegPlan> = [
      { _tag: "Normal", body },
      { _tag: "Prefill", protocol: "kv_transfer_params", body },
      { _tag: "Decode", protocol: "kv_transfer_params", body },
      { _tag: "Decode", protocol: "bootstrap", body }
    ]
    const bound = legs.map((leg) => [
      boundToPair({ role: "decode", handoff: "kv_transfer_params", leg, engineAsked: false }),
      boundToPair({ role: "decode", handoff: "kv_transfer_params", leg, engineAsked: true })
    ])
    expect(bound).toEqual([
      [false, false],
      [false, false],
      [false, true],
      [false, true]
    ])
  })
})

describe("hostsRendezvous: the node whose engine runs the bootstrap server (NodeStatus publishes it)", () => {
  it("is an SGLang prefill node, and only that", () => {
    const hosts = ROLES.flatMap((role) => HANDOFFS.filter((h) => hostsRendezvous(role, h)).map((h) => [role, h]))
    expect(hosts).toEqual([["prefill", "bootstrap"]])
  })
})
