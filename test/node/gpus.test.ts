// The pure GPU decisions (services/node/Gpus.ts, Throttle.ts): throttle reason names, assignment, CUDA env, the gate's verdict.
import { describe, expect, it } from "vitest"
import { gateProblem } from "../../src/services/engine/GpuGate.ts"
import { assignGpus, cudaEnv, gateVerdict, gpuFault, missingGpu, unlistedRef } from "../../src/services/node/Gpus.ts"
import { gpuWith } from "../../src/services/node/Nvml.ts"
import { throttleReasonNames, throttleReasons } from "../../src/services/node/Throttle.ts"

const GiB = 2 ** 30
const host = [
  gpuWith({ index: 0, uuid: "GPU-a", memoryUsedBytes: 0.5 * GiB }),
  gpuWith({ index: 1, uuid: "GPU-b", memoryUsedBytes: 0.5 * GiB, eccUncorrected: 2 }),
  gpuWith({ index: 2, uuid: "GPU-c", memoryUsedBytes: 0.5 * GiB }),
  gpuWith({ index: 3, lost: true })
]

describe("throttleReasons", () => {
  it("names each set bit (nvml.h nvmlClocksEventReason*), leaving out gpu_idle", () => {
    expect(throttleReasons(0)).toEqual([])
    expect(throttleReasons(0x1)).toEqual([])
    expect(throttleReasons(0x4 | 0x40)).toEqual(["sw_power_cap", "hw_thermal_slowdown"])
    // koffi hands 64-bit values as bigint when they do not fit a double exactly
    expect(throttleReasons(0x8000000000000008n)).toEqual(["hw_slowdown"])
  })

  it("names every bit of nvml.h's table, and the metric's label set is that table", () => {
    // nvml.h: nvmlClocksEventReason* (nvmlClocksThrottleReason* before), GpuIdle 0x1 left out
    const table: ReadonlyArray<readonly [number, string]> = [
      [0x2, "applications_clocks_setting"],
      [0x4, "sw_power_cap"],
      [0x8, "hw_slowdown"],
      [0x10, "sync_boost"],
      [0x20, "sw_thermal_slowdown"],
      [0x40, "hw_thermal_slowdown"],
      [0x80, "hw_power_brake_slowdown"],
      [0x100, "display_clock_setting"]
    ]
    for (const [bit, name] of table) expect(throttleReasons(bit), `bit 0x${bit.toString(16)}`).toEqual([name])
    expect(throttleReasonNames).toEqual(table.map(([, name]) => name))
    expect(throttleReasons(0x1ff)).toEqual(table.map(([, name]) => name))
    // a bit outside the table is no reason
    expect(throttleReasons(0x200 | 0x400 | 0x800)).toEqual([])
  })
})

describe("gpuFault", () => {
  it("a lost GPU and uncorrected ECC errors are faults; throttling is not", () => {
    expect(gpuFault(host[3]!)).toContain("lost")
    expect(gpuFault(host[1]!)).toBe("GPU 1 has 2 uncorrected ECC errors")
    expect(gpuFault(gpuWith({ index: 0, throttleReasons: ["hw_slowdown"] }))).toBeUndefined()
  })

  // dynamic page retirement (V100, T4): what row remapping is on A100 and later
  it("a pending page retirement is a fault until a reset, as a pending row remapping; unsupported, it is none", () => {
    const pending = gpuWith({ index: 2, retiredPagesPending: true })
    expect(gpuFault(pending)).toBe("GPU 2 has retired memory pages pending: it needs a GPU reset or a reboot")
    // the double-bit ECC error that marked the page says more, and a pending row remapping comes first as before
    expect(gpuFault({ ...pending, eccUncorrected: 1 })).toBe("GPU 2 has 1 uncorrected ECC errors")
    expect(gpuFault({ ...pending, rowRemapPending: true })).toContain("row remapping pending")
    expect(gpuFault(gpuWith({ index: 2, unreportedFields: ["retired_pages_pending"] }))).toBeUndefined()
    // no new run on it: automatic assignment skips it, and the gate holds a start on it
    const gpus = [gpuWith({ index: 0 }), pending, gpuWith({ index: 1 })]
    expect(assignGpus([], 2, gpus)).toEqual({ _tag: "Assigned", indices: [0, 1], automatic: true })
    expect(gateVerdict(gpus, [2], 2 ** 30, new Set(), () => undefined)).toEqual({
      _tag: "Faulty",
      reason: "GPU 2 has retired memory pages pending: it needs a GPU reset or a reboot"
    })
  })
})

