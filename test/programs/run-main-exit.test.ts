// runMain's exit (src/programs/runMain.ts over layers/node/processExit.ts), in a child program whose stdout reader
// is slow: the exit waits for the output, and a SIGHUP during that wait neither kills the process (Node's default
// for a signal without a handler) nor loses the output.
import { spawn } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"

const repo = path.resolve(import.meta.dirname, "../..")
let dir = ""
beforeAll(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-run-main-exit-"))
  // 4 MiB on stdout, far more than a pipe holds: most of it waits in the process when the program ends
  fs.writeFileSync(
    path.join(dir, "program.mts"),
    `
import { Effect } from ${JSON.stringify(path.join(repo, "node_modules/effect/dist/index.js"))}
import { runMain } from ${JSON.stringify(path.join(repo, "src/programs/runMain.ts"))}
runMain(Effect.sync(() => {
  process.stdout.write(("x".repeat(1023) + "\\n").repeat(4096))
  // said once the program has ended and its exit waits for the reader (that wait lasts up to 1 s): the signal
  // must land in it, not before runMain's own set-up, when any program dies of it
  setTimeout(() => process.stderr.write("waiting\\n"), 50)
}))
`
  )
})
afterAll(() => {
  if (dir) fs.rmSync(dir, { recursive: true, force: true })
})

/** Runs the program, sends `signal` once it says its exit is waiting, reads stdout only 400 ms later. */
const run = (signal: NodeJS.Signals) =>
  new Promise<{ code: number | null; signal: NodeJS.Signals | null; bytes: number }>((resolve, reject) => {
    const child = spawn(process.execPath, [path.join(dir, "program.mts")], {
      cwd: repo,
      stdio: ["ignore", "pipe", "pipe"]
    })
    let bytes = 0
    child.stdout.pause()
    child.stderr.on("data", (b: Buffer) => {
      if (!b.toString().includes("waiting")) return
      child.kill(signal)
      setTimeout(() => {
        child.stdout.on("data", (chunk: Buffer) => {
          bytes += chunk.length
        })
        child.stdout.resume()
      }, 400)
    })
    const timer = setTimeout(() => {
      child.kill("SIGKILL")
      reject(new Error("the program did not exit within 20 s"))
    }, 20_000)
    child.once("close", (code, sig) => {
      clearTimeout(timer)
      resolve({ code, signal: sig, bytes })
    })
  })

describe("runMain's exit with output still waiting in a pipe", () => {
  it("a SIGHUP during the wait changes nothing: exit 0, every byte out", async () => {
    expect(await run("SIGHUP")).toEqual({ code: 0, signal: null, bytes: 4096 * 1024 })
  })
})
