// The engine's output as lines (services/engine/OutputLines.ts): split as readline splits them, each bounded, a JSON
// line in its canonical form before the secrets are scrubbed, a cut line scrubbed whole before it is shortened.
import { describe, expect, it } from "vitest"
import {
  canonicalLine,
  LineSplitter,
  LOGGED_LINES_BURST,
  LOGGED_LINES_PER_SEC,
  MAX_LINE_CHARS,
  OutputBudget,
  type OutputLine,
  scrubbedLine
} from "../../src/services/engine/OutputLines.ts"
import { lineRedactor, REDACTED } from "../../src/services/engine/Secrets.ts"

/** Every line of `pieces` pushed in turn, then the end. */
const split = (max: number, ...pieces: Array<string>): Array<OutputLine> => {
  const s = new LineSplitter(max)
  return [...pieces.flatMap((p) => s.push(p)), ...s.end()]
}
const texts = (lines: Array<OutputLine>) => lines.map((l) => (l.cut ? `${l.text}[cut]` : l.text))

describe("LineSplitter", () => {
  it("splits at \\n, \\r and \\r\\n (also across pieces), and gives the last line without an end", () => {
    expect(texts(split(100, "a\nb\r\nc\rd"))).toEqual(["a", "b", "c", "d"])
    expect(texts(split(100, "a\r", "\nb\r", "c\n", "\n"))).toEqual(["a", "b", "c", ""])
    expect(texts(split(100, "ab", "cd", "\n"))).toEqual(["abcd"])
    expect(texts(split(100, ""))).toEqual([])
  })

  it("cuts a line at the bound: its head at once, the rest dropped up to its end, the next line whole", () => {
    expect(texts(split(4, "abcdefgh", "ij\nkl\n"))).toEqual(["abcd[cut]", "kl"])
    expect(texts(split(4, "ab", "cd", "e"))).toEqual(["abcd[cut]"])
    expect(texts(split(4, "abcd\n"))).toEqual(["abcd"])
  })

  it("holds at most the bound whatever comes: 64 MiB without an end is one cut line", () => {
    const s = new LineSplitter(1000)
    const mib = "x".repeat(1 << 20)
    const out: Array<OutputLine> = []
    for (let i = 0; i < 64; i++) out.push(...s.push(mib))
    out.push(...s.end())
    expect(out).toEqual([{ text: "x".repeat(1000), cut: true }])
  })
})

describe("canonicalLine", () => {
  it("writes a JSON object line again as JSON.stringify does; anything else as it is", () => {
    expect(canonicalLine('{"msg":"\\u0041\\u00E4 \\u0026", "n":1}')).toBe('{"msg":"Aä &","n":1}')
    expect(canonicalLine('{"msg":"a\\"b\\\\c\\n"}')).toBe('{"msg":"a\\"b\\\\c\\n"}')
    for (const line of ["plain text", "[1,2]", "{broken", '"str"']) expect(canonicalLine(line)).toBe(line)
    const deep = `{"x":${"[".repeat(20_000)}${"]".repeat(20_000)}}`
    expect(canonicalLine(deep)).toBe(deep)
  })
})

