// The pure GPU decisions with MIG (services/node/Gpus.ts, Mig.ts): a MIG device resolves to the GPU that lists it
// (also by its name before R470), one MIG device per engine, a GPU in MIG mode is never given whole (configured or
// automatic; nor, automatically, one whose MIG mode is unknown), and the gate judges the MIG device (its memory, its
// GPU instance's processes as its own handles list them), not the board other tenants' MIG devices share; a MIG list
// NVML could not read holds the start without blaming the instance.
import { describe, expect, it } from "vitest"
import type { Gpu, MigDevice } from "../../src/gen/cgn/agent/v1/agent.ts"
import { assignGpus, cudaEnv, engineFault, gateVerdict } from "../../src/services/node/Gpus.ts"
import { legacyMigRef, migRefProblem, missingMig, unreadMig } from "../../src/services/node/Mig.ts"
import { gpuWith } from "../../src/services/node/Nvml.ts"

const GiB = 2 ** 30
const MiB = 2 ** 20
const MINE = "MIG-11111111-aaaa-bbbb-cccc-000000000001"
const THEIRS = "MIG-11111111-aaaa-bbbb-cccc-000000000002"

const migDevice = (uuid: string, gi: number, usedBytes: number, extra: Partial<MigDevice> = {}): MigDevice => ({
  uuid,
  gpuInstanceId: gi,
  computeInstanceId: 0,
  memoryTotalBytes: 40 * GiB,
  memoryUsedBytes: usedBytes,
  unreportedFields: [],
  processes: [],
  ...extra
})

const p77 = { pid: 77, usedMemoryBytes: 0.1 * GiB, gpuInstanceId: 1, computeInstanceId: 0 }
const p500 = { pid: 500, usedMemoryBytes: 35 * GiB, gpuInstanceId: 2, computeInstanceId: 0 }

/**
 * GPU 0 whole; GPU 1 in MIG mode: my instance (GI 1) nearly empty, another tenant's (GI 2) holding 35 GiB. Each MIG
 * device lists its own processes (its handle's query); the board's list is every instance's together.
 */
const host = (mine: MigDevice = migDevice(MINE, 1, 0.1 * GiB, { processes: [p77] })) => [
  gpuWith({ index: 0, uuid: "GPU-a", memoryUsedBytes: 0.5 * GiB }),
  gpuWith({
    index: 1,
    uuid: "GPU-b",
    migEnabled: true,
    // the board's memory is every instance's together
    memoryUsedBytes: 35.1 * GiB,
    migDevices: [mine, migDevice(THEIRS, 2, 35 * GiB, { processes: [p500] })],
    processes: [p500, p77]
  })
]
/** host() with GPU 1 changed. */
const onGpu1 = (f: (g: Gpu) => Partial<Gpu>): Array<Gpu> => host().map((g) => (g.index === 1 ? { ...g, ...f(g) } : g))

