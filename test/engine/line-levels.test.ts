// What engine-log-levels.test.ts left open in the reading of an engine line's level (services/engine/LineLevels.ts),
// found by a mutation audit: the marks are plain data (a launch plan carries them through JSON), so `levels` is an
// ordinary object, and a captured word that names one of Object.prototype's members is no level.
import { describe, expect, it } from "vitest"
import { lineLevelReader } from "../../src/services/engine/LineLevels.ts"

describe("a mark that is not one of the marks' levels", () => {
  // A pattern that captures any word, as a backend's could: only its own keys are levels.
  const read = lineLevelReader(JSON.parse(JSON.stringify({ pattern: String.raw`^(\w+) `, levels: { W: "warn" } })))

  it("a word of Object.prototype's (constructor, toString, __proto__...) is logged at info, as any unknown mark", () => {
    for (const word of ["constructor", "toString", "hasOwnProperty", "valueOf", "__proto__"])
      expect([word, read(`${word} something happened`)]).toEqual([word, "info"])
    expect(read("W something happened")).toBe("warn")
  })
})
