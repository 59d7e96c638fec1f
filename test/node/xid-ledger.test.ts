// The Xid ledger (services/node/XidLedger.ts), pure: Xids carried across NVML sessions, cleared with a base, and
// its record encoded and decoded.
import { describe, expect, it } from "vitest"
import type { Gpu, GpuXid } from "../../src/gen/cgn/agent/v1/agent.ts"
import { gpuWith } from "../../src/services/node/NvmlValues.ts"
import {
  clear,
  decodeRecord,
  encodeRecord,
  ledgerOf,
  observe,
  recordOf,
  rememberedFault
} from "../../src/services/node/XidLedger.ts"

const U0 = "GPU-aaaa"
const U1 = "GPU-bbbb"
const gpu = (index: number, uuid: string, xids: ReadonlyArray<GpuXid>, more: Partial<Gpu> = {}): Gpu =>
  gpuWith({ index, uuid, criticalXids: [...xids], ...more })
const xidsOf = (gpus: ReadonlyArray<Gpu>) => gpus.map((g) => g.criticalXids)

describe("observe", () => {
  it("passes a session's Xids through and says how the ledger moved: an Xid, counts, nothing", () => {
    const ledger = ledgerOf()
    const first = observe(ledger, [gpu(0, U0, []), gpu(1, U1, [{ xid: 79, events: 1 }])])
    expect(xidsOf(first.gpus)).toEqual([[], [{ xid: 79, events: 1 }]])
    expect(first.change).toBe("xids")
    // the same sample again: nothing moved
    expect(observe(ledger, [gpu(0, U0, []), gpu(1, U1, [{ xid: 79, events: 1 }])]).change).toBe("none")
    const more = observe(ledger, [gpu(1, U1, [{ xid: 79, events: 3 }])])
    expect(more.change).toBe("counts")
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
    // carried: what is shown is the same, the record needs no write for it
    expect(reopened.change).toBe("counts")
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

  // agent.proto GpuXid.events is a uint32: a carried count plus a new session's stays at 4294967295
  it("a carried count plus the new session's stops at the uint32 the record and GpuXid.events hold", () => {
    const ledger = ledgerOf({ bootId: "b", gpus: [{ uuid: U0, xids: [{ xid: 79, events: 0xffff_fff0 }] }] })
    const out = observe(ledger, [gpu(0, U0, [{ xid: 79, events: 100 }])])
    expect(xidsOf(out.gpus)).toEqual([[{ xid: 79, events: 4_294_967_295 }]])
    expect(decodeRecord(encodeRecord(recordOf(ledger, "b")))).toMatchObject({
      gpus: [{ uuid: U0, xids: [{ xid: 79, events: 4_294_967_295 }] }]
    })
  })

  it("a GPU whose Xids are unreported this sample keeps what the ledger has, and moves nothing", () => {
    const ledger = ledgerOf()
    observe(ledger, [gpu(0, U0, [{ xid: 79, events: 1 }])])
    const lost = observe(ledger, [gpu(0, U0, [], { lost: true, unreportedFields: ["critical_xids"] })])
    expect(lost.change).toBe("none")
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

  it("keeps at most 16 distinct Xids per GPU, as a session does: a fault takes a harmless Xid's place", () => {
    const carried = Array.from({ length: 16 }, (_, i) => ({ xid: 100 + i, events: 1 }))
    const faults = ledgerOf({ bootId: "b", gpus: [{ uuid: U0, xids: carried }] })
    const out = observe(faults, [gpu(0, U0, [{ xid: 79, events: 1 }])])
    expect(out.gpus[0]?.criticalXids).toHaveLength(16)
    expect(out.gpus[0]?.criticalXids.some((x) => x.xid === 79)).toBe(false)
    // the same 16 carried, all ignored by the operator's rule: the fault Xid 79 is kept, the first of them goes
    const ignored = ledgerOf({ bootId: "b", gpus: [{ uuid: U0, xids: carried }] }, (xid) => xid < 100)
    const kept = observe(ignored, [
      gpu(0, U0, [
        { xid: 79, events: 1 },
        { xid: 13, events: 1 }
      ])
    ]).gpus[0]?.criticalXids
    expect(kept).toHaveLength(16)
    expect(kept?.map((x) => x.xid)).toContain(79)
    expect(kept?.map((x) => x.xid)).not.toContain(100)
  })

  it("a record past the caps keeps its first 64 GPUs and 16 Xids each", () => {
    const xids = Array.from({ length: 20 }, (_, i) => ({ xid: 100 + i, events: 1 }))
    const gpus = Array.from({ length: 70 }, (_, i) => ({ uuid: `GPU-${i}`, xids }))
    const ledger = ledgerOf({ bootId: "b", gpus })
    expect(ledger.entries.size).toBe(64)
    expect(recordOf(ledger, "b").gpus[0]?.xids).toHaveLength(16)
  })
})

describe("clear", () => {
  it("forgets what a GPU had, carried and this session's, and counts the session's later events", () => {
    const ledger = ledgerOf({ bootId: "b", gpus: [{ uuid: U0, xids: [{ xid: 48, events: 1 }] }] })
    observe(ledger, [gpu(0, U0, [{ xid: 79, events: 2 }]), gpu(1, U1, [{ xid: 94, events: 1 }])])
    expect(clear(ledger, [U0]).gpus).toEqual([
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
    expect(clear(ledger).gpus.map((c) => c.uuid)).toEqual([U0, U1])
    expect(clear(ledger).gpus).toEqual([])
  })

  it("undo takes a clear back (its write failed), counting what the session added meanwhile", () => {
    const ledger = ledgerOf({ bootId: "b", gpus: [{ uuid: U0, xids: [{ xid: 48, events: 1 }] }] })
    observe(ledger, [gpu(0, U0, [{ xid: 79, events: 1 }])])
    const cleared = clear(ledger)
    observe(ledger, [gpu(0, U0, [{ xid: 79, events: 2 }])])
    cleared.undo()
    expect(xidsOf(observe(ledger, [gpu(0, U0, [{ xid: 79, events: 2 }])]).gpus)).toEqual([
      [
        { xid: 48, events: 1 },
        { xid: 79, events: 2 }
      ]
    ])
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

describe("rememberedFault (NVML silent since the agent started)", () => {
  const remembered = [
    { uuid: U0, xids: [{ xid: 13, events: 4 }] },
    {
      uuid: U1,
      xids: [
        { xid: 13, events: 1 },
        { xid: 79, events: 1 }
      ]
    }
  ]
  const notThirteen = (xid: number) => xid !== 13
  it("GPUs by index or none named: a fault Xid of any GPU, and says why any", () => {
    expect(rememberedFault(remembered, [0], notThirteen)).toMatch(/^GPU GPU-bbbb reported Xid 79 .*names no UUIDs/)
    expect(rememberedFault(remembered, [], notThirteen)).toMatch(/GPU-bbbb/)
  })
  it("GPUs by UUID: only theirs; Xids that are no fault by the rule hold nothing", () => {
    expect(rememberedFault(remembered, [U0], notThirteen)).toBeUndefined()
    expect(rememberedFault(remembered, [U1], notThirteen)).not.toMatch(/names no UUIDs/)
    expect(rememberedFault(remembered, [0], (xid) => xid === 48)).toBeUndefined()
  })
})
