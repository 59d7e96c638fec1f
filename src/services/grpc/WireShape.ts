/**
 * A request's protobuf wire format, checked before it is decoded (pure). The generated decoders (ts-proto) stop
 * reading a message at a field number 0 or an END_GROUP tag, as protobufjs does, without an error: the fields after
 * it were dropped, or a nested message ended early and its parent read on from inside it, so a malformed request ran
 * as another one (a Generate fuzz: a prompt with a zero tag before max_tokens = 99999 ran without the limit check;
 * a prompt read out of the inside of `sampling`). protobuf-go and C++ refuse such bytes (protowire: "invalid field
 * number", an unmatched end group), and the agent refuses them as they do: INVALID_ARGUMENT, undecodable_request.
 *
 * Every field is walked by its wire type (https://protobuf.dev/programming-guides/encoding/); the length-delimited
 * fields that hold a message of the method's request type (its `Shape`) are walked inside too. Groups (wire types
 * 3 and 4) are refused: no message of this API holds one, and proto3 has none.
 */

/** The message-typed fields of a message, by field number (their shapes read when first walked: types nest). */
export interface Shape {
  readonly [field: number]: () => Shape
}

const LEAF: Shape = {}

/** google.protobuf.Struct and what it holds (google/protobuf/struct.proto); constants, so a walk allocates none. */
const VALUE: Shape = { 5: () => STRUCT, 6: () => LIST_VALUE }
const LIST_VALUE: Shape = { 1: () => VALUE }
const FIELDS_ENTRY: Shape = { 2: () => VALUE }
const STRUCT: Shape = { 1: () => FIELDS_ENTRY }
const CHAT_MESSAGES: Shape = { 1: () => LEAF }

/** cgn.agent.v1.GenerateRequest (proto/cgn/agent/v1/agent.proto): chat, sampling, kv_transfer_params, bootstrap. */
export const GENERATE_REQUEST: Shape = {
  3: () => CHAT_MESSAGES,
  5: () => LEAF,
  6: () => STRUCT,
  7: () => LEAF
}

/** A request message without message-typed fields (ListModelsRequest, GetNodeHealthRequest). */
export const FLAT: Shape = LEAF

/** 2^32: the generated decoders read tags and lengths as uint32, keeping the low 32 bits of a larger varint. */
const UINT32_END = 2 ** 32

/**
 * A varint at `at`, before `to`: its value when below 2^32, else UINT32_END (a tag or length the decoder would read
 * as another number), and where it ends.
 */
const varint = (b: Uint8Array, at: number, to: number): { readonly value: number; readonly end: number } | string => {
  let value = 0
  for (let i = 0; i < 10; i++) {
    if (at + i >= to) return `a varint runs past the end of its message (at byte ${at})`
    const byte = b[at + i]!
    value += (byte & 0x7f) * 2 ** (7 * i)
    if ((byte & 0x80) === 0) return { value: Math.min(value, UINT32_END), end: at + i + 1 }
  }
  return `a varint longer than 10 bytes (at byte ${at})`
}

/**
 * Struct nests without bound on the wire (each list or struct value two messages deeper); protobuf-go stops at 10,000
 * levels, this at 100, as the generated decoders' own reader does. Said alone, not under its fields' path, which at
 * that depth outgrew the status message's bound and hid the reason (a P/D fuzz).
 */
const TOO_DEEP = "messages nested more than 100 deep (kv_transfer_params: about 50 levels of lists or objects)"

/** Why `b[from, to)` is not a well-formed message of `shape`, or undefined. */
const walk = (b: Uint8Array, from: number, to: number, shape: Shape, depth: number): string | undefined => {
  if (depth > 100) return TOO_DEEP
  let at = from
  while (at < to) {
    const tag = varint(b, at, to)
    if (typeof tag === "string") return tag
    // Field numbers end at 2^29-1 (a tag below 2^32): a larger one is read by the decoder as its low 32 bits, a field
    // 0 among them, which the walk would have passed as an unknown field (protowire: "invalid field number").
    if (tag.value >= UINT32_END) return `a field number above 536870911 (at byte ${at}), which protobuf does not allow`
    const field = Math.floor(tag.value / 8)
    const wire = tag.value % 8
    if (field === 0) return `field number 0 (at byte ${at}), which no message has`
    at = tag.end
    switch (wire) {
      case 0: {
        const v = varint(b, at, to)
        if (typeof v === "string") return v
        at = v.end
        break
      }
      case 1:
        at += 8
        break
      case 5:
        at += 4
        break
      case 2: {
        const len = varint(b, at, to)
        if (typeof len === "string") return len
        if (len.end + len.value > to)
          return `field ${field} says ${len.value} bytes, but ${to - len.end} are left (at byte ${at})`
        const inner = shape[field]
        const why = inner === undefined ? undefined : walk(b, len.end, len.end + len.value, inner(), depth + 1)
        if (why !== undefined) return why === TOO_DEEP ? why : `in field ${field}: ${why}`
        at = len.end + len.value
        break
      }
      case 3:
      case 4:
        return `field ${field} is a group (wire type ${wire}), which no message of this API holds`
      default:
        return `field ${field} has wire type ${wire}, which protobuf does not define`
    }
    if (at > to) return `field ${field} runs past the end of its message`
  }
  return undefined
}

/** Why `bytes` is not a well-formed message of `shape`, or undefined when it is. */
export const wireProblem = (bytes: Uint8Array, shape: Shape): string | undefined =>
  walk(bytes, 0, bytes.length, shape, 0)
