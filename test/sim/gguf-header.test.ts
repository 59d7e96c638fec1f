// The one GGUF header walker (src/sim/ggufMeta.ts readGgufHeader) under the context length and the vocabulary:
// a file that is no GGUF, or one that ends early, is none (undefined, never a throw that would stop the simulator),
// and the file is closed in every case. The format: ggml/include/gguf.h (magic "GGUF", version, tensor count, KV
// count, then the KV pairs).
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { ggufContextLength, readGgufHeader } from "../../src/sim/ggufMeta.ts"
import { readSpmVocab } from "../../src/sim/spmVocab.ts"
import { gv, ValueType, writeGguf } from "../support/gguf.ts"

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gguf-header-"))
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }))

const bytes = writeGguf(
  new Map([
    ["general.architecture", gv.str("llama")],
    ["llama.context_length", gv.u32(4096)],
    ["tokenizer.ggml.model", gv.str("llama")],
    ["tokenizer.ggml.tokens", { type: ValueType.ARRAY, elementType: ValueType.STRING, value: ["<unk>", "<s>", "a"] }]
  ]),
  []
)
const write = (name: string, data: Uint8Array): string => {
  const file = path.join(dir, name)
  fs.writeFileSync(file, data)
  return file
}

/** This process's open file descriptors (Linux). */
const openFds = (): number => fs.readdirSync("/proc/self/fd").length

describe("readGgufHeader", () => {
  it("hands the reader the KV count of a GGUF file, and takes what the callback gives", () => {
    const file = write("ok.gguf", bytes)
    expect(readGgufHeader(file, (_r, kvs) => kvs)).toBe(4)
    expect(readGgufHeader(file, (r) => r.str())).toBe("general.architecture")
    expect([ggufContextLength(file), readSpmVocab(file)?.pieces]).toEqual([4096, ["<unk>", "<s>", "a"]])
  })

  it("a file without the GGUF magic is none, whatever follows it", () => {
    const wrong = Buffer.from(bytes)
    wrong.write("GGUX", 0, "latin1")
    const file = write("magic.gguf", wrong)
    expect(readGgufHeader(file, (_r, kvs) => kvs)).toBeUndefined()
    expect([ggufContextLength(file), readSpmVocab(file)]).toEqual([undefined, undefined])
  })

  it("a file that ends early (a download cut short) is none, not a throw; the file is closed each time", () => {
    // cut inside the token list, after the context length
    const cut = write("cut.gguf", bytes.subarray(0, Buffer.from(bytes).lastIndexOf("<s>") + 2))
    const before = openFds()
    for (let i = 0; i < 5; i++) {
      expect(ggufContextLength(cut)).toBe(4096) // the context length comes before the cut
      expect(readSpmVocab(cut)).toBeUndefined()
      expect(readGgufHeader(cut, (r, kvs) => Array.from({ length: kvs }, () => r.str()))).toBeUndefined()
    }
    expect(openFds()).toBe(before)
    expect(readGgufHeader(path.join(dir, "missing.gguf"), () => 1)).toBeUndefined()
  })
})
