// The Xid events of an NVML session (layers/node/nvmlEvents.ts) as one sample after another takes them
// (nvmlSample.ts), over a Binding faked in JS: each event counted once, every wait with timeout 0 (never blocking the
// worker), GPUs or drivers without Xid events unreported (no fault, nothing logged), failures said and tried again,
// the per-GPU bound, and each event's GPU told by NVML's index (nvmlDeviceGetIndex), else by its handle's address, else
// every watched GPU's (fail closed, as NVIDIA k8s-device-plugin marks every device unhealthy).
import { describe, expect, it } from "vitest"
import type { Binding } from "../../src/layers/node/nvmlBinding.ts"
import { MAX_XIDS, xidWatch } from "../../src/layers/node/nvmlEvents.ts"
import { sample } from "../../src/layers/node/nvmlSample.ts"
import { gpuFault } from "../../src/services/node/Gpus.ts"
import type { Gpu } from "../../src/services/node/Nvml.ts"
import { type FakeEvents, fakeBinding, fakeEvents } from "../support/nvmlBinding.ts"

/** The waits that could block: any with a timeout other than 0. */
const blockingWaits = (events: FakeEvents) => events.waits.filter((t) => t !== 0)

/** A session over `binding`: one watch, a pass at each call, the problems of each pass. */
const session = (binding: Binding) => {
  const watch = xidWatch(binding)
  return (): { readonly gpus: ReadonlyArray<Gpu>; readonly problems: Array<string> } => {
    const problems = new Set<string>()
    const gpus = sample(binding, problems, (why) => problems.add(why), watch)
    return { gpus, problems: [...problems] }
  }
}

const xidsOf = (gpus: ReadonlyArray<Gpu>) => gpus.map((g) => g.criticalXids)

