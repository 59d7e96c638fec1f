// services/grpc/Wire.ts, the gRPC-over-HTTP/2 byte rules the agent's server runs on, tested directly:
// message framing across any chunking, the size limit decided on the prefix, grpc-timeout, grpc-message.
import { describe, expect, it } from "vitest"
import {
  encodeStatusMessage,
  formatTimeout,
  frameMessage,
  isGrpcContentType,
  MessageReader,
  parseTimeout,
  reservedTrailer
} from "../../src/services/grpc/Wire.ts"

const bytes = (...xs: Array<number>) => Uint8Array.from(xs)
const concat = (...parts: Array<Uint8Array>) => {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0))
  let at = 0
  for (const p of parts) {
    out.set(p, at)
    at += p.length
  }
  return out
}

describe("frameMessage", () => {
  it("writes the flag 0, the big-endian length and the body", () => {
    expect([...frameMessage(bytes(7, 8, 9))]).toEqual([0, 0, 0, 0, 3, 7, 8, 9])
    const big = frameMessage(new Uint8Array(0x01020304 & 0xffff))
    expect([...big.subarray(0, 5)]).toEqual([0, 0, 0, 0x03, 0x04])
  })
})

describe("MessageReader", () => {
  const a = frameMessage(bytes(1, 2, 3))
  const b = frameMessage(bytes())
  const c = frameMessage(new Uint8Array(300).fill(5))
  const stream = concat(a, b, c)

  it("reads every message whatever the chunking, one byte at a time included", () => {
    for (const size of [1, 2, 3, 5, 7, 64, stream.length]) {
      const reader = new MessageReader(1000)
      const got: Array<Array<number>> = []
      for (let i = 0; i < stream.length; i += size) {
        const r = reader.push(stream.subarray(i, i + size))
        if (!Array.isArray(r)) throw new Error("unexpected OverLimit")
        for (const m of r) got.push([...m.body])
      }
      expect(got).toEqual([[1, 2, 3], [], new Array(300).fill(5)])
      expect(reader.pending).toBe(0)
    }
  })

  it("hands back one exact message without a copy", () => {
    const r = new MessageReader(10).push(a)
    expect(Array.isArray(r) && r[0]!.body.buffer).toBe(a.buffer)
  })

  it("reports the compressed flag", () => {
    const z = frameMessage(bytes(9))
    z[0] = 1
    const r = new MessageReader(10).push(z)
    expect(Array.isArray(r) && r[0]!.compressed).toBe(true)
  })

  it("refuses a message over the limit on its prefix, before the body arrives", () => {
    const reader = new MessageReader(299)
    expect(reader.push(c.subarray(0, 5))).toEqual({ _tag: "OverLimit", length: 300 })
    expect(new MessageReader(299).push(concat(a, c.subarray(0, 6)))).toEqual({ _tag: "OverLimit", length: 300 })
  })

  it("gathers a message spread over many chunks in linear time and memory, however small the chunks (gathering every chunk again on each one was quadratic: 100 ms for 4 MiB)", () => {
    const body = new Uint8Array(64 * 1024).map((_, i) => i & 0xff)
    const framed = concat(frameMessage(body), a)
    // 16 KiB DATA frames as a client sends them, then 3-byte pieces: the second message's prefix spans chunks.
    for (const size of [16_384, 3]) {
      const allocations: Array<number> = []
      const reader = new MessageReader(1 << 20, (n) => {
        allocations.push(n)
        return new Uint8Array(n)
      })
      const got: Array<Uint8Array> = []
      for (let i = 0; i < framed.length; i += size) {
        const r = reader.push(framed.subarray(i, i + size))
        if (!Array.isArray(r)) throw new Error("unexpected OverLimit")
        for (const m of r) got.push(m.body)
      }
      expect(got.map((m) => Buffer.from(m).toString("hex"))).toEqual(
        [body, bytes(1, 2, 3)].map((m) => Buffer.from(m).toString("hex"))
      )
      expect(reader.pending).toBe(0)
      // The buffer grows by doubling into the message's size: a few allocations, a few times the message in all.
      const big = allocations.filter((n) => n > 8)
      expect(big.at(-1)).toBe(5 + body.length)
      expect(big.length).toBeLessThan(20)
      expect(big.reduce((x, y) => x + y, 0)).toBeLessThan(4 * (5 + body.length))
    }
  })

  it("keeps a partial message pending (a request ending there is truncated)", () => {
    const reader = new MessageReader(1000)
    expect(reader.push(c.subarray(0, 100))).toEqual([])
    expect(reader.pending).toBe(100)
  })
})

