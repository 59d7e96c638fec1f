// A truncated fixed32 field (wire type 5) is refused like a truncated fixed64 (services/grpc/WireShape.ts walk), at
// the request's end and inside a nested message whose parent reads on after it. wire-shape.test.ts covers fixed64.
import { describe, expect, it } from "vitest"
import { FLAT, GENERATE_REQUEST, wireProblem } from "../../src/services/grpc/WireShape.ts"

const hex = (s: string) => Buffer.from(s.replaceAll(" ", ""), "hex")

describe("wireProblem: fixed32", () => {
  it("a whole fixed32 passes; one with fewer than 4 bytes left in its message is refused", () => {
    expect(wireProblem(hex("0d 01020304"), FLAT)).toBeUndefined()
    expect(wireProblem(hex("0d 0102"), FLAT)).toBe("field 1 runs past the end of its message")
    // sampling (field 5) of 3 bytes holding a fixed32 that needs 4, then a prompt: the parent's bytes are not its
    expect(wireProblem(hex("2a 03 0d 0102  22 01 61"), GENERATE_REQUEST)).toBe(
      "in field 5: field 1 runs past the end of its message"
    )
  })
})
