// The `generate` subcommand's stderr summary: its token count is the engine's (the final's usage) where it reported
// one, the deltas' engine chunks otherwise, said so (the proto: GenerateDelta.tokens is not an exact count).
import { Option } from "effect"
import { describe, expect, it } from "vitest"
import type { GenerateFinal } from "../../src/gen/cgn/agent/v1/agent.ts"
import { requestFromFlags, summaryLine } from "../../src/programs/generate.ts"

const final = (usage?: GenerateFinal["usage"]): GenerateFinal => ({
  finishReason: "length",
  usage,
  timings: undefined,
  kvTransferParams: undefined,
  nodeId: "n1",
  requestId: "r1",
  stopSequence: ""
})

describe("generate's summary line", () => {
  it("counts the engine's usage where it reported one, and its rate from it", () => {
    const line = summaryLine({
      tokens: 2,
      ttftMs: 10,
      totalMs: 40,
      final: final({ promptTokens: 3, completionTokens: 4, totalTokens: 7 })
    })
    expect(line).toBe("4 tokens, time to first token 10.0 ms, 100.0 tokens/s, total 40.0 ms, finish length, request r1")
  })

  it("asks the engine for its usage, the exact count it prefers", () => {
    const flags = { prompt: Option.some("hi"), message: [], maxTokens: Option.none(), stop: [], model: "" }
    expect(requestFromFlags(flags)).toMatchObject({ prompt: "hi", includeUsage: true })
  })

  it("no delta came (no time to first token): '-', and a rate of 0, not one over no decode time", () => {
    const usage = { promptTokens: 1, completionTokens: 5, totalTokens: 6 }
    expect(summaryLine({ tokens: 0, ttftMs: undefined, totalMs: 10, final: final(usage) })).toBe(
      "5 tokens, time to first token -, 0.0 tokens/s, total 10.0 ms, finish length, request r1"
    )
  })

  it("no delta came yet the engine answered (a first token its stop sequence cut away): the agent's time beside '-'", () => {
    const usage = { promptTokens: 1, completionTokens: 1, totalTokens: 2 }
    const timings = { timeToFirstTokenMs: 12.9, totalMs: 61, queueMs: 0 }
    expect(summaryLine({ tokens: 0, ttftMs: undefined, totalMs: 61.3, final: { ...final(usage), timings } })).toBe(
      "1 tokens, time to first token - (no text came; the agent had the engine's first token at 12.9 ms), 0.0 tokens/s, total 61.3 ms, finish length, request r1"
    )
  })

  it("says the count is engine chunks when the engine reported no usage, or when no final came", () => {
    expect(summaryLine({ tokens: 2, ttftMs: 10, totalMs: 20, final: final() })).toMatch(
      /^2 tokens \(engine chunks: the engine reported no usage\), /
    )
    expect(summaryLine({ tokens: 2, ttftMs: 10, totalMs: 20, final: undefined })).toMatch(
      /^2 tokens \(engine chunks\), /
    )
  })
})
