// The stall rule's reading of one scrape (services/engine/EngineProgress.ts progressReading) carries the per-rank
// figures (LoadSignals.rankProgress, PromText.ts perRank): the live EngineStall (layers/engine/EngineStall.ts) reads
// `reading.ranks` to find the data-parallel rank whose figure stopped changing while the others move (vLLM's
// `engine` label, SGLang's `dp_rank`). Dropped there, a rank that hangs alone would never be singled out.
import { describe, expect, it } from "vitest"
import { progressReading } from "../../src/services/engine/EngineProgress.ts"

describe("progressReading", () => {
  it("keeps each data-parallel rank's figure, and none when the page has no rank label", () => {
    const signals = { running: 2, waiting: 0, progress: { "vllm:generation_tokens": 40 } }
    const reading = progressReading({ ...signals, rankProgress: { "0": 30, "1": 10.5 } }, 1_000, 2)
    expect(reading?.ranks).toEqual({ "0": 30, "1": 10.5 })
    expect(reading?.held).toBe(2)
    expect(progressReading(signals, 1_000, 2)?.ranks).toBeUndefined()
  })
})
