// What one engine output line shows, scrubbed of the run's secrets (services/engine/ShownLine.ts): the text /status
// keeps, the log's message and fields; a JSON line's strings scrubbed decoded, a cut line shown by positions as it came.
import { describe, expect, it } from "vitest"
import { lineRedactor } from "../../src/services/engine/LineRedactor.ts"
import { LineSplitter, MAX_LINE_CHARS, type OutputLine } from "../../src/services/engine/OutputLines.ts"
import { REDACTED } from "../../src/services/engine/Secrets.ts"
import { shownLine } from "../../src/services/engine/ShownLine.ts"

const none = lineRedactor([])
const whole = (text: string) => ({ text, cut: false })

describe("shownLine: the message and the fields", () => {
  it("a text line is the message as it is", () => {
    const line = "INFO 12-02 10:00:00 [api_server.py:1] Starting vLLM API server"
    expect(shownLine(whole(line), none)).toEqual({ text: line, message: line })
  })

  it("a JSON object line: its msg (else message) is the message, its other keys the fields, the text written again", () => {
    expect(shownLine(whole('{"ts":"t", "msg":"listening","port":8000}'), none)).toEqual({
      text: '{"ts":"t","msg":"listening","port":8000}',
      message: "listening",
      fields: { ts: "t", port: 8000 }
    })
    expect(shownLine(whole('{"message":"up"}'), none)).toEqual({ text: '{"message":"up"}', message: "up" })
    // a key that is not the message stays a field, whatever its name; `__proto__` too
    expect(shownLine(whole('{"message":"up","msg":5}'), none).fields).toEqual({ msg: 5 })
    const proto = shownLine(whole('{"msg":"hi","__proto__":{"x":1}}'), none).fields ?? {}
    expect(Object.keys(proto)).toEqual(["__proto__"])
    // neither: the line is the message, once
    expect(shownLine(whole('{"level":"info","n":1}'), none)).toEqual({
      text: '{"level":"info","n":1}',
      message: '{"level":"info","n":1}'
    })
    for (const line of ["{not json", "[1,2]", '"str"']) expect(shownLine(whole(line), none).message).toBe(line)
  })
})