describe("assignGpus with MIG", () => {
  it("a MIG device resolves to the GPU that lists it; CUDA_VISIBLE_DEVICES names the MIG device", () => {
    const a = assignGpus([MINE], 1, host())
    expect(a).toEqual({ _tag: "Assigned", indices: [1], automatic: false, mig: MINE })
    expect(cudaEnv([MINE], a)).toEqual({ CUDA_DEVICE_ORDER: "PCI_BUS_ID", CUDA_VISIBLE_DEVICES: MINE })
  })
  it("a MIG device no GPU lists is not on this host, saying which are", () => {
    const r = assignGpus(["MIG-nope"], 1, host())
    expect(r).toEqual({
      _tag: "Impossible",
      reason: `MIG device MIG-nope is not on this host (NVML lists ${MINE} on GPU 1, ${THEIRS} on GPU 1)`
    })
    expect(assignGpus(["MIG-nope"], 1, [gpuWith({ index: 0 })])).toEqual({
      _tag: "Impossible",
      reason: "MIG device MIG-nope is not on this host (NVML lists no MIG device: no GPU here is in MIG mode)"
    })
  })
  it("one MIG device per engine: two, one with a whole GPU, or one for tp x dp > 1 is refused, with or without NVML", () => {
    for (const gpus of [host(), []]) {
      const two = assignGpus([MINE, THEIRS], 2, gpus)
      expect(two._tag === "Impossible" && two.reason).toContain("lists 2 MIG devices")
      expect(two._tag === "Impossible" && two.reason).toContain("CUDA enumerates only one MIG device per process")
      const mixed = assignGpus([0, MINE], 2, gpus)
      expect(mixed._tag === "Impossible" && mixed.reason).toContain(`lists MIG device ${MINE} with whole GPUs`)
      const tp = assignGpus([MINE], 2, gpus)
      expect(tp._tag === "Impossible" && tp.reason).toContain("the engine needs tp x dp = 2")
    }
    expect(migRefProblem([0, 1], 2)).toBeUndefined()
    expect(migRefProblem([MINE], 1)).toBeUndefined()
  })
  it("automatic assignment skips a GPU in MIG mode, and says so when that leaves too few", () => {
    expect(assignGpus([], 1, host())).toEqual({ _tag: "Assigned", indices: [0], automatic: true })
    expect(assignGpus([], 2, host())).toEqual({
      _tag: "Impossible",
      reason:
        "the engine needs 2 GPUs (tp x dp) but this host has 1 usable of 2 (1 healthy); GPU 1 in MIG mode, not counted (CUDA cannot use a GPU in MIG mode whole: name one of its MIG devices in gpus)"
    })
  })
  it("a GPU in MIG mode named whole (index or UUID) is refused, listing its MIG devices", () => {
    for (const ref of [1, "GPU-b"]) {
      expect(assignGpus([ref], 1, host())).toEqual({
        _tag: "Impossible",
        reason: `GPU ${JSON.stringify(ref)} is in MIG mode, and CUDA cannot use a GPU in MIG mode whole (it enumerates its MIG devices instead: NVIDIA MIG User Guide, CUDA device enumeration): name one of its MIG devices instead (NVML lists ${MINE} on GPU 1, ${THEIRS} on GPU 1)`
      })
    }
    const a = assignGpus([0, 1], 2, host())
    expect(a._tag === "Impossible" && a.reason).toContain("GPU 1 is in MIG mode")
  })
  it("the MIG device name before R470 (MIG-GPU-<uuid>/<gi>/<ci>) resolves by its GPU and ids; CUDA gets NVML's name", () => {
    expect(legacyMigRef("MIG-GPU-b/1/0")).toEqual({ parent: "GPU-b", gi: 1, ci: 0 })
    expect(legacyMigRef(MINE)).toBeUndefined()
    const a = assignGpus(["MIG-GPU-b/1/0"], 1, host())
    expect(a).toEqual({ _tag: "Assigned", indices: [1], automatic: false, mig: MINE })
    expect(cudaEnv(["MIG-GPU-b/1/0"], a)).toEqual({ CUDA_DEVICE_ORDER: "PCI_BUS_ID", CUDA_VISIBLE_DEVICES: MINE })
    // another GPU's UUID, or ids no MIG device of that GPU has: not on this host
    expect(assignGpus(["MIG-GPU-a/1/0"], 1, host())._tag).toBe("Impossible")
    expect(assignGpus(["MIG-GPU-b/1/1"], 1, host())._tag).toBe("Impossible")
    // the gate finds it the same way
    expect(engineFault(host(), [1], undefined, "MIG-GPU-b/1/0")).toBeUndefined()
    const pgid = (pid: number) => (pid === 77 ? 70 : undefined)
    const v = gateVerdict(host(), [1], 1024 * MiB, new Set([70]), pgid, undefined, "MIG-GPU-b/1/0")
    expect(v._tag === "Held" && v.holders).toEqual([
      { gpu: 1, mig: MINE, pid: 77, bytes: 0.1 * GiB, previousRun: true }
    ])
  })
  it("automatic assignment skips a GPU whose MIG mode NVML could not read, saying so", () => {
    const gpus = [gpuWith({ index: 0, unreportedFields: ["mig_enabled", "mig_devices"] }), gpuWith({ index: 1 })]
    expect(assignGpus([], 1, gpus)).toEqual({ _tag: "Assigned", indices: [1], automatic: true })
    expect(assignGpus([], 2, gpus)).toEqual({
      _tag: "Impossible",
      reason:
        "the engine needs 2 GPUs (tp x dp) but this host has 1 usable of 2 (1 healthy); GPU 0 not counted: NVML could not read whether it is in MIG mode"
    })
  })
  it("a MIG list NVML could not read: the device is assigned to that GPU and held, not called destroyed", () => {
    const partial = onGpu1((g) => ({ migDevices: g.migDevices.slice(1), unreportedFields: ["mig_devices"] }))
    expect(assignGpus([MINE], 1, partial)).toEqual({ _tag: "Assigned", indices: [1], automatic: false, mig: MINE })
    expect(engineFault(partial, [1], undefined, MINE)).toBe(unreadMig(MINE, [1]))
    expect(unreadMig(MINE, [1])).toContain("NVML could not read GPU 1's MIG devices")
    // GPU 0's list unread too: the engine's own GPU is named, not every GPU whose list did not read
    const both = partial.map((g) => (g.index === 0 ? { ...g, unreportedFields: ["mig_devices"] } : g))
    expect(engineFault(both, [1], undefined, MINE)).toBe(unreadMig(MINE, [1]))
    expect(gateVerdict(partial, [1], 1024 * MiB, new Set(), () => undefined, undefined, MINE)).toEqual({
      _tag: "Faulty",
      reason: unreadMig(MINE, [1])
    })
    // the name before R470 only on its own GPU
    expect(engineFault(partial, [1], undefined, "MIG-GPU-b/1/0")).toBe(unreadMig("MIG-GPU-b/1/0", [1]))
    expect(assignGpus(["MIG-GPU-a/1/0"], 1, partial)._tag).toBe("Impossible")
  })
  it("whole GPUs and configured whole-GPU refs are as before", () => {
    expect(assignGpus([0], 1, host())).toEqual({ _tag: "Assigned", indices: [0], automatic: false })
    expect(cudaEnv([], { _tag: "Assigned", indices: [0, 2], automatic: true })).toEqual({
      CUDA_DEVICE_ORDER: "PCI_BUS_ID",
      CUDA_VISIBLE_DEVICES: "0,2"
    })
  })
})

