/**
 * Which GPU's faults hold the engine (services/node/Gpus.ts engineFault, unlistedRef), where the assignment and NVML's
 * list now disagree. A MIG device is judged on the GPU that lists it now: NVML numbers GPUs per session (a driver
 * reload, a GPU reset or a GPU fallen off the bus can renumber them: NVML API Reference, nvmlDeviceGetHandleByIndex
 * "the order in which NVML enumerates devices has no guarantees of consistency between reboots"), while a MIG
 * device's UUID names it for good.
 */
import { describe, expect, it } from "vitest"
import type { MigDevice } from "../../src/gen/cgn/agent/v1/agent.ts"
import { engineFault, unlistedRef } from "../../src/services/node/Gpus.ts"
import { gpuWith } from "../../src/services/node/Nvml.ts"

const GiB = 2 ** 30
const MINE = "MIG-11111111-aaaa-bbbb-cccc-000000000001"
const mine: MigDevice = {
  uuid: MINE,
  gpuInstanceId: 1,
  computeInstanceId: 0,
  memoryTotalBytes: 40 * GiB,
  memoryUsedBytes: 0,
  unreportedFields: [],
  processes: []
}

describe("the GPU whose faults are the engine's", () => {
  it("judges a MIG device by the GPU that lists it now, not the index it was assigned under", () => {
    // assigned on GPU 0; NVML now lists the device on GPU 1
    const gpus = (faultOn: number) => [
      gpuWith({ index: 0, uuid: "GPU-a", eccUncorrected: faultOn === 0 ? 2 : 0 }),
      gpuWith({ index: 1, uuid: "GPU-b", migEnabled: true, migDevices: [mine], eccUncorrected: faultOn === 1 ? 2 : 0 })
    ]
    expect(engineFault(gpus(1), [0], undefined, MINE)).toBe("GPU 1 has 2 uncorrected ECC errors")
    // the other board's fault is not the engine's
    expect(engineFault(gpus(0), [0], undefined, MINE)).toBeUndefined()
  })

  it("holds the engine for a configured UUID NVML does not list, never for an index (missingGpu's case)", () => {
    const gpus = [gpuWith({ index: 0, uuid: "" })]
    expect(unlistedRef(["GPU-x"], gpus)).toContain('GPU "GPU-x" is not among the GPUs NVML lists')
    expect(unlistedRef([3], gpus)).toBeUndefined()
    expect(unlistedRef([3, "GPU-x"], gpus)).toContain('GPU "GPU-x"')
  })
})
