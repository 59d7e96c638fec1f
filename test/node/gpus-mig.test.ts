// The pure GPU decisions with MIG (services/node/Gpus.ts, Mig.ts): a MIG device resolves to the GPU that lists it,
// one MIG device per engine, automatic assignment skips GPUs in MIG mode, and the gate judges the MIG device (its
// memory, its GPU instance's processes), not the board other tenants' MIG devices share.
import { describe, expect, it } from "vitest"
import type { MigDevice } from "../../src/gen/cgn/agent/v1/agent.ts"
import { assignGpus, cudaEnv, engineFault, gateVerdict } from "../../src/services/node/Gpus.ts"
import { migRefProblem, missingMig } from "../../src/services/node/Mig.ts"
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
  ...extra
})

/** GPU 0 whole; GPU 1 in MIG mode: my instance (GI 1) nearly empty, another tenant's (GI 2) holding 35 GiB. */
const host = (mine: MigDevice = migDevice(MINE, 1, 0.1 * GiB)) => [
  gpuWith({ index: 0, uuid: "GPU-a", memoryUsedBytes: 0.5 * GiB }),
  gpuWith({
    index: 1,
    uuid: "GPU-b",
    migEnabled: true,
    // the board's memory is every instance's together
    memoryUsedBytes: 35.1 * GiB,
    migDevices: [mine, migDevice(THEIRS, 2, 35 * GiB)],
    processes: [
      { pid: 500, usedMemoryBytes: 35 * GiB, gpuInstanceId: 2, computeInstanceId: 0 },
      { pid: 77, usedMemoryBytes: 0.1 * GiB, gpuInstanceId: 1, computeInstanceId: 0 }
    ]
  })
]

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
        "the engine needs 2 GPUs (tp x dp) but this host has 1 healthy of 2; GPU 1 in MIG mode, not counted (CUDA cannot use a GPU in MIG mode whole: name one of its MIG devices in gpus)"
    })
  })
  it("whole GPUs and configured whole-GPU refs are as before", () => {
    expect(assignGpus([1], 1, host())).toEqual({ _tag: "Assigned", indices: [1], automatic: false })
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
    const gpus = host(migDevice(MINE, 1, 20 * GiB)).map((g) =>
      g.index === 1
        ? {
            ...g,
            processes: [...g.processes, { pid: 78, usedMemoryBytes: 19 * GiB, gpuInstanceId: 1, computeInstanceId: 1 }]
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
  it("memory NVML cannot report for the MIG device: its GPU instance's processes stand in", () => {
    const unknown = migDevice(MINE, 1, 0, { unreportedFields: ["memory_total_bytes", "memory_used_bytes"] })
    expect(gateVerdict(host(unknown), [1], 1024 * MiB, none, noPgid, undefined, MINE)).toEqual({ _tag: "Free" })
    const blind = host(unknown).map((g) => (g.index === 1 ? { ...g, unreportedFields: ["processes"] } : g))
    const v = gateVerdict(blind, [1], 1024 * MiB, none, noPgid, undefined, MINE)
    expect(v._tag === "Held" && v.reason).toContain(`MIG device ${MINE} (GPU 1)'s memory use is unknown`)
  })
  it("a MIG device gone from the sample (instance destroyed) waits, naming it; the board's faults are its faults", () => {
    const gone = host().map((g) => (g.index === 1 ? { ...g, migDevices: g.migDevices.slice(1) } : g))
    expect(gateVerdict(gone, [1], 1024 * MiB, none, noPgid, undefined, MINE)).toEqual({
      _tag: "Faulty",
      reason: missingMig(MINE, 1)
    })
    expect(missingMig(MINE, 1)).toContain(MINE)
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
