// One NVML pass (layers/node/nvmlSample.ts) over a Binding faked in JS, for what the C fake cannot script: entry
// points missing from the driver, a GPU lost half-way through its queries, and a call that throws out of the FFI;
// and which fields each failure leaves unknown (`unreportedFields`).
import { describe, expect, it } from "vitest"
import type { Binding } from "../../src/layers/node/nvmlBinding.ts"
import { xidWatch } from "../../src/layers/node/nvmlEvents.ts"
import { sample as samplePass } from "../../src/layers/node/nvmlSample.ts"
import { gpuWith } from "../../src/services/node/Nvml.ts"
import { fakeBinding } from "../support/nvmlBinding.ts"

const NOT_SUPPORTED = 3
const GPU_IS_LOST = 15

/** One pass as the worker makes it: with the session's Xid watch (fresh here: no Xid seen). */
const sample = (binding: Binding, problems: Set<string>) =>
  samplePass(binding, problems, (why) => problems.add(why), xidWatch(binding))

/** What a lost GPU lists in `unreportedFields`: everything but index and lost (proto field-number order). */
const LOST_UNKNOWN = [
  "name",
  "uuid",
  "memory_total_bytes",
  "memory_used_bytes",
  "utilization_percent",
  "memory_free_bytes",
  "temperature_celsius",
  "power_watts",
  "power_limit_watts",
  "throttle_reasons",
  "ecc_uncorrected",
  "processes",
  "critical_xids",
  "row_remap_pending",
  "row_remap_failure",
  "retired_pages_pending",
  "mig_enabled",
  "mig_devices"
]

const healthy = (index: number, uuid: string) =>
  gpuWith({
    index,
    name: "Fake GPU",
    uuid,
    memoryTotalBytes: 80 * 2 ** 30,
    memoryUsedBytes: 2 ** 30,
    memoryFreeBytes: 79 * 2 ** 30,
    utilizationPercent: 40,
    temperatureCelsius: 60,
    powerWatts: 250,
    powerLimitWatts: 700
  })

describe("one NVML sample", () => {
  it("keeps a GPU whose board supports none of power, temperature, ECC, throttling, Xids, row remapping, page retirement", () => {
    const problems = new Set<string>()
    const gpus = sample(
      fakeBinding([
        { uuid: "GPU-a" },
        {
          uuid: "GPU-b",
          rc: {
            power: NOT_SUPPORTED,
            powerLimit: NOT_SUPPORTED,
            temperature: NOT_SUPPORTED,
            ecc: NOT_SUPPORTED,
            throttle: NOT_SUPPORTED,
            processes: NOT_SUPPORTED,
            remappedRows: NOT_SUPPORTED,
            retiredPagesPending: NOT_SUPPORTED
          },
          // no Xid critical-error events (0x8) on this board
          eventTypes: 0x3n
        }
      ]),
      problems
    )
    expect(gpus).toEqual([
      healthy(0, "GPU-a"),
      {
        ...healthy(1, "GPU-b"),
        temperatureCelsius: 0,
        powerWatts: 0,
        powerLimitWatts: 0,
        // zeros that mean unknown, said so: not 0 C, not 0 W, not "no throttling", not "no ECC error"
        unreportedFields: [
          "temperature_celsius",
          "power_watts",
          "power_limit_watts",
          "throttle_reasons",
          "ecc_uncorrected",
          "processes",
          "critical_xids",
          "row_remap_pending",
          "row_remap_failure",
          "retired_pages_pending"
        ]
      }
    ])
    expect([...problems]).toEqual([]) // NOT_SUPPORTED is the board's nature, not a problem to log
  })

  it("a field whose entry point this driver lacks is unknown, silently (an old driver is no problem to log)", () => {
    const problems = new Set<string>()
    const binding = fakeBinding([{ uuid: "GPU-a" }])
    const gpus = sample(
      {
        ...binding,
        temperature: undefined,
        power: undefined,
        throttle: undefined,
        processes: undefined,
        remappedRows: undefined,
        retiredPagesPending: undefined,
        events: undefined
      },
      problems
    )
    expect(gpus).toEqual([
      {
        ...healthy(0, "GPU-a"),
        temperatureCelsius: 0,
        powerWatts: 0,
        unreportedFields: [
          "temperature_celsius",
          "power_watts",
          "throttle_reasons",
          "processes",
          "critical_xids",
          "row_remap_pending",
          "row_remap_failure",
          "retired_pages_pending"
        ]
      }
    ])
    expect([...problems]).toEqual([])
  })

  it("reads a pending page retirement (a V100: row remapping NOT_SUPPORTED there); a failed query is a problem", () => {
    const problems = new Set<string>()
    const gpus = sample(
      fakeBinding([
        { uuid: "GPU-a", retiredPagesPending: true, rc: { remappedRows: NOT_SUPPORTED } },
        { uuid: "GPU-b", rc: { retiredPagesPending: 999 } }
      ]),
      problems
    )
    expect(gpus).toEqual([
      {
        ...healthy(0, "GPU-a"),
        retiredPagesPending: true,
        unreportedFields: ["row_remap_pending", "row_remap_failure"]
      },
      { ...healthy(1, "GPU-b"), unreportedFields: ["retired_pages_pending"] }
    ])
    expect([...problems]).toEqual(["nvmlDeviceGetRetiredPagesPendingStatus(1): NVML_ERROR_UNKNOWN (999)"])
  })

  it("memory that NVML cannot report (unified-memory boards) leaves all three memory fields unknown", () => {
    const gpus = sample(fakeBinding([{ uuid: "GPU-a", rc: { memory: NOT_SUPPORTED } }]), new Set())
    expect(gpus).toEqual([
      {
        ...healthy(0, "GPU-a"),
        memoryTotalBytes: 0,
        memoryUsedBytes: 0,
        memoryFreeBytes: 0,
        unreportedFields: ["memory_total_bytes", "memory_used_bytes", "memory_free_bytes"]
      }
    ])
  })

  it("an empty process list is an answer, not an unknown; a failed name or UUID is unknown", () => {
    const problems = new Set<string>()
    const gpus = sample(fakeBinding([{ uuid: "GPU-a", rc: { name: 999, uuid: NOT_SUPPORTED } }]), problems)
    expect(gpus).toEqual([{ ...healthy(0, "GPU-a"), name: "", uuid: "", unreportedFields: ["name", "uuid"] }])
    expect([...problems]).toEqual(["nvmlDeviceGetName(0): NVML_ERROR_UNKNOWN (999)"])
  })

  it("a GPU lost half-way through its queries is reported lost; the others are untouched", () => {
    const problems = new Set<string>()
    const gpus = sample(fakeBinding([{ uuid: "GPU-a", rc: { memory: GPU_IS_LOST } }, { uuid: "GPU-b" }]), problems)
    // a lost GPU reports nothing: every field is unknown (the main thread names it from earlier samples)
    expect(gpus).toEqual([gpuWith({ index: 0, lost: true, unreportedFields: [...LOST_UNKNOWN] }), healthy(1, "GPU-b")])
    expect([...problems]).toEqual([])
  })

  it("a query that fails otherwise leaves that field zero and is reported, naming the GPU", () => {
    const problems = new Set<string>()
    const gpus = sample(fakeBinding([{ uuid: "GPU-a", rc: { utilization: 999 } }]), problems)
    expect(gpus).toEqual([{ ...healthy(0, "GPU-a"), utilizationPercent: 0, unreportedFields: ["utilization_percent"] }])
    expect([...problems]).toEqual(["nvmlDeviceGetUtilizationRates(0): NVML_ERROR_UNKNOWN (999)"])
  })

  it("a call that throws costs that GPU's record for the pass, not the sample", () => {
    const problems = new Set<string>()
    const gpus = sample(fakeBinding([{ uuid: "GPU-a", throws: ["power"] }, { uuid: "GPU-b" }]), problems)
    expect(gpus).toEqual([healthy(1, "GPU-b")])
    expect([...problems]).toEqual(["GPU 0: NVML call threw: power: unexpected value"])
  })
})

