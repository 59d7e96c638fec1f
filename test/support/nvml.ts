// The fake libnvidia-ml.so (test/fixtures/fake_nvml.c) compiled with the system C compiler, for the tests
// that run NvmlProbe through the real FFI: in-process (test/node/nvml.test.ts) or in a built agent (CGN_NVML_LIBRARY).
import { execFileSync, spawn } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterAll, beforeAll } from "vitest"

/**
 * Compiles the fake into `dir` and returns the library's path. `defines` (e.g. FAKE_NVML_NO_EVENTS) build a variant,
 * under a name of its own: a driver without some entry points (the header of fake_nvml.c lists them).
 */
export const buildFakeNvml = (dir: string, defines: ReadonlyArray<string> = []): string => {
  const variant = defines.map((d) => `-${d.toLowerCase()}`).join("")
  const library = path.join(dir, variant === "" ? "libnvidia-ml.so.1" : `libnvidia-ml${variant}.so.1`)
  const source = path.join(import.meta.dirname, "..", "fixtures", "fake_nvml.c")
  const flags = defines.map((d) => `-D${d}`)
  execFileSync("cc", ["-shared", "-fPIC", "-O1", ...flags, "-o", library, source], { stdio: "pipe" })
  return library
}

/**
 * Hangs every NVML call of the fake (FAKE_NVML_BLOCK_FILE) until `unblock`. A separate process removes the file
 * after `bound` ms whatever happens: code that made the call on the main thread would block the test's own timers
 * (its `unblock` included), and the test could then never end.
 */
export const blockNvml = (file: string, bound = 5_000): { readonly unblock: () => void } => {
  fs.writeFileSync(file, "")
  process.env.FAKE_NVML_BLOCK_FILE = file
  const watchdog = spawn(
    process.execPath,
    ["-e", `setTimeout(() => require("node:fs").rmSync(process.argv[1], { force: true }), ${bound})`, file],
    { stdio: "ignore" }
  )
  return {
    unblock: () => {
      fs.rmSync(file, { force: true })
      watchdog.kill()
      delete process.env.FAKE_NVML_BLOCK_FILE
    }
  }
}

/**
 * For a test file that runs agents on the fake: builds it in a temp dir (named `prefix`...) before the file's
 * tests, removes the dir after them. `dir` and `library` are read once the tests run.
 */
export const useFakeNvml = (prefix: string): { readonly dir: string; readonly library: string } => {
  const at = { dir: "", library: "" }
  beforeAll(() => {
    at.dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix))
    at.library = buildFakeNvml(at.dir)
  })
  afterAll(() => {
    if (at.dir) fs.rmSync(at.dir, { recursive: true, force: true })
  })
  return at
}
