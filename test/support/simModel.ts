// A model file for tests that run the simulator's llama_cpp flavor and do not care what the model is: llama-server,
// and so the simulator, exits at start on a `-m` path that is no loadable GGUF file (src/sim/modelFile.ts). The file
// is a GGUF header with no metadata and no tensors (test/support/gguf.ts), which the simulator loads as a model
// without a training context or vocabulary (its context from -c, its prompts counted in words) as before; the real
// llama-server would refuse it (no architecture). Written once per test process, under its own temp dir, named
// as asked so that the served name (the file's base name) stays what the tests expect.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { writeGguf } from "./gguf.ts"

let dir: string | undefined

/** The path of an empty GGUF model named `name` (e.g. "m.gguf"). */
export const simGguf = (name = "m.gguf"): string => {
  if (dir === undefined) {
    const made = fs.mkdtempSync(path.join(os.tmpdir(), "sim-gguf-"))
    process.once("exit", () => fs.rmSync(made, { recursive: true, force: true }))
    dir = made
  }
  const file = path.join(dir, name)
  if (!fs.existsSync(file)) fs.writeFileSync(file, writeGguf(new Map(), []))
  return file
}
