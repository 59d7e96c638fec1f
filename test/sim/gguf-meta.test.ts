// The training context the simulator reads from a GGUF model's metadata (src/sim/ggufMeta.ts) as llama.cpp's
// loader does: `<general.architecture>.context_length` (src/llama-model-loader.cpp), past the keys ahead of it,
// string arrays included (ggml/src/gguf.cpp: n length-prefixed strings), which convert_hf_to_gguf.py writes
// among the general.* keys (general.tags, general.languages).
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { ggufContextLength } from "../../src/sim/ggufMeta.ts"
import { type GgufValue, gv, ValueType, writeGguf } from "../support/gguf.ts"

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gguf-meta-"))
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }))

const strings = (value: Array<string>): GgufValue => ({ type: ValueType.ARRAY, elementType: ValueType.STRING, value })

const model = (name: string, kvs: Array<[string, GgufValue]>): string => {
  const file = path.join(dir, name)
  fs.writeFileSync(file, writeGguf(new Map(kvs), []))
  return file
}

describe("ggufContextLength", () => {
  it("reads past string arrays ahead of the context length", () => {
    const file = model("tags.gguf", [
      ["general.architecture", gv.str("llama")],
      ["general.tags", strings(["text-generation", "llama", "a-longer-tag-than-eight-bytes"])],
      ["general.languages", strings(["en", "fr"])],
      ["llama.context_length", gv.u32(4096)]
    ])
    expect(ggufContextLength(file)).toBe(4096)
  })

  it("takes the architecture's own key, not llama's", () => {
    const file = model("qwen2.gguf", [
      ["general.architecture", gv.str("qwen2")],
      ["llama.context_length", gv.u32(1000)],
      ["qwen2.context_length", gv.u32(32768)]
    ])
    expect(ggufContextLength(file)).toBe(32768)
    const only = model("qwen2-only.gguf", [
      ["general.architecture", gv.str("qwen2")],
      ["qwen2.context_length", gv.u32(8192)]
    ])
    expect(ggufContextLength(only)).toBe(8192)
  })
})
