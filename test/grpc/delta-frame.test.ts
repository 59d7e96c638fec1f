// services/grpc/DeltaFrame.ts, the per-token message written by hand, tested directly against the generated
// encoder: the same bytes for every text shape (empty, multi-byte, a lone surrogate, long enough for 2- and
// 3-byte varints) and every uint32 size of index and tokens, and the frame the agent's clients decode.
import { describe, expect, it } from "vitest"
import { GenerateResponse } from "../../src/gen/cgn/agent/v1/agent.ts"
import { frameDelta } from "../../src/services/grpc/DeltaFrame.ts"
import { frameMessage, MessageReader } from "../../src/services/grpc/Wire.ts"

const generated = (text: string, index: number, tokens: number): Buffer =>
  Buffer.from(frameMessage(GenerateResponse.encode({ delta: { text, index, tokens } }).finish()))

const texts = [
  "",
  "a",
  " the",
  "é",
  "日本語",
  "🙂 emoji",
  "\ud83d",
  "x".repeat(127),
  "x".repeat(128),
  "y".repeat(20_000)
]
const numbers = [0, 1, 127, 128, 16_383, 16_384, 2_097_152, 268_435_456, 4_294_967_295]

describe("frameDelta", () => {
  it("writes the generated encoder's bytes for every text shape and uint32 size", () => {
    let cases = 0
    for (const text of texts)
      for (const index of [0, 1, 300])
        for (const tokens of numbers) {
          expect(frameDelta(text, index, tokens), JSON.stringify({ text: text.slice(0, 8), index, tokens })).toEqual(
            generated(text, index, tokens)
          )
          cases++
        }
    for (const index of numbers) expect(frameDelta("t", index, 1)).toEqual(generated("t", index, 1))
    expect(cases).toBe(texts.length * 3 * numbers.length)
  })

  it("is one whole frame that reads back as the delta", () => {
    const frame = frameDelta(" déjà vu", 0, 3)
    const messages = new MessageReader(1 << 20).push(frame)
    if (!Array.isArray(messages)) throw new Error("over the limit")
    expect(messages).toHaveLength(1)
    expect(messages[0]!.compressed).toBe(false)
    expect(GenerateResponse.decode(messages[0]!.body)).toEqual({ delta: { text: " déjà vu", index: 0, tokens: 3 } })
  })

  it("writes every byte of the memory it is given (uninitialised memory leaks nothing)", () => {
    const frame = frameDelta("abc", 0, 1, (n) => Buffer.alloc(n, 0xee))
    expect(frame).toEqual(generated("abc", 0, 1))
    expect(frame.includes(0xee)).toBe(false)
  })
})
