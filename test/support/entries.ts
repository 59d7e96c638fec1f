// Which file a test runs a program from: the build (dist/, bundled: `node dist/main.js --version` starts in ~0.5 s
// here) while it is newer than every source file, else the source itself (Node 24 strips its types; ~1.3 s, as each
// module loads on its own). `npm test` builds before vitest, so the suite runs the build, what users run; a test run
// after an edit to src/ without a build runs the source, never a stale build. The CLI and simulator tests spawn these
// hundreds of times: from source they were over a quarter of the suite's time.
import * as fs from "node:fs"
import * as path from "node:path"
import { fileURLToPath } from "node:url"

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..")
const BUILT = ["dist/main.js", "dist/programs/bundle-entry.js", "dist/programs/sim.js"].map((f) => path.join(root, f))

const newestUnder = (dir: string): number => {
  let newest = 0
  for (const entry of fs.readdirSync(dir, { withFileTypes: true, recursive: true })) {
    if (!entry.isFile()) continue
    newest = Math.max(newest, fs.statSync(path.join(entry.parentPath, entry.name)).mtimeMs)
  }
  return newest
}

const oldestBuilt = (): number | undefined => {
  try {
    return Math.min(...BUILT.map((f) => fs.statSync(f).mtimeMs))
  } catch {
    return undefined // not built
  }
}

let fresh: boolean | undefined
/** Whether dist/ holds a build of the sources as they are now (checked once per test process). */
export const distFresh = (): boolean => {
  if (fresh === undefined) {
    const built = oldestBuilt()
    fresh = built !== undefined && built >= newestUnder(path.join(root, "src"))
  }
  return fresh
}

/** The agent's command line entry: dist/main.js, or src/main.ts when the build is missing or older than src/. */
export const cliEntry = (): string => path.join(root, distFresh() ? "dist/main.js" : "src/main.ts")

/** The simulator's entry: dist/programs/sim.js, or src/programs/sim.ts when the build is missing or stale. */
export const simProgram = (): string => path.join(root, distFresh() ? "dist/programs/sim.js" : "src/programs/sim.ts")
