// A GPU field NVML cannot report, through the real FFI (the fake libnvidia-ml.so of test/fixtures/fake_nvml.c,
// scripted per query by FAKE_NVML_STATE `gpu.N.QUERY_rc`): it is listed in the GPU's `unreportedFields` (NodeHealth
// `unreported_fields`), its gauge has no series for that GPU while the GPU's other series stay, the page stays valid
// for promtool, and once NVML reports the field again it is back, series included.
import { spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Effect, Layer } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Gpu } from "../../src/gen/cgn/agent/v1/agent.ts"
import * as NvmlLive from "../../src/layers/node/Nvml.ts"
import { nvmlWorkerEntry } from "../../src/programs/programPaths.ts"
import { Nvml } from "../../src/services/node/Nvml.ts"
import { Metrics } from "../../src/services/observability/Metrics.ts"
import * as MetricsTest from "../../src/testing/Metrics.ts"
import { buildFakeNvml } from "../support/nvml.ts"

const PROMTOOL = process.env.PROMTOOL ?? "promtool"
const G0 = 'gpu="0",uuid="GPU-00000000-1111-2222-3333-444444444444"'
const G1 = 'gpu="1",uuid="GPU-55555555-6666-7777-8888-999999999999"'

let dir = ""
let library = ""

beforeAll(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-nvml-unknown-"))
  library = buildFakeNvml(dir)
})

afterAll(() => {
  if (dir) fs.rmSync(dir, { recursive: true, force: true })
})

/** `promtool check metrics` over a page: its complaints, "" when it is valid. */
const promtool = (page: string): string => {
  const r = spawnSync(PROMTOOL, ["check", "metrics"], { input: page, encoding: "utf8" })
  if (r.error !== undefined)
    throw new Error(`${PROMTOOL} not found (${r.error.message}): install it, e.g. apt-get install prometheus`)
  return `${r.stdout}${r.stderr}${r.status === 0 ? "" : ` (exit ${r.status})`}`
}

/** The samples of the page for one GPU (`labels`) of one metric family, e.g. "cgn_agent_gpu_power_watts". */
const series = (body: string, name: string, labels: string) =>
  body.split("\n").filter((l) => l.startsWith(`${name}{${labels}`))

describe("a GPU field NVML cannot report", () => {
  it("is listed unknown, has no series (the GPU's other series stay), and comes back once NVML reports it", async () => {
    const state = path.join(dir, "unsupported.state")
    // GPU 1: utilization unsupported (MIG), power unsupported (some boards); GPU 0: temperature refused
    // (NO_PERMISSION), ECC off, throttle reasons unsupported
    fs.writeFileSync(
      state,
      ["gpu.1.util_rc=3", "gpu.1.power_rc=3", "gpu.0.temp_rc=4", "gpu.0.ecc_rc=3", "gpu.0.throttle_rc=3"].join("\n")
    )
    process.env.FAKE_NVML_STATE = state
    try {
      const result = await Effect.runPromise(
        Effect.gen(function* () {
          const nvml = yield* Nvml
          const metrics = yield* Metrics
          const unsupported = { gpus: yield* nvml.sampleNow, body: (yield* metrics.render).body }
          fs.writeFileSync(state, "") // a driver update, MIG turned off: everything answers again
          const back = { gpus: yield* nvml.sampleNow, body: (yield* metrics.render).body }
          return { unsupported, back }
        }).pipe(
          Effect.provide(
            NvmlLive.layer(nvmlWorkerEntry(), { library, maxAge: 0 }).pipe(Layer.provideMerge(MetricsTest.layerTest))
          )
        )
      )
      const [g0, g1] = result.unsupported.gpus
      expect(g1?.unreportedFields).toEqual(["utilization_percent", "power_watts"])
      expect(g0?.unreportedFields).toEqual(["temperature_celsius", "throttle_reasons", "ecc_uncorrected"])
      // NodeHealth carries the list on the wire and in the JSON record (etcd, /status)
      expect(Gpu.decode(Gpu.encode(g1!).finish()).unreportedFields).toEqual(["utilization_percent", "power_watts"])
      expect(Gpu.toJSON(g1!)).toMatchObject({ unreportedFields: ["utilization_percent", "power_watts"] })
      expect(Gpu.toJSON(result.back.gpus[1]!)).not.toHaveProperty("unreportedFields")

      const body = result.unsupported.body
      // no "idle" and no "0 W" for GPU 1, no "0 C", "no ECC error" or "not throttled" for GPU 0
      expect(series(body, "cgn_agent_gpu_utilization_ratio", G1)).toEqual([])
      expect(series(body, "cgn_agent_gpu_power_watts", G1)).toEqual([])
      expect(series(body, "cgn_agent_gpu_temperature_celsius", G0)).toEqual([])
      expect(series(body, "cgn_agent_gpu_ecc_uncorrected_errors", G0)).toEqual([])
      expect(series(body, "cgn_agent_gpu_clock_throttled", G0)).toEqual([])
      // what each GPU does report stays
      expect(body).toContain(`cgn_agent_gpu_memory_used_bytes{${G1}} 4294967297`)
      expect(body).toContain(`cgn_agent_gpu_memory_total_bytes{${G1}} 85899345920`)
      expect(body).toContain(`cgn_agent_gpu_temperature_celsius{${G1}} 71`)
      expect(body).toContain(`cgn_agent_gpu_power_limit_watts{${G1}} 700`)
      expect(body).toContain(`cgn_agent_gpu_clock_throttled{${G1},reason="sw_power_cap"} 1`)
      expect(body).toContain(`cgn_agent_gpu_utilization_ratio{${G0}} 0.37`)
      expect(body).toContain(`cgn_agent_gpu_power_watts{${G0}} 312`)
      expect(body).toContain(`cgn_agent_gpu_lost{${G1}} 0`)
      expect(promtool(body)).toBe("")

      // reported again: listed no more, and the series are back with the real values
      expect(result.back.gpus.map((g) => g.unreportedFields)).toEqual([[], []])
      expect(result.back.gpus[1]).toMatchObject({ utilizationPercent: 100, powerWatts: 689.5 })
      expect(result.back.body).toContain(`cgn_agent_gpu_utilization_ratio{${G1}} 1`)
      expect(result.back.body).toContain(`cgn_agent_gpu_power_watts{${G1}} 689.5`)
      expect(result.back.body).toContain(`cgn_agent_gpu_temperature_celsius{${G0}} 54`)
      expect(result.back.body).toContain(`cgn_agent_gpu_ecc_uncorrected_errors{${G0}} 0`)
      expect(result.back.body).toContain(`cgn_agent_gpu_clock_throttled{${G0},reason="sw_power_cap"} 0`)
      expect(promtool(result.back.body)).toBe("")
    } finally {
      delete process.env.FAKE_NVML_STATE
    }
  })
})
