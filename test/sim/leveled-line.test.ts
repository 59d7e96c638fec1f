// The simulator's warnings and errors in each engine's own log format, read by the agent's level marks for that
// engine (layers/engine/backends/logMarks.ts) at the level the real engine's line would be: the simulator wrote
// JSON lines, which the agent reads at info whatever they said.
import { describe, expect, it } from "vitest"
import { LLAMA_CPP_MARKS, MLX_MARKS, SGLANG_MARKS, VLLM_MARKS } from "../../src/layers/engine/backends/logMarks.ts"
import { lineLevelReader } from "../../src/services/engine/LineLevels.ts"
import { leveledLine } from "../../src/sim/leveledLine.ts"

const at = new Date("2026-12-07T09:05:03.042Z")
const uptimeUs = 65_432_109 // 1 min 5.432109 s

describe("leveledLine", () => {
  it("writes each engine's prefix, the message and the other fields", () => {
    expect(leveledLine("vllm", "error", "Potentially invalid KV blocks", {}, at, uptimeUs)).toBe(
      "ERROR 12-07 09:05:03 [cgn_engine_sim.py:1] Potentially invalid KV blocks"
    )
    expect(leveledLine("sglang", "error", "abort", { rid: "r1" }, at, uptimeUs)).toBe(
      '[2026-12-07 09:05:03] abort {"rid":"r1"}'
    )
    expect(leveledLine("llama_cpp", "warning", "w", {}, at, uptimeUs)).toBe("1.05.432.109 W w")
    expect(leveledLine("mlx", "warning", "w", {}, at, uptimeUs)).toBe("2026-12-07 09:05:03,042 - WARNING - w")
  })

  it("is read by the agent at the engine's level (SGLang's logger writes none: info)", () => {
    const read = (marks: Parameters<typeof lineLevelReader>[0], line: string) => lineLevelReader(marks)(line)
    for (const level of ["warning", "error"] as const) {
      const agents = level === "error" ? "error" : "warn"
      expect(read(VLLM_MARKS, leveledLine("vllm", level, "m", {}, at, uptimeUs))).toBe(agents)
      expect(read(LLAMA_CPP_MARKS, leveledLine("llama_cpp", level, "m", {}, at, uptimeUs))).toBe(agents)
      expect(read(MLX_MARKS, leveledLine("mlx", level, "m", {}, at, uptimeUs))).toBe(agents)
      expect(read(SGLANG_MARKS, leveledLine("sglang", level, "m", {}, at, uptimeUs))).toBe("info")
    }
  })
})
