// MIG through the real FFI (koffi -> the fake libnvidia-ml.so of test/fixtures/fake_nvml.c): a GPU in MIG mode is
// sampled with its MIG devices (UUID, GPU and compute instance ids, memory, the processes its own handle lists; empty
// slots skipped), each process with the MIG instance it runs on, and a board without MIG (NOT_SUPPORTED,
// FUNCTION_NOT_FOUND) is simply not in MIG mode. The MIG handles' process lists answer where the GPU's own is refused
// (no mig/monitor capability); a failed slot or list is said to be unreported.
import * as fs from "node:fs"
import * as path from "node:path"
import { Effect, Layer } from "effect"
import { describe, expect, it } from "vitest"
import * as NvmlLive from "../../src/layers/node/Nvml.ts"
import { nvmlWorkerEntry } from "../../src/programs/programPaths.ts"
import { Nvml } from "../../src/services/node/Nvml.ts"
import * as MetricsTest from "../../src/testing/Metrics.ts"
import { useFakeNvml } from "../support/nvml.ts"

const GiB = 2 ** 30
const MIG_A = "MIG-bbbbbbbb-0000-0000-0000-000000000001"
const MIG_B = "MIG-bbbbbbbb-0000-0000-0000-000000000002"
const nvml = useFakeNvml("cgn-nvml-mig-")

const sampleWith = async (lines: ReadonlyArray<string>) => {
  const state = path.join(nvml.dir, "mig.state")
  fs.writeFileSync(state, `${lines.join("\n")}\n`)
  process.env.FAKE_NVML_STATE = state
  try {
    return await Effect.runPromise(
      Effect.gen(function* () {
        return yield* (yield* Nvml).sampleNow
      }).pipe(
        Effect.provide(
          NvmlLive.layer(nvmlWorkerEntry(), { library: nvml.library }).pipe(Layer.provide(MetricsTest.layerTest))
        )
      )
    )
  } finally {
    delete process.env.FAKE_NVML_STATE
  }
}

describe("MIG through the FFI (fake NVML)", () => {
  it("samples a GPU in MIG mode with its MIG devices, skipping empty slots, and each process's MIG instance", async () => {
    const gpus = await sampleWith([
      "gpu.1.mig=1",
      // slots 0 and 3 hold MIG devices; 1, 2, 4-6 answer NOT_FOUND
      `gpu.1.mig_devices=0:MIG-aaaaaaaa-0000-0000-0000-000000000001:1:0:${GiB / 2}:${40 * GiB},3:MIG-aaaaaaaa-0000-0000-0000-000000000002:2:0:${30 * GiB}:${40 * GiB}`,
      `gpu.1.procs=500:${30 * GiB}:2:0,77:${GiB / 4}:1:0`,
      `gpu.0.procs=9:${GiB}`,
      "gpu.0.mig_rc=3"
    ])
    const [g0, g1] = gpus
    expect(g1?.migEnabled).toBe(true)
    expect(g1?.migDevices).toEqual([
      {
        uuid: "MIG-aaaaaaaa-0000-0000-0000-000000000001",
        gpuInstanceId: 1,
        computeInstanceId: 0,
        memoryTotalBytes: 40 * GiB,
        memoryUsedBytes: GiB / 2,
        unreportedFields: [],
        processes: [{ pid: 77, usedMemoryBytes: GiB / 4, gpuInstanceId: 1, computeInstanceId: 0 }]
      },
      {
        uuid: "MIG-aaaaaaaa-0000-0000-0000-000000000002",
        gpuInstanceId: 2,
        computeInstanceId: 0,
        memoryTotalBytes: 40 * GiB,
        memoryUsedBytes: 30 * GiB,
        unreportedFields: [],
        processes: [{ pid: 500, usedMemoryBytes: 30 * GiB, gpuInstanceId: 2, computeInstanceId: 0 }]
      }
    ])
    expect(g1?.processes).toEqual([
      { pid: 500, usedMemoryBytes: 30 * GiB, gpuInstanceId: 2, computeInstanceId: 0 },
      { pid: 77, usedMemoryBytes: GiB / 4, gpuInstanceId: 1, computeInstanceId: 0 }
    ])
    expect(g1?.unreportedFields).toEqual([])
    // a board without MIG (nvmlDeviceGetMigMode NOT_SUPPORTED): not in MIG mode, known; a process not on a MIG
    // instance (0xFFFFFFFF) carries no instance ids
    expect(g0?.migEnabled).toBe(false)
    expect(g0?.migDevices).toEqual([])
    expect(g0?.unreportedFields).toEqual([])
    expect(g0?.processes).toEqual([{ pid: 9, usedMemoryBytes: GiB }])
    expect(g0?.processes[0]).not.toHaveProperty("gpuInstanceId")
  })

  it("a MIG mode query that fails otherwise leaves MIG unknown, said in unreported_fields", async () => {
    const [g0, g1] = await sampleWith(["gpu.0.mig_rc=999", "gpu.1.mig_rc=13"])
    expect(g0?.migEnabled).toBe(false)
    expect(g0?.unreportedFields).toEqual(["mig_enabled", "mig_devices"])
    // FUNCTION_NOT_FOUND: no MIG on this driver, known
    expect(g1?.migEnabled).toBe(false)
    expect(g1?.unreportedFields).toEqual([])
  })

  it("each MIG device lists its own processes while the GPU's aggregate list is refused (no mig/monitor capability)", async () => {
    const [, g1] = await sampleWith([
      "gpu.1.mig=1",
      `gpu.1.mig_devices=0:${MIG_A}:1:0:${GiB / 2}:${40 * GiB},1:${MIG_B}:2:0:0:${40 * GiB}`,
      `gpu.1.procs=77:${GiB / 4}:1:0,500:18446744073709551615:2:0`,
      // nvmlDeviceGetComputeRunningProcesses_v3 of the GPU handle: NVML_ERROR_NO_PERMISSION
      "gpu.1.procs_rc=4"
    ])
    expect(g1?.unreportedFields).toEqual(["processes"])
    expect(g1?.processes).toEqual([])
    expect(g1?.migDevices.map((m) => [m.uuid, m.processes, m.unreportedFields])).toEqual([
      [MIG_A, [{ pid: 77, usedMemoryBytes: GiB / 4, gpuInstanceId: 1, computeInstanceId: 0 }], []],
      // memory NVML_VALUE_NOT_AVAILABLE: 0 (never taken for free: Mig.ts migUsedMemory)
      [MIG_B, [{ pid: 500, usedMemoryBytes: 0, gpuInstanceId: 2, computeInstanceId: 0 }], []]
    ])
  })

  it("a MIG handle's failed process list, and a MIG slot that cannot be read, are said to be unreported", async () => {
    const [, g1] = await sampleWith([
      "gpu.1.mig=1",
      `gpu.1.mig_devices=0:${MIG_A}:1:0:${GiB / 2}:${40 * GiB},3:${MIG_B}:2:0:0:${40 * GiB}`,
      "gpu.1.mig_procs_rc=999",
      "gpu.1.mig_slot_rc=0:999"
    ])
    // slot 0's handle query failed: its device is left out and the list is incomplete
    expect(g1?.unreportedFields).toEqual(["mig_devices"])
    expect(g1?.migDevices.map((m) => [m.uuid, m.processes, m.unreportedFields])).toEqual([[MIG_B, [], ["processes"]]])
  })
})
