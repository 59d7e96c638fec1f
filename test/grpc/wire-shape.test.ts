// The wire-format check every request passes before it is decoded (services/grpc/WireShape.ts): well-formed messages
// pass, unknown fields included; a field number 0, a group, an undefined wire type, a truncated field or varint, and
// the same inside a nested message are refused with where. The shapes are held to the proto's descriptor, so a
// message-typed field added to a request fails here until its shape says so.
import { fromBinary } from "@bufbuild/protobuf"
import { type DescriptorProto, FileDescriptorSetSchema } from "@bufbuild/protobuf/wkt"
import { describe, expect, it } from "vitest"
import { GenerateRequest } from "../../src/gen/cgn/agent/v1/agent.ts"
import { fileDescriptorSet } from "../../src/gen/descriptor.ts"
import { FLAT, GENERATE_REQUEST, type Shape, wireProblem } from "../../src/services/grpc/WireShape.ts"

const hex = (s: string) => Buffer.from(s.replaceAll(" ", ""), "hex")
const encoded = (r: Parameters<typeof GenerateRequest.fromPartial>[0]) =>
  GenerateRequest.encode(GenerateRequest.fromPartial(r)).finish()

describe("wireProblem", () => {
  it("well-formed requests pass: every field, nested messages and Struct values, unknown fields", () => {
    const full = encoded({
      requestId: "r",
      model: "m",
      chat: { messages: [{ role: "user", content: "hi" }] },
      sampling: { maxTokens: 5, temperature: 0.5, stop: ["x"], repetitionPenalty: 1.1 },
      kvTransferParams: { a: 1, b: "s", c: [true, null, { d: [1.5] }] },
      bootstrap: { host: "h", port: 1 },
      includeUsage: true
    })
    expect(wireProblem(full, GENERATE_REQUEST)).toBeUndefined()
    expect(wireProblem(encoded({ prompt: "p" }), GENERATE_REQUEST)).toBeUndefined()
    expect(wireProblem(new Uint8Array(), GENERATE_REQUEST)).toBeUndefined()
    // fields this version does not know (a newer router): varint 99, fixed64 100, bytes 101, fixed32 102
    const unknown = hex("98 06 01  a1 06 0102030405060708  aa 06 02 6869  b5 06 01020304")
    expect(wireProblem(Buffer.concat([encoded({ prompt: "p" }), unknown]), GENERATE_REQUEST)).toBeUndefined()
    // a known message field sent with another wire type is an unknown field to protobuf, not a message to walk
    expect(wireProblem(hex("28 00"), GENERATE_REQUEST)).toBeUndefined()
  })

  it("an unknown field numbered up to 2^29 - 1 passes: its tag is a 5-byte varint, read whole", () => {
    // field 2^25 and field 536870911 (protobuf's largest), varint 1: tags 2^28 and 2^32 - 8 (read as 28 bits: field 0)
    for (const tag of ["80 80 80 80 01", "f8 ff ff ff 0f"]) {
      expect(wireProblem(hex(`${tag} 01`), FLAT)).toBeUndefined()
      const request = Buffer.concat([encoded({ prompt: "p" }), hex(`${tag} 01`)])
      expect(wireProblem(request, GENERATE_REQUEST)).toBeUndefined()
      // what the generated decoder then reads: the known fields, the unknown one skipped
      expect(GenerateRequest.decode(request).prompt).toBe("p")
    }
  })

  it("what the generated decoders stop at silently is refused, with where (the Generate fuzz's cases)", () => {
    // a prompt, a zero tag, then sampling { max_tokens: 99999 }: the decoder stopped at the zero tag
    expect(wireProblem(hex("22 02 6869 00 00 2a 04 089f8d06"), GENERATE_REQUEST)).toBe(
      "field number 0 (at byte 4), which no message has"
    )
    // sampling holding a zero tag and then a prompt's bytes, which the decoder read as the request's prompt
    expect(wireProblem(hex("2a 05 00 22 02 6869"), GENERATE_REQUEST)).toBe(
      "in field 5: field number 0 (at byte 2), which no message has"
    )
    // an END_GROUP (field 1, wire type 4) and a START_GROUP
    expect(wireProblem(hex("22 01 61 0c"), GENERATE_REQUEST)).toBe(
      "field 1 is a group (wire type 4), which no message of this API holds"
    )
    expect(wireProblem(hex("0b 0c"), GENERATE_REQUEST)).toBe(
      "field 1 is a group (wire type 3), which no message of this API holds"
    )
    expect(wireProblem(hex("0e"), GENERATE_REQUEST)).toBe("field 1 has wire type 6, which protobuf does not define")
  })

  it("a tag of 2^32 or more is refused: the decoder reads its low 32 bits, a zero tag or another field (review)", () => {
    // prompt "hi", a tag of exactly 2^32 (a zero tag to the decoder, which stopped there), then max_tokens 99999
    const zero = hex("22 02 6869  80 80 80 80 10  2a 04 089f8d06")
    expect(wireProblem(zero, GENERATE_REQUEST)).toBe(
      "a field number above 536870911 (at byte 4), which protobuf does not allow"
    )
    // 2^32 + 42: field 5 (sampling) to the decoder, an unknown field to a 35-bit reading, its inside never walked
    expect(wireProblem(hex("aa 80 80 80 10 03 00 22 01"), GENERATE_REQUEST)).toMatch(/^a field number above 536870911/)
    // a tag written longer than it needs (zero continuation bytes) is the same tag to both: taken
    expect(wireProblem(hex("a2 80 80 80 00 01 61"), GENERATE_REQUEST)).toBeUndefined()
    expect(GenerateRequest.decode(hex("a2 80 80 80 00 01 61")).prompt).toBe("a")
  })

  it("truncated fields and varints are refused, the string that runs past the end said as such", () => {
    expect(wireProblem(hex("22 05 6869"), GENERATE_REQUEST)).toBe("field 4 says 5 bytes, but 2 are left (at byte 1)")
    // one byte over, at the request's end and inside sampling: caught by the length, before the walk reads on
    expect(wireProblem(hex("22 03 6869"), GENERATE_REQUEST)).toBe("field 4 says 3 bytes, but 2 are left (at byte 1)")
    expect(wireProblem(hex("2a 03 22 02 61 22 01 61"), GENERATE_REQUEST)).toBe(
      "in field 5: field 4 says 2 bytes, but 1 are left (at byte 3)"
    )
    expect(wireProblem(hex("28 ff"), GENERATE_REQUEST)).toBe("a varint runs past the end of its message (at byte 1)")
    expect(wireProblem(hex("28 ffffffffffffffffff ff 01"), GENERATE_REQUEST)).toBe(
      "a varint longer than 10 bytes (at byte 1)"
    )
    expect(wireProblem(hex("09 0102"), GENERATE_REQUEST)).toBe("field 1 runs past the end of its message")
    // a tag that runs past the end of sampling, though not past the request's
    expect(wireProblem(hex("2a 01 ff 22 01 61"), GENERATE_REQUEST)).toBe(
      "in field 5: a varint runs past the end of its message (at byte 2)"
    )
    // inside kv_transfer_params (a Struct): a Value whose string runs past its entry
    expect(wireProblem(hex("32 08 0a 06 0a 01 61 12 01 1a"), GENERATE_REQUEST)).toBe(
      "in field 6: in field 1: in field 2: a varint runs past the end of its message (at byte 10)"
    )
  })

  it("Struct nesting is bounded", () => {
    // kv_transfer_params { a: [[[...null...]]] }: a Value holding a ListValue holding a Value, n times
    // the request is depth 0, kv_transfer_params 1, its entry 2, the Value 3; each list adds 2, a leaf's Struct 1
    const deep = (n: number, leaf = "08 00"): Uint8Array => {
      let v: Uint8Array = hex(leaf)
      for (let i = 0; i < n; i++) {
        const list = Buffer.concat([hex("0a"), varintOf(v.length), v])
        v = Buffer.concat([hex("32"), varintOf(list.length), list])
      }
      const entry = Buffer.concat([hex("0a 01 61 12"), varintOf(v.length), v])
      const struct = Buffer.concat([hex("0a"), varintOf(entry.length), entry])
      return Buffer.concat([hex("32"), varintOf(struct.length), struct])
    }
    expect(wireProblem(deep(10), GENERATE_REQUEST)).toBeUndefined()
    // the reason alone: under its fields' path it outgrew the status message's bound (a P/D fuzz)
    expect(wireProblem(deep(60), GENERATE_REQUEST)).toBe(
      "messages nested more than 100 deep (kv_transfer_params: about 50 levels of lists or objects)"
    )
    // the bound exactly: an empty Struct (Value.struct_value "2a 00") at depth 100 passes, a Value at 101 does not
    expect(wireProblem(deep(48, "2a 00"), GENERATE_REQUEST)).toBeUndefined()
    expect(wireProblem(deep(49), GENERATE_REQUEST)).toMatch(/^messages nested more than 100 deep/)
  })
})