describe("Xid events, sample by sample", () => {
  it("delivers each event once, counted per Xid in first-seen order, kept for the session; every wait has timeout 0", () => {
    const events = fakeEvents()
    const pass = session(fakeBinding([{ uuid: "GPU-a" }, { uuid: "GPU-b" }], events))
    events.queue.push([1, 79])
    const first = pass()
    expect(xidsOf(first.gpus)).toEqual([[], [{ xid: 79, events: 1 }]])
    expect(first.gpus.map((g) => g.unreportedFields)).toEqual([[], []])
    // nothing new: the same list, not counted again
    expect(xidsOf(pass().gpus)).toEqual([[], [{ xid: 79, events: 1 }]])
    events.queue.push([1, 13], [1, 79], [0, 31])
    const third = pass()
    expect(xidsOf(third.gpus)).toEqual([
      [{ xid: 31, events: 1 }],
      [
        { xid: 79, events: 2 },
        { xid: 13, events: 1 }
      ]
    ])
    expect(third.problems).toEqual([])
    // one wait per event and one that finds none per pass, none of them blocking
    expect(events.waits).toHaveLength(1 + 1 + 1 + 3 + 1)
    expect(blockingWaits(events)).toEqual([])
    expect(events.log).toEqual(["create"]) // one set for the session
  })

  it("a GPU without the Xid event type is unreported and gets no events; the others are watched", () => {
    const events = fakeEvents()
    const pass = session(fakeBinding([{ uuid: "GPU-a" }, { uuid: "GPU-b", eventTypes: 0x3n }], events))
    events.queue.push([1, 79], [0, 48])
    const { gpus, problems } = pass()
    expect(gpus[1]).toMatchObject({ criticalXids: [], unreportedFields: ["critical_xids"] })
    expect(gpus[0]).toMatchObject({ criticalXids: [{ xid: 48, events: 1 }], unreportedFields: [] })
    expect(problems).toEqual([]) // the board's nature, not a problem to log
  })

  it("a GPU without the Xid event type is asked once a session, not at every sample (the board's nature)", () => {
    const binding = fakeBinding([
      { uuid: "GPU-a" },
      { uuid: "GPU-b", eventTypes: 0x3n },
      { uuid: "GPU-c", rc: { supported: 3 } }
    ])
    const asked: Array<unknown> = []
    const events = binding.events!
    const pass = session({
      ...binding,
      events: {
        ...events,
        supported: (d, out) => {
          asked.push(d)
          return events.supported(d, out)
        }
      }
    })
    for (let n = 0; n < 3; n++) {
      expect(pass().gpus.map((g) => g.unreportedFields)).toEqual([[], ["critical_xids"], ["critical_xids"]])
    }
    // nvmlEvents.ts: "GPUs that cannot deliver Xid events this session": each GPU's event types are asked once
    expect(asked).toEqual([0, 1, 2])
  })

  it("a driver without the event-set entry points leaves every GPU's Xids unreported, silently", () => {
    const pass = session({ ...fakeBinding([{ uuid: "GPU-a" }]), events: undefined })
    const { gpus, problems } = pass()
    expect(gpus[0]).toMatchObject({ criticalXids: [], unreportedFields: ["critical_xids"] })
    expect(problems).toEqual([])
  })

  it("an event set NVML does not support leaves the Xids unreported; one that fails is said and tried again", () => {
    const unsupported = session(fakeBinding([{ uuid: "GPU-a", rc: { create: 3 } }]))
    expect(unsupported()).toMatchObject({ gpus: [{ unreportedFields: ["critical_xids"] }], problems: [] })
    const rc: Record<string, number> = { create: 999 }
    const events = fakeEvents()
    const pass = session(fakeBinding([{ uuid: "GPU-a", rc }], events))
    expect(pass()).toMatchObject({
      gpus: [{ unreportedFields: ["critical_xids"] }],
      problems: ["nvmlEventSetCreate(0): NVML_ERROR_UNKNOWN (999)"]
    })
    delete rc.create
    events.queue.push([0, 94])
    expect(pass()).toMatchObject({ gpus: [{ criticalXids: [{ xid: 94, events: 1 }], unreportedFields: [] }] })
  })

  it("a registration that fails other than NOT_SUPPORTED is said and tried again at the next sample", () => {
    const rc: Record<string, number> = { register: 999 }
    const pass = session(fakeBinding([{ uuid: "GPU-a", rc }]))
    expect(pass()).toMatchObject({
      gpus: [{ unreportedFields: ["critical_xids"] }],
      problems: ["nvmlDeviceRegisterEvents(0): NVML_ERROR_UNKNOWN (999)"]
    })
    delete rc.register
    expect(pass()).toMatchObject({ gpus: [{ criticalXids: [], unreportedFields: [] }], problems: [] })
  })

  it("a wait that fails is said, and the Xids seen so far stay", () => {
    const rc: Record<string, number> = {}
    const events = fakeEvents()
    const pass = session(fakeBinding([{ uuid: "GPU-a", rc }], events))
    events.queue.push([0, 79])
    expect(xidsOf(pass().gpus)).toEqual([[{ xid: 79, events: 1 }]])
    rc.wait = 999
    expect(pass()).toMatchObject({
      gpus: [{ criticalXids: [{ xid: 79, events: 1 }], unreportedFields: [] }],
      problems: ["nvmlEventSetWait_v2: NVML_ERROR_UNKNOWN (999)"]
    })
  })

  it(`keeps at most ${MAX_XIDS} distinct Xids per GPU, saying which it left out`, () => {
    const events = fakeEvents()
    const pass = session(fakeBinding([{ uuid: "GPU-a" }], events))
    for (let xid = 100; xid < 100 + MAX_XIDS + 2; xid++) events.queue.push([0, xid])
    const { gpus, problems } = pass()
    expect(gpus[0]?.criticalXids.map((x) => x.xid)).toEqual(Array.from({ length: MAX_XIDS }, (_, i) => 100 + i))
    expect(problems).toEqual([
      `GPU 0: Xid ${100 + MAX_XIDS} not listed: more than ${MAX_XIDS} distinct Xids this session`,
      `GPU 0: Xid ${101 + MAX_XIDS} not listed: more than ${MAX_XIDS} distinct Xids this session`
    ])
  })

  it("a GPU lost after it was registered keeps its Xids (its Xid 79 says why); one lost from the start has none", () => {
    const rc: Record<string, number> = {}
    const events = fakeEvents()
    const pass = session(
      fakeBinding(
        [
          { uuid: "GPU-a", rc },
          { uuid: "GPU-b", rc: { handle: 15 } }
        ],
        events
      )
    )
    pass()
    events.queue.push([0, 79])
    rc.memory = 15 // NVML_ERROR_GPU_IS_LOST
    const { gpus } = pass()
    expect(gpus[0]).toMatchObject({ lost: true, criticalXids: [{ xid: 79, events: 1 }] })
    expect(gpus[0]?.unreportedFields).not.toContain("critical_xids")
    expect(gpus[1]).toMatchObject({ lost: true, criticalXids: [] })
    expect(gpus[1]?.unreportedFields).toContain("critical_xids")
  })

  it("an event is its GPU's by NVML's index (nvmlDeviceGetIndex), also when its device address is not the handle's", () => {
    const events = fakeEvents()
    const pass = session(fakeBinding([{ uuid: "GPU-a" }, { uuid: "GPU-b", eventAlias: true }], events))
    events.queue.push([1, 79], [0, 48])
    const { gpus, problems } = pass()
    expect(xidsOf(gpus)).toEqual([[{ xid: 48, events: 1 }], [{ xid: 79, events: 1 }]])
    expect(problems).toEqual([])
  })

  it("an event whose GPU cannot be told counts against every watched GPU (fail closed), said once per cause", () => {
    const events = fakeEvents()
    const binding = fakeBinding([{ uuid: "GPU-a" }, { uuid: "GPU-b", eventTypes: 0x3n }, { uuid: "GPU-c" }], events)
    const pass = session(binding)
    pass()
    events.queue.push([-1, 79], [-1, 79], [-1, 13])
    const { gpus, problems } = pass()
    const both = [
      { xid: 79, events: 2 },
      { xid: 13, events: 1 }
    ]
    // GPU b delivers no Xid events: unreported, as before; a and c each get every event
    expect(xidsOf(gpus)).toEqual([both, [], both])
    expect(gpus.map((g) => gpuFault(g))).toEqual([
      "GPU 0 reported Xid 79 (fallen off the bus): it needs a GPU reset or a reboot",
      undefined,
      "GPU 2 reported Xid 79 (fallen off the bus): it needs a GPU reset or a reboot"
    ])
    expect(problems).toEqual([
      "an Xid event's GPU cannot be told (nvmlDeviceGetIndex: NVML_ERROR_INVALID_ARGUMENT (2); its device is no watched GPU's handle): it counts against every watched GPU"
    ])
  })

  it("a driver without nvmlDeviceGetIndex: the handle's address tells the GPU; an event no handle has fails closed", () => {
    const events = fakeEvents()
    const binding = fakeBinding([{ uuid: "GPU-a" }, { uuid: "GPU-b", eventAlias: true }], events)
    const pass = session({ ...binding, events: binding.events && { ...binding.events, index: undefined } })
    events.queue.push([0, 48], [1, 79])
    const { gpus, problems } = pass()
    expect(xidsOf(gpus)).toEqual([
      [
        { xid: 48, events: 1 },
        { xid: 79, events: 1 }
      ],
      [{ xid: 79, events: 1 }]
    ])
    expect(problems).toEqual([
      "an Xid event's GPU cannot be told (nvmlDeviceGetIndex missing from the driver; its device is no watched GPU's handle): it counts against every watched GPU"
    ])
  })
})
