// What secrets.test.ts, secret-forms.test.ts and shown-line.test.ts left open in the scrubbing of an engine's lines
// (services/engine/LineRedactor.ts), found by a mutation audit: the length from which a value is scrubbed, a "." in a
// secret read as itself, a base64 text that begins partway into the secret's first character, and one redactor used
// for a cut line (head) and then for a whole one, as EngineErrors.ts engineWords uses it.
import { describe, expect, it } from "vitest"
import { lineRedactor, MIN_SCRUBBED_LENGTH } from "../../src/services/engine/LineRedactor.ts"
import { REDACTED } from "../../src/services/engine/Secrets.ts"

describe("which values are scrubbed", () => {
  it(`a secret of exactly ${MIN_SCRUBBED_LENGTH} characters is scrubbed (only shorter ones are not)`, () => {
    const six = `${"k".repeat(MIN_SCRUBBED_LENGTH - 1)}9`
    expect(lineRedactor([six])(`key=${six} end`)).toBe(`key=${REDACTED} end`)
  })

  it("a '.' in a secret is a dot: text with another character in its place is not blanked", () => {
    const redact = lineRedactor(["pass.word.42"])
    expect(redact("pass.word.42")).toBe(REDACTED)
    expect(redact("passXwordY42 and pass-word-42")).toBe("passXwordY42 and pass-word-42")
  })
})

describe("a base64 text of the secret that begins partway into it", () => {
  // "a" + secret + "!" in base64: the core that carries the secret alone begins at "LXN1", its first character's
  // bits also in the 3 characters before it ("YXNr"). A line may begin anywhere in them (a cut, a wrapped line).
  const secret = "sk-supersecret-42"
  const b64 = Buffer.from(`a${secret}!`).toString("base64")
  const core = "LXN1cGVyc2VjcmV0LTQy"

  it("is scrubbed from wherever the line begins, and nothing before the line's start is repeated", () => {
    expect(b64.includes(core)).toBe(true)
    const redact = lineRedactor([secret])
    for (let from = 0; from <= b64.indexOf(core); from++) {
      const line = b64.slice(from)
      const shown = redact(line)
      expect([from, shown.includes("cGVyc2Vjc")]).toEqual([from, false])
      expect([from, shown.endsWith(`${REDACTED}IQ==`)]).toEqual([from, true])
      expect(shown.length - REDACTED.length).toBeLessThan(line.length)
    }
    expect(redact(b64.slice(2))).toBe(`Nr${REDACTED}IQ==`)
  })
})

describe("one redactor, a cut line then a whole one", () => {
  it("after head stops at the cut, the next line is scanned from its start", () => {
    const secret = "sk-live-abcdef123456"
    const redact = lineRedactor([secret])
    // head stops at the second secret (past the cut), the scan already at the third ...
    expect(redact.head(`${secret} then ${secret} and ${secret} after`, 5)).toBe(REDACTED)
    // ... and a line scrubbed next still has its first secret found
    expect(redact(`${secret} again`)).toBe(`${REDACTED} again`)
    expect(redact.head(`${secret} again`, 40)).toBe(`${REDACTED} again`)
  })
})
