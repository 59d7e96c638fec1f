// What llama-server's loader says of a `-m` model file it cannot load, before a weight is read: the file does not
// open (ggml/src/gguf.cpp gguf_init_from_file), its GGUF header or tensor infos are not whole or not valid
// (gguf_init_from_reader), or its data section is shorter than its tensor infos say (src/llama-model-loader.h
// llama_tensor_weight: "data is not within the file bounds"), each in the loader's words (ggml-org/llama.cpp). Only
// the header and the tensor infos are read, a window at a time (ggufMeta.ts Reader); the data section is measured,
// never read. A check the simulator does not model (a tensor type without a block size, a dimension past 2^53)
// passes the file as whole.
import * as fs from "node:fs"
import { ARRAY, Reader, SCALAR_SIZE, STRING } from "./ggufMeta.ts"

/** ggml's [block size, bytes per block] by ggml_type (ggml/src/ggml.c type_traits; ggml/src/ggml-common.h blocks). */
const GGML_TYPES: Record<number, readonly [number, number]> = {
  0: [1, 4],
  1: [1, 2],
  2: [32, 18],
  3: [32, 20],
  6: [32, 22],
  7: [32, 24],
  8: [32, 34],
  9: [32, 36],
  10: [256, 84],
  11: [256, 110],
  12: [256, 144],
  13: [256, 176],
  14: [256, 210],
  15: [256, 292],
  16: [256, 66],
  17: [256, 74],
  18: [256, 98],
  19: [256, 50],
  20: [32, 18],
  21: [256, 110],
  22: [256, 82],
  23: [256, 136],
  24: [1, 1],
  25: [1, 2],
  26: [1, 4],
  27: [1, 8],
  28: [1, 8],
  29: [256, 56],
  30: [1, 2],
  34: [256, 54],
  35: [256, 66],
  39: [32, 17],
  40: [64, 36],
  41: [128, 18],
  42: [64, 18]
}
/** ggml/include/ggml.h GGML_TYPE_COUNT, GGML_MAX_NAME, GGML_MAX_DIMS; gguf.cpp's limits; gguf.h GGUF_VERSION. */
const GGML_TYPE_COUNT = 43
const GGML_MAX_NAME = 64
const GGML_MAX_DIMS = 4
const GGUF_MAX_STRING_LENGTH = 1024 * 1024 * 1024
const GGUF_MAX_ARRAY_ELEMENTS = 1024 * 1024 * 1024
const GGUF_VERSION = 3
const GGUF_DEFAULT_ALIGNMENT = 32
const ALIGNMENT_KEY = "general.alignment"
/** gguf.cpp gguf_type_name, by gguf_type. */
const TYPE_NAMES = ["u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64", "f64"]

/** strerror(errno) (glibc) for the errors opening a file for reading can give; node's code otherwise. */
const STRERROR: Record<string, string> = {
  ENOENT: "No such file or directory",
  EACCES: "Permission denied",
  ENOTDIR: "Not a directory",
  ELOOP: "Too many levels of symbolic links",
  ENAMETOOLONG: "File name too long",
  EPERM: "Operation not permitted"
}

/** The file cannot be loaded: the loader's own lines of that one attempt, level letter first. */
class Unloadable extends Error {
  readonly lines: ReadonlyArray<string>
  constructor(lines: ReadonlyArray<string>) {
    super(lines.join("\n"))
    this.lines = lines
  }
}
/** Not modelled: the file passes. */
class Unmodelled extends Error {}

const readerLine = (msg: string) => `E gguf_init_from_reader: ${msg}`
/** A gguf_init_from_reader failure: its lines, then the model loader's. */
const refuse = (file: string, ...msgs: Array<string>): never => {
  throw new Unloadable([
    ...msgs.map(readerLine),
    `E llama_model_load: error loading model: llama_model_loader: failed to load model from ${file}`
  ])
}

/** Runs `read`; a read past the file's end is `section`'s failure (gguf_reader::read returns false). */
const within = <T>(file: string, section: string, read: () => T): T => {
  try {
    return read()
  } catch (e) {
    if (e instanceof Unloadable || e instanceof Unmodelled) throw e
    return refuse(file, section)
  }
}

