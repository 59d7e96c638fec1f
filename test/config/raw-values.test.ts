// What config-fuzz-findings.test.ts left open in the check of a file's values as written
// (services/config/RawValues.ts checkValues), found by a mutation audit: a TOML table is rebuilt with no prototype, so
// a key named "__proto__" stays a key of the file's (an environment variable's name, as any other), never dropped
// nor taken for the table's prototype (smol-toml, which parses it, builds its tables the same way).
import { Result } from "effect"
import { describe, expect, it } from "vitest"
import { decodeConfig } from "../../src/layers/config/Config.ts"

const MODEL = '[models.m]\nhf_repo = "a/b"\n'

describe('a key named "__proto__" in a TOML table', () => {
  it("[engine].env keeps it beside the others, with its value", () => {
    const r = decodeConfig(`[engine]\nenv = { "__proto__" = "x", A = "1" }\n${MODEL}`, "f.toml", {})
    if (Result.isFailure(r)) throw new Error(r.failure.message)
    expect(Object.entries(r.success.engine.env)).toEqual([
      ["__proto__", "x"],
      ["A", "1"]
    ])
  })
})
