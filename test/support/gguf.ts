// A small GGUF reader and writer (version 3, little-endian), enough to copy a tokenizer out of a vocab-only
// file and write a tiny model with F32 tensors. The format is llama.cpp's `ggml/include/gguf.h` and
// `gguf-py/gguf/gguf_writer.py`: magic "GGUF", version, tensor count, KV count, the KV pairs, the tensor
// infos (name, dims, ggml type, offset), padding to `general.alignment` (32), then the tensor data, each
// tensor starting at an aligned offset.

import { SCALAR_SIZE } from "../../src/sim/ggufMeta.ts"

/** GGUF value types (`gguf-py/gguf/constants.py` GGUFValueType). */
export const ValueType = {
  UINT8: 0,
  INT8: 1,
  UINT16: 2,
  INT16: 3,
  UINT32: 4,
  INT32: 5,
  FLOAT32: 6,
  BOOL: 7,
  STRING: 8,
  ARRAY: 9,
  UINT64: 10,
  INT64: 11,
  FLOAT64: 12
} as const
export type ValueType = (typeof ValueType)[keyof typeof ValueType]

/** A typed metadata value; an array names its element type. */
export type GgufValue =
  | { readonly type: Exclude<ValueType, 9>; readonly value: number | bigint | boolean | string }
  | { readonly type: 9; readonly elementType: Exclude<ValueType, 9>; readonly value: ReadonlyArray<unknown> }

export interface GgufTensor {
  readonly name: string
  /** ggml order: dims[0] is the fastest-varying (a row's length). */
  readonly dims: ReadonlyArray<number>
  readonly data: Float32Array
}

const GGML_TYPE_F32 = 0
const ALIGNMENT = 32
const MAGIC = 0x46554747 // "GGUF" read as a little-endian uint32

/** The metadata of a GGUF file (tensor data is not read: the vocab file has none). */
export const readGgufMetadata = (buf: Uint8Array): Map<string, GgufValue> => {
  const view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength)
  let at = 0
  const u32 = () => {
    const v = view.getUint32(at, true)
    at += 4
    return v
  }
  const u64 = () => {
    const v = view.getBigUint64(at, true)
    at += 8
    return Number(v)
  }
  const str = () => {
    const n = u64()
    const s = new TextDecoder().decode(buf.subarray(at, at + n))
    at += n
    return s
  }
  const scalar = (t: ValueType): number | bigint | boolean | string => {
    const size = SCALAR_SIZE[t]
    let v: number | bigint | boolean
    switch (t) {
      case ValueType.STRING:
        return str()
      case ValueType.UINT8:
        v = view.getUint8(at)
        break
      case ValueType.INT8:
        v = view.getInt8(at)
        break
      case ValueType.UINT16:
        v = view.getUint16(at, true)
        break
      case ValueType.INT16:
        v = view.getInt16(at, true)
        break
      case ValueType.UINT32:
        v = view.getUint32(at, true)
        break
      case ValueType.INT32:
        v = view.getInt32(at, true)
        break
      case ValueType.FLOAT32:
        v = view.getFloat32(at, true)
        break
      case ValueType.BOOL:
        v = view.getUint8(at) !== 0
        break
      case ValueType.UINT64:
        v = view.getBigUint64(at, true)
        break
      case ValueType.INT64:
        v = view.getBigInt64(at, true)
        break
      case ValueType.FLOAT64:
        v = view.getFloat64(at, true)
        break
      default:
        throw new Error(`GGUF: unexpected value type ${t} at byte ${at}`)
    }
    at += size ?? 0
    return v
  }
  if (u32() !== MAGIC) throw new Error("GGUF: bad magic")
  const version = u32()
  if (version !== 3) throw new Error(`GGUF: version ${version}, expected 3`)
  u64() // tensor count
  const kvCount = u64()
  const out = new Map<string, GgufValue>()
  for (let i = 0; i < kvCount; i++) {
    const key = str()
    const type = u32() as ValueType
    if (type === ValueType.ARRAY) {
      const elementType = u32() as Exclude<ValueType, 9>
      const n = u64()
      const value: Array<unknown> = new Array(n)
      for (let j = 0; j < n; j++) value[j] = scalar(elementType)
      out.set(key, { type, elementType, value })
    } else {
      out.set(key, { type, value: scalar(type) } as GgufValue)
    }
  }
  return out
}

