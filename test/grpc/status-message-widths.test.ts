// What status-message.test.ts left open in the bound on grpc-message (services/grpc/StatusMessage.ts), found by a
// mutation audit: the bytes counted for each character must be the bytes sent at every UTF-8 and printable-ASCII
// edge (an undercount sends more than the 1 KiB bound, an overcount cuts a message that fits), a pair at the top of
// Unicode (U+10FFFF: high surrogate 0xDBFF, low 0xDFFF) is a pair, and a cut keeps as much as fits beside its marker.
import { describe, expect, it } from "vitest"
import { boundStatusMessage, MAX_STATUS_MESSAGE_BYTES, quoteInput } from "../../src/services/grpc/StatusMessage.ts"
import { encodeStatusMessage } from "../../src/services/grpc/Wire.ts"

const MAX = MAX_STATUS_MESSAGE_BYTES

describe("boundStatusMessage counts each character as the bytes it is sent as", () => {
  // The first and last character of each width on the wire (Wire.ts encodeStatusMessage: printable ASCII but "%" as
  // is, anything else %XX per UTF-8 byte): space and "~" (1), a control character, DEL and "%" (3), U+0080 and
  // U+07FF (2 UTF-8 bytes: 6), U+0800 and U+FFFF (3 bytes: 9), U+10000 and U+10FFFF (4 bytes: 12), U+10FC00.
  const edges = [
    " ",
    "~",
    "\x1f",
    "\x7f",
    "%",
    "\x80",
    "\u07ff",
    "\u0800",
    "\uffff",
    "\u{10000}",
    "\u{10fc00}",
    "\u{10ffff}"
  ]

  it.each(edges.map((c) => [JSON.stringify(c), c]))(
    "%s: as many as fit go whole; one more is cut, within the bound",
    (_name, c) => {
      const width = encodeStatusMessage(c).length
      const fits = Math.floor(MAX / width)
      // whole: counting it wider would cut a message every client takes
      expect(boundStatusMessage(c.repeat(fits))).toBe(encodeStatusMessage(c.repeat(fits)))
      // one more: counting it narrower would send it whole, past the bound
      const wire = boundStatusMessage(c.repeat(fits + 1))
      expect(wire.length).toBeLessThanOrEqual(MAX)
      const text = decodeURIComponent(wire)
      expect(text).toMatch(/… \(\d+ more characters\)$/)
      // and the cut falls between characters: the kept text is whole characters of the message
      const kept = text.slice(0, text.lastIndexOf("…"))
      expect(kept).toBe(c.repeat([...kept].length))
    }
  )

  it("a cut keeps every character that fits beside the marker at its widest (1025 'a's: 992 kept, 33 counted)", () => {
    // The marker's room is reserved for the widest count it could say (the message's length, 4 digits here):
    // "%E2%80%A6 (1025 more characters)" is 32 bytes, so 1024 - 32 = 992 characters are kept, not one fewer.
    expect(boundStatusMessage("a".repeat(MAX + 1))).toBe(`${"a".repeat(992)}%E2%80%A6 (33 more characters)`)
  })
})

describe("quoteInput reads U+10FFFF as one character", () => {
  it("64 of them shown, as escaped pairs, and the count in characters", () => {
    expect(quoteInput("\u{10ffff}".repeat(70))).toBe(`"${"\\udbff\\udfff".repeat(64)}"... (70 characters)`)
  })
})