describe("gateVerdict for a MIG device", () => {
  const none = new Set<number>()
  const noPgid = () => undefined
  it("judges the MIG device's memory, not the board's another tenant's instance fills", () => {
    expect(gateVerdict(host(), [1], 1024 * MiB, none, noPgid, undefined, MINE)).toEqual({ _tag: "Free" })
    // the same board judged whole is held by the other instance: what the gate did before
    expect(gateVerdict(host(), [1], 1024 * MiB, none, noPgid)._tag).toBe("Held")
  })
  it("held by its own instance's memory, naming only its GPU instance's processes", () => {
    // a second compute instance of my GPU instance shares its memory: its process is a holder too
    const p78 = { pid: 78, usedMemoryBytes: 19 * GiB, gpuInstanceId: 1, computeInstanceId: 1 }
    const gpus = host(migDevice(MINE, 1, 20 * GiB, { processes: [p77] })).map((g) =>
      g.index === 1
        ? {
            ...g,
            migDevices: [
              ...g.migDevices,
              migDevice(`${MINE}-ci1`, 1, 20 * GiB, { computeInstanceId: 1, processes: [p78] })
            ],
            processes: [...g.processes, p78]
          }
        : g
    )
    expect(gateVerdict(gpus, [1], 1024 * MiB, none, noPgid, undefined, MINE)).toEqual({
      _tag: "Held",
      reason: `MIG device ${MINE} (GPU 1) has 20.0 GiB in use (free below 1.0 GiB): pid 77 0.1 GiB on ${MINE}, pid 78 19.0 GiB on ${MINE}`,
      holders: [
        { gpu: 1, mig: MINE, pid: 77, bytes: 0.1 * GiB, previousRun: false },
        { gpu: 1, mig: MINE, pid: 78, bytes: 19 * GiB, previousRun: false }
      ]
    })
  })
  it("an earlier run's process on its instance holds the start; one on another instance does not", () => {
    const pgid = (pid: number) => (pid === 77 ? 70 : pid === 500 ? 50 : undefined)
    const mine = gateVerdict(host(), [1], 1024 * MiB, new Set([70]), pgid, undefined, MINE)
    expect(mine._tag === "Held" && mine.reason).toBe(
      `a process of an earlier engine run still holds GPU memory: pid 77 (earlier engine run) 0.1 GiB on ${MINE}`
    )
    expect(gateVerdict(host(), [1], 1024 * MiB, new Set([50]), pgid, undefined, MINE)).toEqual({ _tag: "Free" })
  })
  it("an earlier run's process on its instance holds the start with the board's process list refused", () => {
    // unprivileged (no mig/monitor capability): the GPU's aggregate list is refused, the MIG handle's own answers
    const blind = onGpu1(() => ({ processes: [], unreportedFields: ["processes"] }))
    const pgid = (pid: number) => (pid === 77 ? 70 : undefined)
    expect(gateVerdict(blind, [1], 1024 * MiB, new Set([70]), pgid, undefined, MINE)).toEqual({
      _tag: "Held",
      reason: `a process of an earlier engine run still holds GPU memory: pid 77 (earlier engine run) 0.1 GiB on ${MINE}`,
      holders: [{ gpu: 1, mig: MINE, pid: 77, bytes: 0.1 * GiB, previousRun: true }]
    })
    // the MIG device's own list unreported: the board's list, filtered to its GPU instance, stands in
    const own = onGpu1((g) => ({
      migDevices: [{ ...g.migDevices[0]!, processes: [], unreportedFields: ["processes"] }, g.migDevices[1]!]
    }))
    const v = gateVerdict(own, [1], 1024 * MiB, new Set([70]), pgid, undefined, MINE)
    expect(v._tag === "Held" && v.holders).toEqual([
      { gpu: 1, mig: MINE, pid: 77, bytes: 0.1 * GiB, previousRun: true }
    ])
  })
  it("with its own list unreported, the board's list gives every compute instance of its GPU instance: a sibling's process holds it too", () => {
    // compute instances of one GPU instance share its memory (Mig.ts holdsMigMemory); p78 runs on a sibling, CI 1
    const p78 = { pid: 78, usedMemoryBytes: 19 * GiB, gpuInstanceId: 1, computeInstanceId: 1 }
    const sibling = onGpu1((g) => ({
      processes: [p500, p78],
      migDevices: [{ ...g.migDevices[0]!, processes: [], unreportedFields: ["processes"] }, g.migDevices[1]!]
    }))
    const pgid = (pid: number) => (pid === 78 ? 70 : undefined)
    const v = gateVerdict(sibling, [1], 1024 * MiB, new Set([70]), pgid, undefined, MINE)
    expect(v._tag === "Held" && v.holders).toEqual([{ gpu: 1, mig: MINE, pid: 78, bytes: 19 * GiB, previousRun: true }])
    // and with the device's memory unreported as well, its bytes count as the MIG device's use
    const blind = onGpu1((g) => ({
      processes: [p500, p78],
      migDevices: [
        { ...g.migDevices[0]!, processes: [], unreportedFields: ["processes", "memory_used_bytes"] },
        g.migDevices[1]!
      ]
    }))
    const held = gateVerdict(blind, [1], 1024 * MiB, new Set(), () => undefined, undefined, MINE)
    expect(held._tag === "Held" && held.reason).toContain("19.0 GiB")
  })
  it("memory NVML cannot report for the MIG device: its GPU instance's processes stand in", () => {
    const memUnknown = ["memory_total_bytes", "memory_used_bytes"]
    const unknown = migDevice(MINE, 1, 0, { unreportedFields: memUnknown, processes: [p77] })
    expect(gateVerdict(host(unknown), [1], 1024 * MiB, none, noPgid, undefined, MINE)).toEqual({ _tag: "Free" })
    const big = migDevice(MINE, 1, 0, {
      unreportedFields: memUnknown,
      processes: [{ ...p77, usedMemoryBytes: 2 * GiB }]
    })
    const held = gateVerdict(host(big), [1], 1024 * MiB, none, noPgid, undefined, MINE)
    expect(held._tag === "Held" && held.reason).toContain(`MIG device ${MINE} (GPU 1)'s processes hold 2.0 GiB`)
    // neither its own list nor the board's
    const noLists = migDevice(MINE, 1, 0, { unreportedFields: [...memUnknown, "processes"] })
    const blind = host(noLists).map((g) => (g.index === 1 ? { ...g, unreportedFields: ["processes"] } : g))
    const v = gateVerdict(blind, [1], 1024 * MiB, none, noPgid, undefined, MINE)
    expect(v._tag === "Held" && v.reason).toContain(`MIG device ${MINE} (GPU 1)'s memory use is unknown`)
  })
  it("a process whose memory NVML cannot say (N/A, read as 0) makes the MIG device's use unknown, not free", () => {
    const na = migDevice(MINE, 1, 0, {
      unreportedFields: ["memory_total_bytes", "memory_used_bytes"],
      processes: [{ ...p77, usedMemoryBytes: 0 }]
    })
    expect(gateVerdict(host(na), [1], 1024 * MiB, none, noPgid, undefined, MINE)).toEqual({
      _tag: "Held",
      reason: `MIG device ${MINE} (GPU 1)'s memory use is unknown (NVML reports neither its memory nor what pid 77 on it holds): it cannot be judged free`,
      holders: [{ gpu: 1, mig: MINE, pid: 77, bytes: 0, previousRun: false }]
    })
  })
  it("a MIG device gone from the sample (instance destroyed) waits, naming it; the board's faults are its faults", () => {
    const gone = onGpu1((g) => ({ migDevices: g.migDevices.slice(1) }))
    expect(gateVerdict(gone, [1], 1024 * MiB, none, noPgid, undefined, MINE)).toEqual({
      _tag: "Faulty",
      reason: missingMig(MINE, 1)
    })
    expect(missingMig(MINE, 1)).toContain(`MIG device ${MINE} is not in NVML's list of GPU 1's MIG devices`)
    expect(engineFault(gone, [1], undefined, MINE)).toBe(missingMig(MINE, 1))
    const ecc = host().map((g) => (g.index === 1 ? { ...g, eccUncorrected: 2 } : g))
    expect(gateVerdict(ecc, [1], 1024 * MiB, none, noPgid, undefined, MINE)).toEqual({
      _tag: "Faulty",
      reason: "GPU 1 has 2 uncorrected ECC errors"
    })
    const lost = [host()[0]!, gpuWith({ index: 1, lost: true })]
    expect(engineFault(lost, [1], undefined, MINE)).toContain("GPU 1 is lost")
    expect(engineFault(host(), [1], undefined, MINE)).toBeUndefined()
  })
})