const isPrint = (c: number) => c >= 0x20 && c < 0x7f

/** gguf_reader::read(std::string): a length past what is left is logged (`read:`) before the section fails. */
const text = (r: Reader, size: number, file: string, section: string): string => {
  const n = within(file, section, () => r.u64())
  if (n > GGUF_MAX_STRING_LENGTH)
    refuse(file, `read: string length ${n} exceeds maximum ${GGUF_MAX_STRING_LENGTH}`, section)
  const left = size - r.offset
  if (n > left) refuse(file, `read: string length ${n} exceeds remaining file size ${left} bytes`, section)
  return within(file, section, () => r.utf8(n))
}

/** One KV value of `type` skipped as gguf_read_emplace_helper reads it; one that does not fit is refused. */
const skipValue = (r: Reader, size: number, file: string, type: number, n: number, array: boolean): void => {
  const section = "failed to read key-value pairs"
  if (type === STRING) {
    if (array && (n > GGUF_MAX_ARRAY_ELEMENTS || size - r.offset < n * 8)) refuse(file, section)
    for (let i = 0; i < n; i++) text(r, size, file, section)
    return
  }
  const each = SCALAR_SIZE[type] ?? 0
  if (array && n > GGUF_MAX_ARRAY_ELEMENTS) refuse(file, section)
  if (size - r.offset < n * each) refuse(file, section)
  r.skip(n * each)
}

