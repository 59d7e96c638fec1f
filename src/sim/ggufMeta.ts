// Reads one number from a GGUF file's metadata, the model's training context (`<arch>.context_length`), the way
// llama.cpp's loader finds it (ggml/src/gguf.cpp gguf_init_from_file; src/llama-model-loader.cpp LLM_KV_CONTEXT_LENGTH).
// Only the header is read, a window at a time: a model file can be gigabytes, its metadata is at its start.
import * as fs from "node:fs"

/** GGUF value types (ggml/include/gguf.h enum gguf_type) and the fixed sizes of the scalar ones. */
export const SCALAR_SIZE: Record<number, number> = {
  0: 1,
  1: 1,
  2: 2,
  3: 2,
  4: 4,
  5: 4,
  6: 4,
  7: 1,
  10: 8,
  11: 8,
  12: 8
}
export const STRING = 8
export const ARRAY = 9

/** A GGUF header reader (readGgufHeader hands one out): reads a window of the file at a time. */
export class Reader {
  private buf = Buffer.alloc(0)
  private start = 0
  private pos = 0
  private readonly fd: number
  constructor(fd: number) {
    this.fd = fd
  }

  private need(n: number): void {
    const end = this.start + this.buf.length
    if (this.pos + n <= end) return
    const size = Math.max(n, 1 << 16)
    const b = Buffer.alloc(size)
    const got = fs.readSync(this.fd, b, 0, size, this.pos)
    if (got < n) throw new Error("truncated GGUF")
    this.buf = b.subarray(0, got)
    this.start = this.pos
  }
  u32(): number {
    this.need(4)
    const v = this.buf.readUInt32LE(this.pos - this.start)
    this.pos += 4
    return v
  }
  u64(): number {
    this.need(8)
    const v = Number(this.buf.readBigUInt64LE(this.pos - this.start))
    this.pos += 8
    return v
  }
  str(): string {
    return this.utf8(this.u64())
  }
  /** The next `n` bytes as UTF-8 text. */
  utf8(n: number): string {
    this.need(n)
    const s = this.buf.toString("utf8", this.pos - this.start, this.pos - this.start + n)
    this.pos += n
    return s
  }
  /** Where the next read starts, from the file's first byte. */
  get offset(): number {
    return this.pos
  }
  f32(): number {
    this.need(4)
    const v = this.buf.readFloatLE(this.pos - this.start)
    this.pos += 4
    return v
  }
  skip(n: number): void {
    this.pos += n
  }
  /** A scalar of `type` as a number (integers only are asked for). */
  scalar(type: number): number {
    const size = SCALAR_SIZE[type] ?? 0
    this.need(size)
    const o = this.pos - this.start
    const v =
      size === 8
        ? Number(this.buf.readBigUInt64LE(o))
        : size === 4
          ? this.buf.readUInt32LE(o)
          : this.buf.readUIntLE(o, size)
    this.pos += size
    return v
  }
  skipValue(type: number): void {
    if (type === STRING) this.skip(this.u64())
    else if (type !== ARRAY) this.skip(SCALAR_SIZE[type] ?? 0)
    else {
      const inner = this.u32()
      const n = this.u64()
      if (inner !== STRING && inner !== ARRAY) this.skip(n * (SCALAR_SIZE[inner] ?? 0))
      else for (let i = 0; i < n; i++) this.skipValue(inner)
    }
  }
}

/**
 * Opens `file` and runs `read` over its metadata: the reader at the first key and the number of key/value pairs
 * (`read` reads or skips each). undefined when the file is missing, is no GGUF, or ends early; closed in every case.
 */
export const readGgufHeader = <T>(file: string, read: (r: Reader, kvs: number) => T | undefined): T | undefined => {
  let fd: number
  try {
    fd = fs.openSync(file, "r")
  } catch {
    return undefined
  }
  try {
    const r = new Reader(fd)
    if (r.u32() !== 0x46554747) return undefined // "GGUF", little-endian
    r.u32() // version
    r.u64() // tensor count
    return read(r, r.u64())
  } catch {
    return undefined
  } finally {
    fs.closeSync(fd)
  }
}

/** The model's `<general.architecture>.context_length`, or undefined when the file is missing or no GGUF. */
export const ggufContextLength = (file: string): number | undefined =>
  readGgufHeader(file, (r, kvs) => {
    let arch: string | undefined
    const lengths = new Map<string, number>()
    for (let i = 0; i < kvs; i++) {
      const key = r.str()
      const type = r.u32()
      if (key === "general.architecture" && type === STRING) arch = r.str()
      else if (key.endsWith(".context_length") && SCALAR_SIZE[type] !== undefined) lengths.set(key, r.scalar(type))
      else r.skipValue(type)
      const found = arch === undefined ? undefined : lengths.get(`${arch}.context_length`)
      if (found !== undefined) return found
    }
    return undefined
  })