describe("scrubbedLine", () => {
  const secret = 'pa"ss&Word9'
  const redact = lineRedactor([secret])

  it("scrubs a secret however a JSON line escapes it", () => {
    const escaped = [...secret].map((c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`).join("")
    for (const spelled of [escaped, 'pa\\"ss\\u0026Word9', "pa\\u0022ss&Word9"])
      expect(scrubbedLine({ text: `{"msg":"key ${spelled}","f":["${spelled}"]}`, cut: false }, redact)).toBe(
        `{"msg":"key ${REDACTED}","f":["${REDACTED}"]}`
      )
  })

  it("scrubs a secret a JSON line holds in a JSON document or a repr inside one of its strings", () => {
    const inner = JSON.stringify({ key: secret })
    const line = JSON.stringify({ msg: `config: ${inner}`, f: { repr: `{'key': 'pa"ss&Word9'}` } })
    const out = scrubbedLine({ text: line, cut: false }, redact)
    expect(out).toBe(JSON.stringify({ msg: `config: {"key":"${REDACTED}"}`, f: { repr: `{'key': '${REDACTED}'}` } }))
  })

  it("leaves a JSON line whose bare number is a secret as text, the number scrubbed (written again it would round)", () => {
    const r = lineRedactor(["12345678901234567890"])
    expect(scrubbedLine({ text: '{"msg":"seed","seed":12345678901234567890}', cut: false }, r)).toBe(
      `{"msg":"seed","seed":${REDACTED}}`
    )
  })

  const cut = (text: string) => {
    const line = split(MAX_LINE_CHARS + redact.longest, text)
    expect(line).toHaveLength(1)
    return scrubbedLine(line[0] as OutputLine, redact)
  }

  it("shows a cut line up to its 16,384th character as it came, a secret across the cut replaced whole, marked", () => {
    const head = "x".repeat(MAX_LINE_CHARS - 3)
    expect(cut(`${head}${secret}${"y".repeat(100)}`)).toBe(
      `${head}${REDACTED} … (line cut: only its first ${MAX_LINE_CHARS} characters are logged)`
    )
  })

  it("never moves a secret the cut leaves partial into view, however many are replaced before it", () => {
    // The secret 20 times (each replacement shorter than its form), then the secret across the splitter's own bound:
    // a slice of the scrubbed text showed 38 of a 39-character secret (code review).
    const long = "sk-ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    const r = lineRedactor([long])
    const many = `${`${long} `.repeat(20)}`
    const pad = "z".repeat(MAX_LINE_CHARS + r.longest - many.length - 10)
    const line = split(MAX_LINE_CHARS + r.longest, `${many}${pad}${long}${"y".repeat(100)}`)
    const out = scrubbedLine(line[0] as OutputLine, r)
    expect(out).not.toContain(long.slice(0, 6))
    expect(out.startsWith(`${REDACTED} `.repeat(20))).toBe(true)
  })

  it("scrubs a cut JSON line (not put in canonical form) of a secret with every character escaped", () => {
    const escaped = [...secret].map((c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`).join("")
    for (const spelled of [escaped, escaped.toUpperCase().replaceAll("\\U", "\\u")])
      expect(cut(`{"msg":"token ${spelled}","pad":"${"p".repeat(MAX_LINE_CHARS)}"}`)).toContain(`token ${REDACTED}`)
  })
})

describe("OutputBudget", () => {
  it("logs the burst at once, then the rate, and counts the others at most once a second", () => {
    const b = new OutputBudget()
    const take = (n: number, at: number) => {
      let logged = 0
      const counts: Array<number> = []
      for (let i = 0; i < n; i++) {
        const t = b.take(at)
        if (t.log) logged++
        if (t.dropped !== undefined) counts.push(t.dropped)
      }
      return { logged, counts }
    }
    expect(take(LOGGED_LINES_BURST + 500, 0)).toEqual({ logged: LOGGED_LINES_BURST, counts: [] })
    expect(b.due(999)).toBeUndefined()
    // half a second later: half the rate logged, the rest counted with the 500 before, a second after the first
    expect(take(1_000, 500)).toEqual({ logged: LOGGED_LINES_PER_SEC / 2, counts: [] })
    expect(b.due(1_000)).toBe(1_000)
    expect(b.due(1_500)).toBeUndefined()
    // a line a second later is logged; nothing pending, nothing counted
    expect(take(1, 2_000)).toEqual({ logged: 1, counts: [] })
    // a flood that goes on (1,499 left at 2 s, 2,499 at 3 s): 2,501 not logged, counted with a line a second later
    expect(take(5_000, 3_000)).toEqual({ logged: 2_499, counts: [] })
    expect(take(1, 4_000)).toEqual({ logged: 1, counts: [2_501] })
    expect(b.flush()).toBe(0)
  })
})