/** Reads the file as gguf_init_from_reader does, up to its data section; a failure is thrown (Unloadable). */
const walk = (r: Reader, size: number, file: string): void => {
  if (size < 4) refuse(file, "failed to read magic")
  const magic = [0, 1, 2, 3].map(() => within(file, "failed to read magic", () => r.scalar(0)))
  if (String.fromCharCode(...magic) !== "GGUF") {
    const shown = magic.map((c) => (isPrint(c) ? String.fromCharCode(c) : "?")).join("")
    refuse(file, `invalid magic characters: '${shown}', expected 'GGUF'`)
  }
  const header = "failed to read header"
  const version = within(file, header, () => r.u32())
  if (version === 0) refuse(file, `bad GGUF version: ${version}`, header)
  if ((version & 0xffff) === 0)
    refuse(
      file,
      `failed to load model: this GGUF file version ${version} is extremely large, is there a mismatch between the host and model endianness?`,
      header
    )
  if (version === 1) refuse(file, "GGUFv1 is no longer supported, please use a more up-to-date version", header)
  if (version > GGUF_VERSION)
    refuse(
      file,
      `this GGUF file is version ${version} but this software only supports up to version ${GGUF_VERSION}`,
      header
    )
  const nTensors = within(file, header, () => r.u64())
  const nKv = within(file, header, () => r.u64())
  if (nTensors > Number.MAX_SAFE_INTEGER || nKv > Number.MAX_SAFE_INTEGER) throw new Unmodelled()

  const kvSection = "failed to read key-value pairs"
  const keys = new Set<string>()
  let alignment = GGUF_DEFAULT_ALIGNMENT
  for (let i = 0; i < nKv; i++) {
    const key = text(r, size, file, kvSection)
    if (key === "") refuse(file, `key ${i} is empty`, kvSection)
    if (keys.has(key)) {
      const j = [...keys].indexOf(key)
      refuse(file, `duplicate key '${key}' for tensors ${j} and ${i} `, kvSection)
    }
    keys.add(key)
    let type = within(file, kvSection, () => r.u32())
    const array = type === ARRAY
    let n = 1
    if (array) {
      type = within(file, kvSection, () => r.u32())
      n = within(file, kvSection, () => r.u64())
    }
    if (type !== STRING && SCALAR_SIZE[type] === undefined)
      refuse(file, `key '${key}' has invalid GGUF type ${type}`, kvSection)
    if (key === ALIGNMENT_KEY && (array || type !== 4))
      refuse(file, `key '${ALIGNMENT_KEY}' must be of type u32 but is ${array ? "arr" : (TYPE_NAMES[type] ?? "")}`)
    if (key === ALIGNMENT_KEY) alignment = within(file, kvSection, () => r.u32())
    else skipValue(r, size, file, type, n, array)
  }
  if (alignment === 0 || (alignment & (alignment - 1)) !== 0) refuse(file, `alignment ${alignment} is not a power of 2`)

  const infoSection = "failed to read tensor info"
  const names = new Set<string>()
  const tensors: Array<{ name: string; bytes: bigint; offset: number }> = []
  for (let i = 0; i < nTensors; i++) {
    const name = text(r, size, file, infoSection)
    if (name.length >= GGML_MAX_NAME)
      refuse(file, `tensor name ${i} is too long: ${name.length} >= ${GGML_MAX_NAME}`, infoSection)
    if (names.has(name))
      refuse(file, `duplicate tensor name '${name}' for tensors ${[...names].indexOf(name)} and ${i}`, infoSection)
    names.add(name)
    const nDims = within(file, infoSection, () => r.u32())
    if (nDims > GGML_MAX_DIMS)
      refuse(file, `tensor '${name}' has invalid number of dimensions: ${nDims} > ${GGML_MAX_DIMS}`, infoSection)
    const ne = Array.from({ length: nDims }, () => within(file, infoSection, () => r.u64()))
    if (ne.some((d) => d > Number.MAX_SAFE_INTEGER)) throw new Unmodelled()
    const type = within(file, infoSection, () => r.u32())
    if (type >= GGML_TYPE_COUNT)
      refuse(
        file,
        `tensor '${name}' has invalid ggml type ${type | 0}. should be in [0, ${GGML_TYPE_COUNT})`,
        infoSection
      )
    const traits = GGML_TYPES[type]
    if (traits === undefined || (ne[0] ?? 1) % traits[0] !== 0) throw new Unmodelled()
    const elements = ne.reduce((a, d) => a * BigInt(d), 1n)
    const bytes = (elements / BigInt(traits[0])) * BigInt(traits[1])
    tensors.push({ name, bytes, offset: within(file, infoSection, () => r.u64()) })
  }

  // the data section starts aligned (gguf_init_from_reader); each tensor's offset is the padded sizes before it
  const pad = (x: bigint) => ((x + BigInt(alignment) - 1n) / BigInt(alignment)) * BigInt(alignment)
  const dataStart = pad(BigInt(r.offset))
  if (nTensors > 0 && dataStart > BigInt(size)) refuse(file, "failed to seek to beginning of data section")
  let expected = 0n
  for (const t of tensors) {
    if (BigInt(t.offset) !== expected)
      refuse(file, `tensor '${t.name}' has offset ${t.offset}, expected ${expected}`, "failed to read tensor data")
    expected += pad(t.bytes)
  }
  // llama_model_loader, tensor by tensor in the file's order (llama_tensor_weight)
  const outside = tensors.find((t) => dataStart + BigInt(t.offset) + t.bytes > BigInt(size))
  if (outside !== undefined)
    throw new Unloadable([
      `E llama_model_load: error loading model: tensor '${outside.name}' data is not within the file bounds, model is corrupted or incomplete`
    ])
}

/**
 * The lines llama-server's loader prints in one attempt to load `file` (level letter first, before the
 * `llama_model_load_from_file_impl: failed to load model` that ends each attempt), or undefined when it would load.
 */
export const llamaModelFileFault = (file: string): ReadonlyArray<string> | undefined => {
  let fd: number
  try {
    fd = fs.openSync(file, "r")
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code ?? "EIO"
    return [
      `E gguf_init_from_file: failed to open GGUF file '${file}' (${STRERROR[code] ?? code})`,
      `E llama_model_load: error loading model: llama_model_loader: failed to load model from ${file}`
    ]
  }
  try {
    const stat = fs.fstatSync(fd)
    // fopen opens a directory, whose first read fails
    walk(new Reader(fd), stat.isDirectory() ? 0 : stat.size, file)
    return undefined
  } catch (e) {
    if (e instanceof Unloadable) return e.lines
    return undefined
  } finally {
    fs.closeSync(fd)
  }
}