describe("assignGpus", () => {
  it("automatic: the first tp x dp healthy GPUs in index order, skipping faulty ones", () => {
    expect(assignGpus([], 2, host)).toEqual({ _tag: "Assigned", indices: [0, 2], automatic: true })
  })
  it("automatic: faulty GPUs (a lost one too) fill in when too few are healthy: the gate holds the engine on them", () => {
    const ecc = "GPU 1 has 2 uncorrected ECC errors"
    const lost = "GPU 3 is lost (NVML_ERROR_GPU_IS_LOST: fallen off the bus)"
    // the faults it took come with the choice (check and run say them)
    expect(assignGpus([], 3, host)).toEqual({ _tag: "Assigned", indices: [0, 1, 2], automatic: true, faults: [ecc] })
    expect(assignGpus([], 4, host)).toEqual({
      _tag: "Assigned",
      indices: [0, 1, 2, 3],
      automatic: true,
      faults: [ecc, lost]
    })
    // a one-GPU host whose GPU has a fault: assigned, not refused (the agent stays up, the node unhealthy)
    const faulty = [gpuWith({ index: 0, eccUncorrected: 1 })]
    expect(assignGpus([], 1, faulty)).toEqual({
      _tag: "Assigned",
      indices: [0],
      automatic: true,
      faults: ["GPU 0 has 1 uncorrected ECC errors"]
    })
    expect(gateVerdict(faulty, [0], 2 ** 30, new Set(), () => undefined)._tag).toBe("Faulty")
  })
  it("automatic: a lost GPU as NVML reports it (MIG mode unreadable, Xid 79) fills in too: the agent is not refused", () => {
    // Gpus.ts: "A lost one is (its MIG mode unreadable because it fell off the bus): it is the host's GPU, with a
    // fault." nvmlSample's shape for it: every field but index and lost unreported (nvml-sample.test.ts LOST_UNKNOWN).
    const lost = gpuWith({
      index: 1,
      uuid: "",
      lost: true,
      criticalXids: [{ xid: 79, events: 1 }],
      unreportedFields: ["name", "uuid", "memory_total_bytes", "memory_used_bytes", "mig_enabled", "mig_devices"]
    })
    expect(assignGpus([], 2, [gpuWith({ index: 0, uuid: "GPU-a" }), lost])).toEqual({
      _tag: "Assigned",
      indices: [0, 1],
      automatic: true,
      faults: ["GPU 1 is lost (NVML_ERROR_GPU_IS_LOST: fallen off the bus)"]
    })
  })
  it("automatic: refuses a tp x dp the host cannot hold, saying how many it has and how many are healthy", () => {
    expect(assignGpus([], 5, host)).toEqual({
      _tag: "Impossible",
      reason: "the engine needs 5 GPUs (tp x dp) but this host has 4 usable of 4 (2 healthy)"
    })
  })
  it("configured: indices and UUIDs resolve to NVML indices; an unknown one is refused", () => {
    expect(assignGpus([2, "GPU-a"], 2, host)).toEqual({ _tag: "Assigned", indices: [2, 0], automatic: false })
    const r = assignGpus([7], 1, host)
    expect(r._tag).toBe("Impossible")
    expect(r._tag === "Impossible" && r.reason).toContain("GPU 7 is not on this host")
  })
  it("configured: one GPU named twice, by its index and by its UUID, is refused (CUDA_VISIBLE_DEVICES=0,0 otherwise)", () => {
    expect(assignGpus([0, "GPU-a"], 2, host)).toEqual({
      _tag: "Impossible",
      reason: 'GPU 0 is listed twice (also as "GPU-a")'
    })
  })
  it("configured: a UUID NVML cannot match while some GPU's UUID is unreadable (lost) is not refused; the gate holds it", () => {
    const lostAtOpen = [gpuWith({ index: 0, uuid: "GPU-a" }), gpuWith({ index: 1, uuid: "", lost: true })]
    expect(assignGpus(["GPU-b"], 1, lostAtOpen)).toEqual({ _tag: "Unknown" })
    expect(cudaEnv(["GPU-b"], { _tag: "Unknown" })).toEqual({ CUDA_VISIBLE_DEVICES: "GPU-b" })
    expect(cudaEnv([0, "GPU-b"], { _tag: "Unknown" })).toEqual({
      CUDA_DEVICE_ORDER: "PCI_BUS_ID",
      CUDA_VISIBLE_DEVICES: "0,GPU-b"
    })
    expect(unlistedRef(["GPU-b"], lostAtOpen)).toBe(
      `GPU "GPU-b" is not among the GPUs NVML lists (NVML cannot read GPU 1's UUID: lost?): the engine waits until it is`
    )
    // listed again: nothing holds it
    expect(unlistedRef(["GPU-b"], [...lostAtOpen.slice(0, 1), gpuWith({ index: 1, uuid: "GPU-b" })])).toBeUndefined()
    // every UUID readable: a UUID the host does not have is still refused
    expect(assignGpus(["GPU-z"], 1, host.slice(0, 3))._tag).toBe("Impossible")
  })
  it("without NVML: configured indices are taken on trust, UUIDs go through as written, nothing is automatic", () => {
    expect(assignGpus([1, 0], 2, [])).toEqual({ _tag: "Assigned", indices: [1, 0], automatic: false })
    expect(assignGpus(["GPU-x"], 1, [])).toEqual({ _tag: "Unknown" })
    expect(assignGpus([], 4, [])).toEqual({ _tag: "Unknown" })
  })
})

