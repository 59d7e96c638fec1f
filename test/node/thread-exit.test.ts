// The process's exit past a worker thread stuck in a native call (src/layers/node/threadExit.ts): a child
// program whose worker sleeps 60 s inside libc's sleep() through koffi (as the NVML worker sits inside a hung
// NVML call) exits at once with its code and its 'exit' event; process.exit() alone would wait the 60 s.
import { spawn } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"

const repo = path.resolve(import.meta.dirname, "../..")
let dir = ""
beforeAll(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-thread-exit-"))
})
afterAll(() => {
  if (dir) fs.rmSync(dir, { recursive: true, force: true })
})

/** A program with one worker inside a 60 s native sleep; `ending` says whether it is told to end first. */
const program = (ending: boolean) => `
import { Worker } from "node:worker_threads"
import { writeSync } from "node:fs"
import { endWorker, exitProcess, workersHoldingExit } from ${JSON.stringify(path.join(repo, "src/layers/node/threadExit.ts"))}
// loaded first, as the NVML layer has loaded it before its worker is ended
await import(${JSON.stringify(path.join(repo, "node_modules/koffi/index.js"))})
const worker = new Worker(\`
  const koffi = require(\${JSON.stringify(${JSON.stringify(path.join(repo, "node_modules/koffi"))})})
  const sleep = koffi.load(null).func("unsigned int sleep(unsigned int)")
  require("node:worker_threads").parentPort.postMessage("asleep")
  sleep(60)
\`, { eval: true })
worker.once("message", async () => {
  ${ending ? "endWorker(worker)" : ""}
  // the exit comes turns after the release, as the daemon's does after its layers' finalizers
  await new Promise((resolve) => setImmediate(resolve))
  process.on("exit", (code) => writeSync(1, \`exit event \${code}, holding \${workersHoldingExit()}\\n\`))
  exitProcess(3)
})
`

const run = (file: string, boundMs: number) =>
  new Promise<{ code: number | null; out: string; ms: number }>((resolve, reject) => {
    const started = Date.now()
    const child = spawn(process.execPath, [file], { stdio: ["ignore", "pipe", "inherit"] })
    let out = ""
    child.stdout.on("data", (b: Buffer) => {
      out += b.toString()
    })
    const timer = setTimeout(() => {
      child.kill("SIGKILL")
      reject(new Error(`the program had not exited after ${boundMs} ms (out: ${out})`))
    }, boundMs)
    child.once("exit", (code) => {
      clearTimeout(timer)
      resolve({ code, out, ms: Date.now() - started })
    })
  })

describe("exitProcess", () => {
  it("exits with its code and the 'exit' event while a worker told to end is still inside a native call", async () => {
    const file = path.join(dir, "ending.mjs")
    fs.writeFileSync(file, program(true))
    // well under the worker's 60 s sleep: a bound, not a wait (the exit comes as soon as the program decides)
    const { code, out } = await run(file, 30_000)
    expect(code).toBe(3)
    expect(out).toBe("exit event 3, holding 1\n")
  })

  it("leaves a worker nobody told to end to Node's own exit, which interrupts it when it returns (control)", async () => {
    // the same worker, not ended: exitProcess is process.exit, the count is 0, and the exit waits for the sleep;
    // killed at the bound, the run shows that Node's exit is what held before
    const file = path.join(dir, "plain.mjs")
    fs.writeFileSync(file, program(false))
    await expect(run(file, 3_000)).rejects.toThrow(/had not exited after 3000 ms \(out: exit event 3, holding 0/)
  })
})
