// Which Xids and row-remapping states make a GPU faulty (services/node/Xid.ts, Gpus.ts gpuFault): the table follows
// NVIDIA k8s-device-plugin (internal/rm/health.go: every Xid but the application errors 13, 31, 43, 45, 68, 109),
// the reasons name the Xid and what it means, what a board cannot report is no fault, and the shipped alert skips
// the same Xids as the table.
import { describe, expect, it } from "vitest"
import { assignGpus, gateVerdict, gpuFault } from "../../src/services/node/Gpus.ts"
import { gpuWith } from "../../src/services/node/Nvml.ts"
import { applicationXids, defaultXidRule, describeXid, xidIsFault } from "../../src/services/node/Xid.ts"
import { shippedRules } from "../support/promtool.ts"

const xids = (...list: ReadonlyArray<number>) => list.map((xid) => ({ xid, events: 1 }))

describe("the Xid table", () => {
  it("skips exactly the device plugin's application errors; every other Xid, unnamed ones too, is a fault", () => {
    expect(applicationXids).toEqual([13, 31, 43, 45, 68, 109])
    for (const xid of applicationXids) expect(xidIsFault(xid)).toBe(false)
    for (const xid of [48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 999, 150, 1]) expect(xidIsFault(xid)).toBe(true)
  })

  it("takes the operator's lists: ignored Xids are no fault, listed faults are, application errors included", () => {
    const rule = { ignore: [92, 150], fault: [13] }
    expect(xidIsFault(92, rule)).toBe(false)
    expect(xidIsFault(150, rule)).toBe(false)
    expect(xidIsFault(13, rule)).toBe(true)
    // the rest of the table as it is
    expect(xidIsFault(31, rule)).toBe(false)
    expect(xidIsFault(79, rule)).toBe(true)
    // a fault listed wins over the same Xid ignored (the config refuses both; the device plugin's order)
    expect(xidIsFault(92, { ignore: [92], fault: [92] })).toBe(true)
    expect(defaultXidRule).toEqual({ ignore: [], fault: [] })
    expect(gpuFault(gpuWith({ index: 0, criticalXids: xids(13, 92) }), rule)).toBe(
      "GPU 0 reported Xid 13 (graphics engine exception): it needs a GPU reset or a reboot"
    )
    expect(gpuFault(gpuWith({ index: 0, criticalXids: xids(92) }), rule)).toBeUndefined()
  })

  it("names the well-known Xids after NVIDIA's catalog, and the others by number", () => {
    expect(describeXid(79)).toBe("Xid 79 (fallen off the bus)")
    expect(describeXid(48)).toBe("Xid 48 (double-bit ECC error)")
    expect(describeXid(95)).toBe("Xid 95 (uncontained ECC error)")
    expect(describeXid(119)).toBe("Xid 119 (GSP RPC timeout)")
    // README's example of an Xid an operator may ignore (engine.ignore_xids): "a high single-bit ECC rate"
    expect(describeXid(92)).toBe("Xid 92 (high single-bit ECC error rate)")
    expect(describeXid(150)).toBe("Xid 150")
  })

  it("is the shipped alert's, through the counter's fault label (no Xid list of its own to keep in step)", () => {
    const alert = shippedRules()
      .groups.flatMap((g) => g.rules)
      .find((r) => r.alert === "CgnAgentGpuXidError")
    expect(alert?.expr).toMatch(/^cgn_agent_gpu_xid_errors_total\{fault="true"\} > 0 or /)
    // agents older than the label: the application Xids left out by the regex, the same as the table's
    const skipped = /fault="",xid!~"([^"]+)"/.exec(alert?.expr ?? "")?.[1]
    expect(skipped?.split("|").map(Number)).toEqual([...applicationXids])
  })
})

describe("gpuFault: Xids and row remapping", () => {
  it("a critical Xid is a fault naming it; an application Xid is not", () => {
    expect(gpuFault(gpuWith({ index: 0, criticalXids: xids(79) }))).toBe(
      "GPU 0 reported Xid 79 (fallen off the bus): it needs a GPU reset or a reboot"
    )
    expect(gpuFault(gpuWith({ index: 2, criticalXids: xids(13, 31) }))).toBeUndefined()
    // application errors are left out of the reason; every fault Xid is in it, first seen first
    expect(gpuFault(gpuWith({ index: 1, criticalXids: xids(13, 94, 150) }))).toBe(
      "GPU 1 reported Xid 94 (contained ECC error), Xid 150: it needs a GPU reset or a reboot"
    )
  })

  it("a failed row remapping and a pending one are faults; unreported (false) ones are not", () => {
    expect(gpuFault(gpuWith({ index: 3, rowRemapFailure: true }))).toBe(
      "GPU 3 has a failed row remapping: it needs replacing"
    )
    expect(gpuFault(gpuWith({ index: 3, rowRemapPending: true }))).toBe(
      "GPU 3 has a row remapping pending: it needs a GPU reset"
    )
    const unsupported = gpuWith({
      index: 0,
      unreportedFields: ["critical_xids", "row_remap_pending", "row_remap_failure"]
    })
    expect(gpuFault(unsupported)).toBeUndefined()
  })

  it("a lost GPU says lost first (its Xid 79 is why); a failed remap outranks the ECC count it comes with", () => {
    expect(gpuFault(gpuWith({ index: 0, lost: true, criticalXids: xids(79) }))).toContain("is lost")
    expect(gpuFault(gpuWith({ index: 0, eccUncorrected: 2, rowRemapFailure: true }))).toContain("failed row remapping")
    expect(gpuFault(gpuWith({ index: 0, eccUncorrected: 2, rowRemapPending: true }))).toContain("2 uncorrected ECC")
  })

  it("a GPU with a critical Xid is not given to the engine, and holds its (re)start", () => {
    const host = [gpuWith({ index: 0, criticalXids: xids(48) }), gpuWith({ index: 1 }), gpuWith({ index: 2 })]
    expect(assignGpus([], 2, host)).toEqual({ _tag: "Assigned", indices: [1, 2], automatic: true })
    expect(gateVerdict(host, [0], 2 ** 30, new Set(), () => undefined)).toEqual({
      _tag: "Faulty",
      reason: "GPU 0 reported Xid 48 (double-bit ECC error): it needs a GPU reset or a reboot"
    })
  })
})
