// The engine's output as lines (services/engine/OutputLines.ts): split as readline splits them, each bounded, and how
// many are logged (OutputBudget).
import { describe, expect, it } from "vitest"
import {
  LineSplitter,
  LOGGED_LINES_BURST,
  LOGGED_LINES_PER_SEC,
  OutputBudget,
  type OutputLine
} from "../../src/services/engine/OutputLines.ts"

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

  it("counts a second after a step of the wall clock backwards, not once the clock is back where it was", () => {
    const b = new OutputBudget()
    for (let i = 0; i < LOGGED_LINES_BURST + 10; i++) b.take(3_600_000)
    expect(b.due(1_000)).toBeUndefined()
    expect(b.due(2_000)).toBe(10)
  })
})