const varintOf = (n: number): Buffer => {
  const out: Array<number> = []
  let v = n
  while (v >= 0x80) {
    out.push((v & 0x7f) | 0x80)
    v = Math.floor(v / 128)
  }
  out.push(v)
  return Buffer.from(out)
}

describe("the shapes against the proto's descriptor", () => {
  const set = fromBinary(FileDescriptorSetSchema, fileDescriptorSet)
  const messages = new Map<string, DescriptorProto>()
  const index = (prefix: string, list: ReadonlyArray<DescriptorProto>) => {
    for (const m of list) {
      messages.set(`${prefix}.${m.name}`, m)
      index(`${prefix}.${m.name}`, m.nestedType)
    }
  }
  for (const f of set.file) index(`.${f.package}`, f.messageType)

  /** The message-typed field numbers of `type`, each with its own, to `depth` levels. */
  const expected = (type: string, depth: number): unknown => {
    const m = messages.get(type)!
    if (depth === 0) return "..."
    return Object.fromEntries(
      m.field
        .filter((f) => f.typeName !== "" && messages.has(f.typeName))
        .map((f) => [f.number, expected(f.typeName, depth - 1)])
    )
  }
  const actual = (shape: Shape, depth: number): unknown =>
    depth === 0 ? "..." : Object.fromEntries(Object.entries(shape).map(([n, s]) => [Number(n), actual(s(), depth - 1)]))

  it.each([
    [".cgn.agent.v1.GenerateRequest", GENERATE_REQUEST],
    [".cgn.agent.v1.ListModelsRequest", FLAT],
    [".cgn.agent.v1.GetNodeHealthRequest", FLAT]
  ])("%s", (type, shape) => {
    expect(actual(shape, 6)).toEqual(expected(type, 6))
  })
})