describe("shownLine: secrets", () => {
  const secret = 'pa"ss&Word9'
  const redact = lineRedactor([secret])

  it("scrubs a secret however a JSON line escapes it, in the text, the message and the fields", () => {
    const escaped = [...secret].map((c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`).join("")
    for (const spelled of [escaped, 'pa\\"ss\\u0026Word9', "pa\\u0022ss&Word9"])
      expect(shownLine(whole(`{"msg":"key ${spelled}","f":["${spelled}"]}`), redact)).toEqual({
        text: `{"msg":"key ${REDACTED}","f":["${REDACTED}"]}`,
        message: `key ${REDACTED}`,
        fields: { f: [REDACTED] }
      })
  })

  it("scrubs a secret a JSON line holds in a JSON document or a repr inside one of its strings", () => {
    const inner = JSON.stringify({ key: secret })
    const line = JSON.stringify({ msg: `config: ${inner}`, f: { repr: `{'key': 'pa"ss&Word9'}` } })
    const shown = shownLine(whole(line), redact)
    expect(shown.message).toBe(`config: {"key":"${REDACTED}"}`)
    expect(shown.fields).toEqual({ f: { repr: `{'key': '${REDACTED}'}` } })
  })

  it("scrubs a number by its printed digits (written again, one past 2^53 would show most of them)", () => {
    const r = lineRedactor(["12345678901234567890", "hunter2hunter2", "87654321"])
    expect(shownLine(whole('{"msg":"seed","seed":12345678901234567890}'), r)).toEqual({
      text: `{"msg":"seed","seed":"${REDACTED}"}`,
      message: "seed",
      fields: { seed: REDACTED }
    })
    // printed otherwise, written again as the secret: the whole line's scrub finds it, and it shows as text only
    expect(shownLine(whole('{"msg":"pin","pin":8.7654321e7}'), r)).toEqual({
      text: `{"msg":"pin","pin":${REDACTED}}`,
      message: `{"msg":"pin","pin":${REDACTED}}`
    })
    // and the line's strings are still scrubbed decoded (the review's: a number scrubbed first made the line text)
    const both = '{"msg":"login pw=hunter2hunt\\u0065r2","seed":12345678901234567890}'
    expect(shownLine(whole(both), r).message).toBe(`login pw=${REDACTED}`)
  })

  it("shows a line as text, without fields, when a secret shows only in the whole line written again", () => {
    const r = lineRedactor(['ab","cd'])
    expect(shownLine(whole('{"msg":"x","a":"ab","cd":1}'), r)).toEqual({
      text: `{"msg":"x","a":"${REDACTED}":1}`,
      message: `{"msg":"x","a":"${REDACTED}":1}`
    })
  })

  it("never shows a deep JSON line's secret: scrubbed decoded as deep as the scrub goes, past that not shown", () => {
    // A review's line nested 1,800 deep had its fields logged decoded but unscrubbed (the scrub ran out of stack and
    // the logger decoded the line again). The fields now are the scrubbed object itself, and its text its JSON.
    // Under the cut (16,384 characters): 7,000 levels at most.
    const shown = [1_000, 1_800, 2_000, 5_000, 7_000].map((depth) => {
      const nested = `${"[".repeat(depth)}${JSON.stringify(JSON.stringify({ key: secret }))}${"]".repeat(depth)}`
      return shownLine(whole(`{"msg":"cfg","x":${nested}}`), redact)
    })
    for (const s of shown) {
      expect(s.text.includes("Word9") || s.message.includes("Word9")).toBe(false)
      // with fields, the text is their object's JSON (scrubbed); without, the line is not shown
      if (s.fields === undefined)
        expect(/^\(a JSON line of \d+ characters nested too deeply to scrub of secrets/.test(s.text)).toBe(true)
      else expect(s.text.startsWith('{"msg":"cfg","x":[[[')).toBe(true)
    }
    expect(shown.at(-1)?.fields).toBeUndefined()
  })

  const cut = (text: string, r = redact) => {
    const lines = new LineSplitter(MAX_LINE_CHARS + r.longest).push(`${text}\n`)
    expect(lines).toHaveLength(1)
    const shown = shownLine(lines[0] as OutputLine, r)
    expect(shown.message).toBe(shown.text)
    return shown.text
  }

  it("shows a cut line up to its 16,384th character as it came, a secret across the cut replaced whole, marked", () => {
    const head = "x".repeat(MAX_LINE_CHARS - 3)
    expect(cut(`${head}${secret}${"y".repeat(100)}`)).toBe(
      `${head}${REDACTED} … (line cut: only its first ${MAX_LINE_CHARS} characters are logged)`
    )
    // a line the splitter did not cut (under the bound plus the longest form) but over 16,384: cut all the same
    expect(shownLine(whole("z".repeat(MAX_LINE_CHARS + 1)), redact).text).toBe(
      `${"z".repeat(MAX_LINE_CHARS)} … (line cut: only its first ${MAX_LINE_CHARS} characters are logged)`
    )
    // README's bound in its own figures: 16,384 characters shown whole, one more cut there
    expect(shownLine(whole("z".repeat(16_384)), none).text).toBe("z".repeat(16_384))
    expect(shownLine(whole("z".repeat(16_385)), none).text).toBe(
      `${"z".repeat(16_384)} … (line cut: only its first 16384 characters are logged)`
    )
  })

  it("shows nothing of a secret that starts exactly at the cut, not even its REDACTED", () => {
    const head = "x".repeat(MAX_LINE_CHARS)
    expect(cut(`${head}${secret}${"y".repeat(100)}`)).toBe(
      `${head} … (line cut: only its first ${MAX_LINE_CHARS} characters are logged)`
    )
    expect(redact.head(`0123456789${secret}tail`, 10)).toBe("0123456789")
    expect(redact.head(`012345678${secret}tail`, 10)).toBe(`012345678${REDACTED}`)
  })

  it("never moves a secret the cut leaves partial into view, however many are replaced before it", () => {
    // The secret 20 times (each replacement shorter than its form), then the secret across the splitter's own bound:
    // a slice of the scrubbed text showed 38 of a 39-character secret (code review).
    const long = "sk-ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    const r = lineRedactor([long])
    const many = `${long} `.repeat(20)
    const pad = "z".repeat(MAX_LINE_CHARS + r.longest - many.length - 10)
    const out = cut(`${many}${pad}${long}${"y".repeat(100)}`, r)
    expect(out).not.toContain(long.slice(0, 6))
    expect(out.startsWith(`${REDACTED} `.repeat(20))).toBe(true)
  })

  it("scrubs a cut JSON line (not decoded) of a secret with every character escaped", () => {
    const escaped = [...secret].map((c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`).join("")
    for (const spelled of [escaped, escaped.toUpperCase().replaceAll("\\U", "\\u")])
      expect(cut(`{"msg":"token ${spelled}","pad":"${"p".repeat(MAX_LINE_CHARS)}"}`)).toContain(`token ${REDACTED}`)
  })
})
