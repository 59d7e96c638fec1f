// SSE framing (services/engine/Sse.ts) at edges sse.test.ts does not reach: a U+FEFF that is not the stream's first
// character, an unfinished line of exactly the parser's limit, an empty chunk between a CR and its LF, and a stream
// that ends inside a UTF-8 character.
import { describe, expect, it } from "vitest"
import { makeSseParser, SseEventTooLarge } from "../../src/services/engine/Sse.ts"

describe("SSE framing edges", () => {
  it("only the stream's leading byte-order mark is dropped: a U+FEFF at a later chunk's start is data", () => {
    // WHATWG HTML, "Parsing an event stream": the stream is UTF-8 decoded, which strips one leading BOM only
    const p = makeSseParser()
    expect(p.feed("\uFEFFdata: a")).toEqual([])
    expect(p.feed("\uFEFFb\n\n")).toEqual([{ data: "a\uFEFFb" }])
    const q = makeSseParser()
    expect(q.feed("data: x\n\n")).toEqual([{ data: "x" }])
    expect(q.feed("\uFEFFdata: y\n\n")).toEqual([])
  })

  it("an unfinished line of exactly the limit is held; one character more throws", () => {
    const p = makeSseParser(100)
    expect(p.feed(`data: ${"x".repeat(94)}`)).toEqual([])
    expect(p.feed("\n\n")).toEqual([{ data: "x".repeat(94) }])
    expect(() => makeSseParser(100).feed(`data: ${"x".repeat(95)}`)).toThrow(SseEventTooLarge)
  })

  it("an empty chunk between a CR and its LF leaves them one line break", () => {
    // WHATWG: a CRLF pair is one end of line however the stream is split; a body reader may hand over an empty chunk
    for (const empty of ["", new Uint8Array(0)]) {
      const p = makeSseParser()
      expect(p.feed("data: a\r")).toEqual([])
      expect(p.feed(empty)).toEqual([])
      expect(p.feed("\ndata: b\n\n")).toEqual([{ data: "a\nb" }])
    }
  })

  it("a stream that ends inside a UTF-8 character ends its last event with U+FFFD, not by dropping the bytes", () => {
    // the WHATWG Encoding standard's UTF-8 decode: an incomplete sequence at the end of the stream is one U+FFFD
    const p = makeSseParser()
    const euro = new TextEncoder().encode("€")
    expect(p.feed(new Uint8Array([...new TextEncoder().encode("data: 5"), ...euro.subarray(0, 2)]))).toEqual([])
    expect(p.end()).toEqual([{ data: "5\uFFFD" }])
  })
})