describe("cudaEnv", () => {
  it("gives indices in PCI bus order, so CUDA and NVML count alike", () => {
    expect(cudaEnv([], { _tag: "Assigned", indices: [0, 2], automatic: true })).toEqual({
      CUDA_DEVICE_ORDER: "PCI_BUS_ID",
      CUDA_VISIBLE_DEVICES: "0,2"
    })
    expect(cudaEnv(["GPU-x"], { _tag: "Unknown" })).toEqual({ CUDA_VISIBLE_DEVICES: "GPU-x" })
    expect(cudaEnv([], { _tag: "Unknown" })).toEqual({})
  })
})

describe("gateVerdict", () => {
  const MiB = 2 ** 20
  const none = new Set<number>()
  const noPgid = () => undefined
  it("free: every engine GPU under the threshold and no leftover of an earlier run", () => {
    expect(gateVerdict(host, [0, 2], 1024 * MiB, none, noPgid)).toEqual({ _tag: "Free" })
  })
  // README engine.gpu_free_below_mib: "until each of the engine's GPUs has at most this many MiB in use"
  it("free at exactly the threshold, held one byte over it", () => {
    const at = (bytes: number) => [gpuWith({ index: 0, memoryUsedBytes: bytes, processes: [] })]
    expect(gateVerdict(at(1024 * MiB), [0], 1024 * MiB, none, noPgid)).toEqual({ _tag: "Free" })
    expect(gateVerdict(at(1024 * MiB + 1), [0], 1024 * MiB, none, noPgid)._tag).toBe("Held")
  })
  it("held: memory over the threshold, naming the pids and bytes", () => {
    const gpus = [
      gpuWith({ index: 0, memoryUsedBytes: 70 * GiB, processes: [{ pid: 4242, usedMemoryBytes: 69.5 * GiB }] })
    ]
    const v = gateVerdict(gpus, [0], 1024 * MiB, none, noPgid)
    expect(v).toEqual({
      _tag: "Held",
      reason: "GPU 0 has 70.0 GiB in use (free below 1.0 GiB): pid 4242 69.5 GiB on GPU 0",
      holders: [{ gpu: 0, pid: 4242, bytes: 69.5 * GiB, previousRun: false }]
    })
  })
  it("held: a process of an earlier run still on the GPU, even under the threshold", () => {
    const gpus = [
      gpuWith({ index: 0, memoryUsedBytes: 0.2 * GiB, processes: [{ pid: 77, usedMemoryBytes: 0.2 * GiB }] })
    ]
    const v = gateVerdict(gpus, [0], 1024 * MiB, new Set([70]), (pid) => (pid === 77 ? 70 : undefined))
    expect(v._tag).toBe("Held")
    expect(v._tag === "Held" && v.reason).toBe(
      "a process of an earlier engine run still holds GPU memory: pid 77 (earlier engine run) 0.2 GiB on GPU 0"
    )
  })
  it("an engine GPU missing from NVML's list is a fault, not free (its handle query failed)", () => {
    const gpus = [gpuWith({ index: 0 }), gpuWith({ index: 2 })]
    expect(gateVerdict(gpus, [0, 1], 1024 * MiB, none, noPgid)).toEqual({ _tag: "Faulty", reason: missingGpu(1) })
    expect(gateVerdict([], [0], 1024 * MiB, none, noPgid)).toEqual({ _tag: "Faulty", reason: missingGpu(0) })
    expect(gateVerdict(gpus, [0, 2], 1024 * MiB, none, noPgid)).toEqual({ _tag: "Free" })
  })
  const MEMORY_UNKNOWN = ["memory_total_bytes", "memory_used_bytes", "memory_free_bytes"]
  it("memory NVML cannot report is not 0: the listed processes' memory stands in (unified-memory boards)", () => {
    const board = (processes: Array<{ pid: number; usedMemoryBytes: number }>) => [
      gpuWith({ index: 0, unreportedFields: MEMORY_UNKNOWN, processes })
    ]
    expect(gateVerdict(board([{ pid: 9, usedMemoryBytes: 0.5 * GiB }]), [0], 1024 * MiB, none, noPgid)).toEqual({
      _tag: "Free"
    })
    expect(gateVerdict(board([]), [0], 1024 * MiB, none, noPgid)).toEqual({ _tag: "Free" })
    // a process whose memory NVML does not have (N/A, read as 0) is not taken as holding none
    const na = gateVerdict(board([{ pid: 9, usedMemoryBytes: 0 }]), [0], 1024 * MiB, none, noPgid)
    expect(na).toMatchObject({ _tag: "Held", reason: expect.stringContaining("what pid 9 on it holds") })
    expect(gateVerdict(board([{ pid: 9, usedMemoryBytes: 40 * GiB }]), [0], 1024 * MiB, none, noPgid)).toEqual({
      _tag: "Held",
      reason:
        "GPU 0's processes hold 40.0 GiB (NVML reports no memory use for it; free below 1.0 GiB): pid 9 40.0 GiB on GPU 0",
      holders: [{ gpu: 0, pid: 9, bytes: 40 * GiB, previousRun: false }]
    })
  })
  it("held: a GPU whose memory and processes NVML both cannot report cannot be judged free, and says so", () => {
    const gpus = [
      gpuWith({ index: 0, unreportedFields: [...MEMORY_UNKNOWN, "processes"] }),
      gpuWith({ index: 1, memoryUsedBytes: 0.5 * GiB })
    ]
    const reason =
      "GPU 0's memory use is unknown (NVML reports neither its memory nor its processes): it cannot be judged free"
    expect(gateVerdict(gpus, [0, 1], 1024 * MiB, none, noPgid)).toEqual({ _tag: "Held", reason, holders: [] })
    expect(gateVerdict(gpus, [1], 1024 * MiB, none, noPgid)).toEqual({ _tag: "Free" })
    // with another GPU held as well, both are said
    const full = [...gpus, gpuWith({ index: 2, memoryUsedBytes: 70 * GiB })]
    expect(gateVerdict(full, [0, 2], 1024 * MiB, none, noPgid)).toEqual({
      _tag: "Held",
      reason: `GPU 2 has 70.0 GiB in use (free below 1.0 GiB): no process is listed (held by the driver or another container); ${reason}`,
      holders: []
    })
  })
  it("ECC that NVML cannot count (ECC off) is no fault", () => {
    const gpu = gpuWith({ index: 0, unreportedFields: ["ecc_uncorrected"] })
    expect(gpuFault(gpu)).toBeUndefined()
    expect(gateVerdict([gpu], [0], 1024 * MiB, none, noPgid)).toEqual({ _tag: "Free" })
  })
  it("other GPUs do not count; a faulty engine GPU does", () => {
    const gpus = [gpuWith({ index: 0 }), gpuWith({ index: 1, memoryUsedBytes: 80 * GiB })]
    expect(gateVerdict(gpus, [0], 1024 * MiB, none, noPgid)).toEqual({ _tag: "Free" })
    expect(gateVerdict(host, [3], 1024 * MiB, none, noPgid)._tag).toBe("Faulty")
  })
})

describe("gateProblem", () => {
  it("a fault at once; a wait only once it is overdue", () => {
    const waiting = { since: 0, reason: "held", holders: [], overdue: false }
    expect(gateProblem({ gpus: [0], waiting, fault: undefined })).toBeUndefined()
    expect(gateProblem({ gpus: [0], waiting: { ...waiting, overdue: true }, fault: undefined })).toBe(
      "waiting for GPU memory: held"
    )
    expect(gateProblem({ gpus: [0], waiting: undefined, fault: "GPU 0 is lost" })).toBe("GPU 0 is lost")
  })
})