describe("isGrpcContentType", () => {
  it("is application/grpc alone, with a +subtype or with parameters; not grpc-web or other types", () => {
    for (const ok of [
      "application/grpc",
      "application/grpc+proto",
      "application/grpc+json",
      "application/grpc;charset=utf-8"
    ])
      expect(isGrpcContentType(ok), ok).toBe(true)
    for (const no of [
      undefined,
      "",
      "application/grpc-web",
      "application/grpc-web+proto",
      "application/grpcx",
      "text/plain"
    ])
      expect(isGrpcContentType(no), String(no)).toBe(false)
  })
})

describe("parseTimeout", () => {
  it("reads every unit in milliseconds, rounding up", () => {
    expect(parseTimeout("2H")).toBe(7_200_000)
    expect(parseTimeout("3M")).toBe(180_000)
    expect(parseTimeout("5S")).toBe(5_000)
    expect(parseTimeout("250m")).toBe(250)
    expect(parseTimeout("1500u")).toBe(2)
    expect(parseTimeout("1n")).toBe(1)
    expect(parseTimeout("0m")).toBe(0)
    expect(parseTimeout("99999999S")).toBe(99_999_999_000)
  })
  it("absent is undefined; anything else is invalid", () => {
    expect(parseTimeout(undefined)).toBeUndefined()
    for (const bad of ["", "5", "S", "123456789S", "5s", "-1S", "1.5S", " 5S"])
      expect(parseTimeout(bad)).toBe("invalid")
  })
})

describe("formatTimeout", () => {
  it("the finest unit within 8 digits, rounded up, so the callee never reads an earlier deadline", () => {
    expect(formatTimeout(1_000)).toBe("1000m")
    expect(formatTimeout(0.2)).toBe("1m")
    expect(formatTimeout(99_999_999)).toBe("99999999m")
    expect(formatTimeout(100_000_000)).toBe("100000S")
    expect(formatTimeout(2_147_483_000)).toBe("2147483S")
    expect(formatTimeout(99_999_999_001)).toBe("1666667M")
    expect(formatTimeout(1e14)).toBe("27777778H")
    expect(formatTimeout(1e20)).toBe("99999999H")
    for (const ms of [0, 1, 999, 1_000, 123_456_789, 2_147_483_000, 6e12]) {
      const read = parseTimeout(formatTimeout(ms))
      expect(typeof read === "number" && read >= ms).toBe(true)
    }
  })
})

describe("encodeStatusMessage", () => {
  it("leaves printable ASCII as it is", () => {
    expect(encodeStatusMessage("engine answered HTTP 400: bad {json} (x)")).toBe(
      "engine answered HTTP 400: bad {json} (x)"
    )
  })
  it("percent-encodes UTF-8 bytes, controls and % itself", () => {
    expect(encodeStatusMessage("100% é\n")).toBe("100%25 %C3%A9%0A")
    expect(decodeURIComponent(encodeStatusMessage("日本 %"))).toBe("日本 %")
  })
})

describe("reservedTrailer", () => {
  it("keeps handlers off the transport's own keys", () => {
    for (const k of [":status", "grpc-status", "grpc-message", "content-type", "te"])
      expect(reservedTrailer(k)).toBe(true)
    expect(reservedTrailer("cgn-error-source")).toBe(false)
  })
})
