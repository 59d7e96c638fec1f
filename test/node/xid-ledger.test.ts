// The Xid ledger (services/node/XidLedger.ts), pure: Xids carried across NVML sessions, cleared with a base, and
// its record encoded and decoded.
import { describe, expect, it } from "vitest"
import type { Gpu, GpuXid } from "../../src/gen/cgn/agent/v1/agent.ts"
import { gpuWith } from "../../src/services/node/NvmlValues.ts"
import { clear, decodeRecord, encodeRecord, ledgerOf, observe, recordOf } from "../../src/services/node/XidLedger.ts"

const U0 = "GPU-aaaa"
const U1 = "GPU-bbbb"
const gpu = (index: number, uuid: string, xids: ReadonlyArray<GpuXid>, more: Partial<Gpu> = {}): Gpu =>
  gpuWith({ index, uuid, criticalXids: [...xids], ...more })
const xidsOf = (gpus: ReadonlyArray<Gpu>) => gpus.map((g) => g.criticalXids)

describe("observe", () => {
  it("passes a session's Xids through and says when the ledger moved", () => {
    const ledger = ledgerOf()
    const first = observe(ledger, [gpu(0, U0, []), gpu(1, U1, [{ xid: 79, events: 1 }])])
    expect(xidsOf(first.gpus)).toEqual([[], [{ xid: 79, events: 1 }]])
    expect(first.changed).toBe(true)
    // the same sample again: nothing moved
    expect(observe(ledger, [gpu(0, U0, []), gpu(1, U1, [{ xid: 79, events: 1 }])]).changed).toBe(false)
    const more = observe(ledger, [gpu(1, U1, [{ xid: 79, events: 3 }])])
    expect(more.changed).toBe(true)
    expect(xidsOf(more.gpus)).toEqual([[{ xid: 79, events: 3 }]])
  })

  it("carries a GPU's Xids into a new NVML session (its tallies went down), and adds the new session's", () => {
    const ledger = ledgerOf()
    observe(ledger, [
      gpu(0, U0, [
        { xid: 13, events: 2 },
        { xid: 79, events: 1 }
      ])
    ])
    // NVML opened again: the session counts from nothing
    const reopened = observe(ledger, [gpu(0, U0, [])])
    expect(reopened.changed).toBe(true)
    expect(xidsOf(reopened.gpus)).toEqual([
      [
        { xid: 13, events: 2 },
        { xid: 79, events: 1 }
      ]
    ])
    const later = observe(ledger, [
      gpu(0, U0, [
        { xid: 13, events: 1 },
        { xid: 48, events: 1 }
      ])
    ])
    expect(xidsOf(later.gpus)).toEqual([
      [
        { xid: 13, events: 3 },
        { xid: 79, events: 1 },
        { xid: 48, events: 1 }
      ]
    ])
  })

  it("a GPU whose Xids are unreported this sample keeps what the ledger has, and moves nothing", () => {
    const ledger = ledgerOf()
    observe(ledger, [gpu(0, U0, [{ xid: 79, events: 1 }])])
    const lost = observe(ledger, [gpu(0, U0, [], { lost: true, unreportedFields: ["critical_xids"] })])
    expect(lost.changed).toBe(false)
    expect(xidsOf(lost.gpus)).toEqual([[{ xid: 79, events: 1 }]])
    // watched again in the same session: no double count
    expect(xidsOf(observe(ledger, [gpu(0, U0, [{ xid: 79, events: 1 }])]).gpus)).toEqual([[{ xid: 79, events: 1 }]])
  })

  it("a GPU without a UUID is passed as sampled (nothing to keep it under)", () => {
    const ledger = ledgerOf()
    const g = gpu(0, "", [{ xid: 79, events: 1 }])
    expect(observe(ledger, [g]).gpus[0]).toBe(g)
    expect(ledger.entries.size).toBe(0)
  })

  it("keeps at most 16 distinct Xids per GPU, as a session does", () => {
    const carried = Array.from({ length: 16 }, (_, i) => ({ xid: 100 + i, events: 1 }))
    const ledger = ledgerOf({ bootId: "b", gpus: [{ uuid: U0, xids: carried }] })
    const out = observe(ledger, [gpu(0, U0, [{ xid: 79, events: 1 }])])
    expect(out.gpus[0]?.criticalXids).toHaveLength(16)
    expect(out.gpus[0]?.criticalXids.some((x) => x.xid === 79)).toBe(false)
  })
})

describe("clear", () => {
  it("forgets what a GPU had, carried and this session's, and counts the session's later events", () => {
    const ledger = ledgerOf({ bootId: "b", gpus: [{ uuid: U0, xids: [{ xid: 48, events: 1 }] }] })
    observe(ledger, [gpu(0, U0, [{ xid: 79, events: 2 }]), gpu(1, U1, [{ xid: 94, events: 1 }])])
    expect(clear(ledger, [U0])).toEqual([
      {
        uuid: U0,
        xids: [
          { xid: 48, events: 1 },
          { xid: 79, events: 2 }
        ]
      }
    ])
    const after = observe(ledger, [gpu(0, U0, [{ xid: 79, events: 2 }]), gpu(1, U1, [{ xid: 94, events: 1 }])])
    expect(xidsOf(after.gpus)).toEqual([[], [{ xid: 94, events: 1 }]])
    // the same Xid again after the reset: one event, not three
    expect(xidsOf(observe(ledger, [gpu(0, U0, [{ xid: 79, events: 3 }])]).gpus)).toEqual([[{ xid: 79, events: 1 }]])
    // every GPU when none is named; a GPU with nothing is not listed
    expect(clear(ledger).map((c) => c.uuid)).toEqual([U0, U1])
    expect(clear(ledger)).toEqual([])
  })

  it("a cleared GPU's next NVML session starts from nothing", () => {
    const ledger = ledgerOf()
    observe(ledger, [gpu(0, U0, [{ xid: 79, events: 2 }])])
    clear(ledger)
    expect(xidsOf(observe(ledger, [gpu(0, U0, [])]).gpus)).toEqual([[]])
    expect(xidsOf(observe(ledger, [gpu(0, U0, [{ xid: 79, events: 1 }])]).gpus)).toEqual([[{ xid: 79, events: 1 }]])
  })
})

describe("the record", () => {
  it("holds the GPUs with Xids, and reads back into a ledger that shows them", () => {
    const ledger = ledgerOf()
    observe(ledger, [gpu(0, U0, []), gpu(1, U1, [{ xid: 79, events: 1 }])])
    const text = encodeRecord(recordOf(ledger, "boot-1"))
    const record = decodeRecord(text)
    expect(record).toEqual({ bootId: "boot-1", gpus: [{ uuid: U1, xids: [{ xid: 79, events: 1 }] }] })
    if (typeof record === "string") throw new Error(record)
    const again = ledgerOf(record)
    expect(xidsOf(observe(again, [gpu(0, U1, [])]).gpus)).toEqual([[{ xid: 79, events: 1 }]])
  })

  it("refuses what is not a record, saying why", () => {
    expect(decodeRecord("{")).toMatch(/^not JSON/)
    expect(decodeRecord("[]")).toBe("not a record of GPU Xids (bootId, gpus)")
    expect(decodeRecord('{"bootId":"b","gpus":[{"uuid":""}]}')).toBe("a GPU without uuid or xids")
    expect(decodeRecord('{"bootId":"b","gpus":[{"uuid":"GPU-a","xids":[{"xid":-1,"events":1}]}]}')).toBe(
      "GPU GPU-a: an Xid that is not one"
    )
  })
})
