#!/usr/bin/env node
// `npm test`'s last step: vitest, with llama-server's build (scripts/real-engine-build.mjs) running beside it
// instead of before it. On a cold machine the build is 6 minutes of the 2-core CI machine, and vitest leaves a
// share of the cores idle while its files wait on the processes they spawn; vitest.config.ts runs the files that
// need the binary (test/real/) last, and the build script makes them wait for this build (one build at a time per
// cache folder). A cached build returns at once. Arguments go to `vitest run`.
//
// The build runs in its own process group (cmake and the compilers with it), so that it can be stopped whole: on
// SIGINT or SIGTERM here, and when vitest ends first (it failed to start, or was given files that do not need the
// binary: what is built so far is discarded, the next run starts over).
import { spawn } from "node:child_process"
import { constants } from "node:os"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"

const root = fileURLToPath(new URL("..", import.meta.url))
const vitestBin = join(dirname(fileURLToPath(import.meta.resolve("vitest/package.json"))), "vitest.mjs")

const build = spawn(process.execPath, [join(root, "scripts/real-engine-build.mjs")], {
  cwd: root,
  stdio: ["ignore", "ignore", "inherit"],
  detached: true
})
let buildRunning = true
build.on("exit", () => {
  buildRunning = false
})
build.on("error", () => {
  buildRunning = false
})
const stopBuild = () => {
  if (!buildRunning) return
  try {
    process.kill(-build.pid, "SIGTERM")
  } catch {
    // already gone
  }
}

const vitest = spawn(process.execPath, [vitestBin, "run", ...process.argv.slice(2)], { cwd: root, stdio: "inherit" })
for (const signal of ["SIGINT", "SIGTERM"]) {
  process.on(signal, () => {
    stopBuild()
    // vitest shares the terminal's process group and so has a Ctrl-C of its own; a SIGTERM is passed on.
    if (signal === "SIGTERM") vitest.kill("SIGTERM")
  })
}
vitest.on("exit", (code, signal) => {
  if (buildRunning) process.stderr.write("real-engine: vitest ended before the llama-server build did; stopping it\n")
  stopBuild()
  process.exitCode = code ?? 128 + (constants.signals[signal] ?? 0)
})