/**
 * nvmlDeviceGetComputeRunningProcesses_v3 as NVML answers its two-call protocol: asked with no list (or too short a
 * one), INSUFFICIENT_SIZE (7) and the count; else the list. `running(n)` is how many processes run at call n;
 * `firstRc` replaces the first call's answer.
 */
const processCalls = (running: (call: number) => number, firstRc?: number): Binding["processes"] => {
  let calls = 0
  return (_device, count, infos) => {
    const call = calls++
    if (call === 0 && firstRc !== undefined) return firstRc
    const n = running(call)
    if (infos === null || (count[0] ?? 0) < n) {
      count[0] = n
      return n === 0 ? 0 : 7
    }
    for (let i = 0; i < n; i++)
      Object.assign(infos[i] as object, {
        pid: 100 + i,
        usedGpuMemory: 2 ** 20,
        gpuInstanceId: 0xffffffff,
        computeInstanceId: 0xffffffff
      })
    count[0] = n
    return 0
  }
}

describe("one NVML sample: the GPU's compute processes", () => {
  const withProcesses = (processes: Binding["processes"]) => ({ ...fakeBinding([{ uuid: "GPU-a" }]), processes })

  it("processes started between the count and the list are listed: the list has room for a few more", () => {
    const problems = new Set<string>()
    // one process at the count, three by the list
    const gpus = sample(withProcesses(processCalls((call) => (call === 0 ? 1 : 3))), problems)
    const listed = [100, 101, 102].map((pid) => ({ pid, usedMemoryBytes: 2 ** 20 }))
    expect(gpus).toEqual([{ ...healthy(0, "GPU-a"), processes: listed }])
    expect([...problems]).toEqual([])
  })

  it("a count that fails is unknown and reported under the call's name; GPU_IS_LOST there marks the GPU lost", () => {
    const problems = new Set<string>()
    const gpus = sample(withProcesses(processCalls(() => 1, 999)), problems)
    expect(gpus).toEqual([{ ...healthy(0, "GPU-a"), unreportedFields: ["processes"] }])
    expect([...problems]).toEqual(["nvmlDeviceGetComputeRunningProcesses_v3(0): NVML_ERROR_UNKNOWN (999)"])
    const lost = sample(withProcesses(processCalls(() => 1, GPU_IS_LOST)), new Set())
    expect(lost).toEqual([gpuWith({ index: 0, lost: true, unreportedFields: [...LOST_UNKNOWN] })])
  })
})
