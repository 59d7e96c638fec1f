// The fake libnvidia-ml.so (test/fixtures/fake_nvml.c) compiled with the system C compiler, for the tests
// that run NvmlProbe through the real FFI: in-process (test/node/nvml.test.ts) or in a built agent (CGN_NVML_LIBRARY).
import { execFileSync } from "node:child_process"
import * as path from "node:path"

/** Compiles the fake into `dir` and returns the library's path. */
export const buildFakeNvml = (dir: string): string => {
  const library = path.join(dir, "libnvidia-ml.so.1")
  const source = path.join(import.meta.dirname, "..", "fixtures", "fake_nvml.c")
  execFileSync("cc", ["-shared", "-fPIC", "-O1", "-o", library, source], { stdio: "pipe" })
  return library
}
