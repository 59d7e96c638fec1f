// The process's exit (src/layers/node/processExit.ts), in child programs:
// - past a worker stuck in a native call: a worker sleeping 60 s inside libc's sleep() through koffi (as the NVML
//   worker sits inside a hung NVML call) does not hold the exit, which keeps its code and its 'exit' event;
//   process.exit() alone waits for the sleep (the control);
// - a worker that has already ended holds nothing: the exit after it is Node's own;
// - after the output: lines still waiting in a pipe whose reader is slow are taken before the exit, within the
//   bound (process.exit() drops them).
import { spawn } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"

const repo = path.resolve(import.meta.dirname, "../..")
const processExit = JSON.stringify(path.join(repo, "src/layers/node/processExit.ts"))
const koffi = JSON.stringify(path.join(repo, "node_modules/koffi/index.js"))
let dir = ""
beforeAll(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-process-exit-"))
})
afterAll(() => {
  if (dir) fs.rmSync(dir, { recursive: true, force: true })
})

/** A program with one worker inside a 60 s native sleep; `ending` says whether it is told to end first. */
const stuckWorker = (ending: boolean, onExit = "") => `
import { Worker } from "node:worker_threads"
import { writeSync } from "node:fs"
import koffi from ${koffi}
import { bindHardExit, endWorker, exitProcess, workersHoldingExit } from ${processExit}
// as the NVML layer does before it starts its worker
bindHardExit(koffi)
const worker = new Worker(\`
  const koffi = require(\${JSON.stringify(${koffi})})
  const sleep = koffi.load(null).func("unsigned int sleep(unsigned int)")
  require("node:worker_threads").parentPort.postMessage("asleep")
  sleep(60)
\`, { eval: true })
worker.once("message", () => {
  ${ending ? "endWorker(worker)" : ""}
  process.on("exit", (code) => writeSync(1, \`exit event \${code}, holding \${workersHoldingExit()}\\n\`))
  ${onExit}
  exitProcess(3)
})
`

interface Run {
  readonly code: number | null
  readonly out: string
}

/** Runs `source`; rejects when it has not exited after `boundMs`. `readDelayMs`: stdout is read only that late. */
const run = (source: string, boundMs: number, readDelayMs = 0) =>
  new Promise<Run>((resolve, reject) => {
    const file = path.join(dir, `p${Math.random().toString(36).slice(2)}.mjs`)
    fs.writeFileSync(file, source)
    const child = spawn(process.execPath, [file], { stdio: ["ignore", "pipe", "inherit"] })
    let out = ""
    child.stdout.pause()
    setTimeout(() => {
      child.stdout.on("data", (b: Buffer) => {
        out += b.toString()
      })
      child.stdout.resume()
    }, readDelayMs)
    const timer = setTimeout(() => {
      child.kill("SIGKILL")
      reject(new Error(`the program had not exited after ${boundMs} ms (out: ${out})`))
    }, boundMs)
    child.once("close", (code) => {
      clearTimeout(timer)
      resolve({ code, out })
    })
  })

describe("exitProcess", () => {
  it("exits with its code and the 'exit' event while a worker told to end is still inside a native call", async () => {
    // well under the worker's 60 s sleep: a bound, not a wait (the exit comes as soon as the program decides)
    const { code, out } = await run(stuckWorker(true), 30_000)
    expect(code).toBe(3)
    expect(out).toBe("exit event 3, holding 1\n")
  })

  it("exits with the code an 'exit' listener sets, as process.exit does", async () => {
    const { code } = await run(stuckWorker(true, 'process.on("exit", () => { process.exitCode = 7 })'), 30_000)
    expect(code).toBe(7)
  })

  it("leaves a worker nobody told to end to Node's own exit, which waits for its native call (control)", async () => {
    // the same worker, not ended: the count is 0 and the exit is process.exit, which waits for the sleep; killed at
    // the bound, the run shows what held the exit before
    await expect(run(stuckWorker(false), 3_000)).rejects.toThrow(
      /had not exited after 3000 ms \(out: exit event 3, holding 0/
    )
  })

  it("does not count a worker that has already ended (told to end after its own exit)", async () => {
    const { code, out } = await run(
      `
import { Worker } from "node:worker_threads"
import { once } from "node:events"
import { endWorker, workersHoldingExit } from ${processExit}
const worker = new Worker("", { eval: true })
await once(worker, "exit")
endWorker(worker)
console.log(\`holding \${workersHoldingExit()}\`)
`,
      30_000
    )
    expect({ code, out }).toEqual({ code: 0, out: "holding 0\n" })
  })

  it("a worker told to end holds the exit only until it has ended (else every later exit took the _exit path)", async () => {
    const { code, out } = await run(
      `
import { Worker } from "node:worker_threads"
import { once } from "node:events"
import { endWorker, workersHoldingExit } from ${processExit}
const worker = new Worker("setInterval(() => {}, 1000)", { eval: true })
await once(worker, "online")
const exited = once(worker, "exit")
endWorker(worker)
console.log(\`holding \${workersHoldingExit()}\`)
await exited
console.log(\`holding \${workersHoldingExit()}\`)
`,
      30_000
    )
    expect({ code, out }).toEqual({ code: 0, out: "holding 1\nholding 0\n" })
  })
})

describe("exitWhenFlushed", () => {
  // 4 MiB to a pipe nobody reads for 300 ms: far more than the pipe's buffer, so most of it waits in the process
  const writer = (exit: string) => `
import { exitWhenFlushed } from ${processExit}
const line = "x".repeat(1023) + "\\n"
process.stdout.write(line.repeat(4096))
process.stdout.write("last line\\n")
${exit}
`

  it("exits once a slow reader has taken every line, with the code", async () => {
    const { code, out } = await run(writer("exitWhenFlushed(5)"), 30_000, 300)
    expect(code).toBe(5)
    expect(out.length).toBe(4096 * 1024 + "last line\n".length)
    expect(out.endsWith("last line\n")).toBe(true)
  })

  it("process.exit() drops what the reader has not taken yet (control)", async () => {
    const { code, out } = await run(writer("process.exit(5)"), 30_000, 300)
    expect(code).toBe(5)
    expect(out.length).toBeLessThan(4096 * 1024)
  })
})
