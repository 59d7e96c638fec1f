import { readdirSync, readFileSync } from "node:fs"
import { join } from "node:path"
import { defineConfig } from "vitest/config"

/**
 * The test files that replace a module (`vi.mock`): a mock takes effect only where the module is loaded after it,
 * so these run in workers of their own; every other file shares its worker with the files before it.
 */
const mockingFiles = (readdirSync("test", { recursive: true, encoding: "utf8" }) as Array<string>)
  .filter((f) => f.endsWith(".test.ts"))
  .map((f) => join("test", f))
  .filter((f) => /\bvi\.(do)?[mM]ock\(/.test(readFileSync(f, "utf8")))

export default defineConfig({
  test: {
    // Tests spawn real processes (simulator, etcd, the agent); forks isolate their handles.
    pool: "forks",
    testTimeout: 60_000,
    hookTimeout: 60_000,
    // Three on the 2-core CI machine: the files mostly wait on the processes they spawn, and two workers kept the
    // cores 74% busy (README, Test prerequisites: three took the suite from 644 s to 537-627 s there)
    maxWorkers: 3,
    projects: [
      {
        extends: true,
        // A worker runs file after file without loading every module again for each: a quarter of the suite's CPU
        // went to that (1017 CPU-s against 764-780, README, The real-engine suite). A file must leave the process
        // as it found it (environment, timers, listeners), which it must anyway to be a test that runs alone.
        test: { name: "shared", include: ["test/**/*.test.ts"], exclude: mockingFiles, isolate: false }
      },
      { extends: true, test: { name: "mocking", include: mockingFiles, isolate: true } }
    ]
  }
})
