// llama-server's slots read from its command line and environment as its argument parser reads them, and the
// warning when agent.max_inflight lets more calls through than it has slots (calls past them wait in its own queue).
import { Result } from "effect"
import { describe, expect, it } from "vitest"
import { decodeConfigObject } from "../../src/layers/config/Config.ts"
import { engineFor } from "../../src/layers/engine/backends/index.ts"
import { llamaServerSlots } from "../../src/layers/engine/backends/llama_cpp.ts"
import { lastFlagValue } from "../../src/services/engine/ArgvFlags.ts"

const warningsOf = (agent: Record<string, unknown>, engine: Record<string, unknown> = {}) => {
  const r = decodeConfigObject(
    { agent, engine: { kind: "llama_cpp", ...engine }, models: { m: { path: "/models/m.gguf" } } },
    undefined,
    { NODE_NAME: "node-1" }
  )
  if (Result.isFailure(r)) throw new Error(r.failure.message)
  return engineFor("llama_cpp").render(r.success).warnings ?? []
}

describe("llama-server's slots", () => {
  it("the last of -np and --parallel (either spelling, = or a separate value), else LLAMA_ARG_N_PARALLEL, else auto's 4", () => {
    expect(llamaServerSlots([], {})).toBe(4)
    expect(llamaServerSlots(["-np", "2"], {})).toBe(2)
    expect(llamaServerSlots(["--parallel=8"], {})).toBe(8)
    expect(llamaServerSlots(["-np", "2", "-c", "4096", "--parallel", "6"], {})).toBe(6)
    expect(llamaServerSlots(["--parallel", "6", "-np", "3"], {})).toBe(3)
    // the flag wins over the variable (common/arg.cpp reads the environment first, the command line over it)
    expect(llamaServerSlots(["-np", "2"], { LLAMA_ARG_N_PARALLEL: "16" })).toBe(2)
    expect(llamaServerSlots([], { LLAMA_ARG_N_PARALLEL: "16" })).toBe(16)
    expect(llamaServerSlots(["-np", "-1"], {})).toBe(4)
    expect(llamaServerSlots(["-np", "many"], {})).toBeUndefined()
    // another flag's value that happens to be "-np" is not read as the flag's: only whole arguments count
    expect(lastFlagValue(["-npx", "9"], ["-np", "--parallel"])).toBeUndefined()
  })

  it("agent.max_inflight above the slots: a warning that names both and the value to set; at or below: none", () => {
    expect(warningsOf({})).toEqual([
      expect.stringMatching(
        /^agent\.max_inflight \(256\) is above llama-server's 4 slots .*Set agent\.max_inflight = 4 /
      )
    ])
    expect(warningsOf({ max_inflight: 4 })).toEqual([])
    expect(warningsOf({ max_inflight: 3 })).toEqual([])
    expect(warningsOf({ max_inflight: 8 }, { args: ["-np", "8"] })).toEqual([])
    expect(warningsOf({ max_inflight: 9 }, { args: ["-np", "8"] })).toEqual([
      expect.stringMatching(/\(9\) is above llama-server's 8 slots/)
    ])
    expect(warningsOf({ max_inflight: 16 }, { env: { LLAMA_ARG_N_PARALLEL: "16" } })).toEqual([])
    // an unreadable value: llama-server refuses it at start, and that is what the operator will read
    expect(warningsOf({}, { args: ["-np", "x"] })).toEqual([])
  })
})