/** Serializes metadata and F32 tensors into one GGUF v3 file image. */
export const writeGguf = (metadata: ReadonlyMap<string, GgufValue>, tensors: ReadonlyArray<GgufTensor>): Buffer => {
  const parts: Array<Buffer> = []
  let size = 0
  const push = (b: Buffer) => {
    parts.push(b)
    size += b.length
  }
  const u32 = (v: number) => {
    const b = Buffer.alloc(4)
    b.writeUInt32LE(v)
    push(b)
  }
  const u64 = (v: number) => {
    const b = Buffer.alloc(8)
    b.writeBigUInt64LE(BigInt(v))
    push(b)
  }
  const str = (s: string) => {
    const b = Buffer.from(s, "utf8")
    u64(b.length)
    push(b)
  }
  const scalar = (t: ValueType, v: unknown) => {
    if (t === ValueType.STRING) return str(String(v))
    const b = Buffer.alloc(SCALAR_SIZE[t] ?? 0)
    switch (t) {
      case ValueType.UINT8:
        b.writeUInt8(Number(v))
        break
      case ValueType.INT8:
        b.writeInt8(Number(v))
        break
      case ValueType.UINT16:
        b.writeUInt16LE(Number(v))
        break
      case ValueType.INT16:
        b.writeInt16LE(Number(v))
        break
      case ValueType.UINT32:
        b.writeUInt32LE(Number(v))
        break
      case ValueType.INT32:
        b.writeInt32LE(Number(v))
        break
      case ValueType.FLOAT32:
        b.writeFloatLE(Number(v))
        break
      case ValueType.BOOL:
        b.writeUInt8(v ? 1 : 0)
        break
      case ValueType.UINT64:
        b.writeBigUInt64LE(BigInt(v as number | bigint))
        break
      case ValueType.INT64:
        b.writeBigInt64LE(BigInt(v as number | bigint))
        break
      case ValueType.FLOAT64:
        b.writeDoubleLE(Number(v))
        break
      default:
        throw new Error(`GGUF: cannot write value type ${t}`)
    }
    push(b)
  }
  const pad = () => {
    const n = (ALIGNMENT - (size % ALIGNMENT)) % ALIGNMENT
    if (n > 0) push(Buffer.alloc(n))
  }

  u32(MAGIC)
  u32(3)
  u64(tensors.length)
  u64(metadata.size)
  for (const [key, v] of metadata) {
    str(key)
    u32(v.type)
    if (v.type === ValueType.ARRAY) {
      u32(v.elementType)
      u64(v.value.length)
      for (const e of v.value) scalar(v.elementType, e)
    } else scalar(v.type, v.value)
  }
  let offset = 0
  for (const t of tensors) {
    const elements = t.dims.reduce((a, b) => a * b, 1)
    if (elements !== t.data.length) throw new Error(`GGUF: ${t.name} has ${t.data.length} values, dims say ${elements}`)
    str(t.name)
    u32(t.dims.length)
    for (const d of t.dims) u64(d)
    u32(GGML_TYPE_F32)
    u64(offset)
    offset += Math.ceil((elements * 4) / ALIGNMENT) * ALIGNMENT
  }
  pad()
  for (const t of tensors) {
    push(Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength))
    pad()
  }
  return Buffer.concat(parts, size)
}

/** Shorthands for metadata values. */
export const gv = {
  u32: (value: number): GgufValue => ({ type: ValueType.UINT32, value }),
  f32: (value: number): GgufValue => ({ type: ValueType.FLOAT32, value }),
  str: (value: string): GgufValue => ({ type: ValueType.STRING, value })
}
