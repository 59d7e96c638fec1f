// One NVML pass (layers/node/nvmlSample.ts) over a Binding faked in JS, for what the C fake cannot script: entry
// points missing from the driver, a GPU lost half-way through its queries, and a call that throws out of the FFI;
// and which fields each failure leaves unknown (`unreportedFields`).
import { describe, expect, it } from "vitest"
import type { Binding } from "../../src/layers/node/nvmlBinding.ts"
import { sample } from "../../src/layers/node/nvmlSample.ts"
import { gpuWith } from "../../src/services/node/Nvml.ts"

const NOT_SUPPORTED = 3
const GPU_IS_LOST = 15

interface FakeGpu {
  readonly uuid: string
  /** Return code per entry point (by Binding key); absent: success. */
  readonly rc?: Partial<Record<keyof Binding, number>>
  /** Entry points that throw, as koffi does on a value it cannot convert. */
  readonly throws?: ReadonlyArray<keyof Binding>
}

const fakeBinding = (gpus: ReadonlyArray<FakeGpu>): Binding => {
  const answer = (key: keyof Binding, device: unknown, fill: () => void): number => {
    const g = gpus[device as number]
    if (g === undefined) return 2
    if (g.throws?.includes(key)) throw new TypeError(`${String(key)}: unexpected value`)
    const rc = g.rc?.[key] ?? 0
    if (rc === 0) fill()
    return rc
  }
  const put = (buf: Uint8Array, text: string) => buf.set(new TextEncoder().encode(`${text}\0`))
  return {
    init: () => 0,
    shutdown: () => 0,
    count: (out) => {
      out[0] = gpus.length
      return 0
    },
    handle: (index, out) =>
      answer("handle", index, () => {
        out[0] = index
      }),
    name: (d, buf) => answer("name", d, () => put(buf, "Fake GPU")),
    uuid: (d, buf) => answer("uuid", d, () => put(buf, gpus[d as number]?.uuid ?? "")),
    memory: (d, out) =>
      answer("memory", d, () => Object.assign(out, { total: 80n * 2n ** 30n, used: 2n ** 30n, free: 79n * 2n ** 30n })),
    utilization: (d, out) => answer("utilization", d, () => Object.assign(out, { gpu: 40, memory: 20 })),
    temperature: (d, _sensor, out) =>
      answer("temperature", d, () => {
        out[0] = 60
      }),
    power: (d, out) =>
      answer("power", d, () => {
        out[0] = 250_000
      }),
    powerLimit: (d, out) =>
      answer("powerLimit", d, () => {
        out[0] = 700_000
      }),
    throttle: (d, out) =>
      answer("throttle", d, () => {
        out[0] = 0n
      }),
    ecc: (d, _type, _counter, out) =>
      answer("ecc", d, () => {
        out[0] = 0n
      }),
    processes: (d, count) =>
      answer("processes", d, () => {
        count[0] = 0
      }),
    unload: () => undefined
  }
}

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
  "processes"
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
  it("keeps a GPU whose board does not support power, temperature, ECC or throttle reasons", () => {
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
            processes: NOT_SUPPORTED
          }
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
          "processes"
        ]
      }
    ])
    expect([...problems]).toEqual([]) // NOT_SUPPORTED is the board's nature, not a problem to log
  })

  it("a field whose entry point this driver lacks is unknown, silently (an old driver is no problem to log)", () => {
    const problems = new Set<string>()
    const binding = fakeBinding([{ uuid: "GPU-a" }])
    const gpus = sample(
      { ...binding, temperature: undefined, power: undefined, throttle: undefined, processes: undefined },
      problems
    )
    expect(gpus).toEqual([
      {
        ...healthy(0, "GPU-a"),
        temperatureCelsius: 0,
        powerWatts: 0,
        unreportedFields: ["temperature_celsius", "power_watts", "throttle_reasons", "processes"]
      }
    ])
    expect([...problems]).toEqual([])
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
