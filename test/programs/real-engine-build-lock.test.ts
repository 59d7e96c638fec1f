// scripts/real-engine-build.mjs builds llama-server once per cache folder: a run that finds another run's build in
// progress (its lock names a live process) waits for it, takes its result, or fails with it when it made none. The
// build itself is not run here (six minutes): the "other run" is this test, holding the lock and writing the result.
import { type ChildProcess, spawn } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterEach, describe, expect, it } from "vitest"
import { repoRoot } from "../support/agent.ts"
import { pollUntil } from "../support/poll.ts"

const BUILD_ID = "v0.4.0-O0"

interface Run {
  readonly child: ChildProcess
  readonly stderr: () => string
  readonly exited: Promise<{ code: number | null; stdout: string }>
}

const dirs: Array<string> = []
const children: Array<ChildProcess> = []
/** Ends a run with whatever it started (npm, cmake): it leads a process group of its own. */
const killGroup = (child: ChildProcess): void => {
  try {
    if (child.pid !== undefined) process.kill(-child.pid, "SIGKILL")
  } catch {
    // gone already
  }
}
afterEach(() => {
  for (const c of children.splice(0)) killGroup(c)
  for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true })
})

const cacheDir = (): string => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-build-lock-"))
  dirs.push(dir)
  return dir
}

const runBuild = (cache: string): Run => {
  const child = spawn(process.execPath, [path.join(repoRoot, "scripts/real-engine-build.mjs")], {
    env: { ...process.env, CGN_REAL_ENGINE_CACHE: cache },
    stdio: ["ignore", "pipe", "pipe"],
    detached: true
  })
  children.push(child)
  let out = ""
  let err = ""
  child.stdout?.on("data", (d: Buffer) => {
    out += d.toString()
  })
  child.stderr?.on("data", (d: Buffer) => {
    err += d.toString()
  })
  const exited = new Promise<{ code: number | null; stdout: string }>((resolve) =>
    child.once("exit", (code) => resolve({ code, stdout: out }))
  )
  return { child, stderr: () => err, exited }
}

/** What a finished build leaves: the binary and the vocabulary the tests take. */
const writeResult = (cache: string): string => {
  const out = path.join(cache, BUILD_ID)
  fs.mkdirSync(path.join(out, "bin"), { recursive: true })
  fs.writeFileSync(path.join(out, "bin", "llama-server"), "")
  fs.writeFileSync(path.join(out, "ggml-vocab-llama-spm.gguf"), "")
  return out
}

describe("real-engine-build.mjs: one build per cache folder", () => {
  it("waits for the build a live process holds, then takes its result", async () => {
    const cache = cacheDir()
    const lock = path.join(cache, `.${BUILD_ID}.lock`)
    fs.writeFileSync(lock, `${process.pid}\n`)
    const run = runBuild(cache)
    await pollUntil("the run waiting", () => run.stderr().includes("waiting for the build in progress"))
    expect(run.child.exitCode).toBeNull()
    const out = writeResult(cache)
    fs.rmSync(lock)
    const { code, stdout } = await run.exited
    expect(code).toBe(0)
    expect(stdout.trim().split("\n").at(-1)).toBe(out)
  })

  it("fails, without building again, when the build it waited for ended with no result", async () => {
    const cache = cacheDir()
    const lock = path.join(cache, `.${BUILD_ID}.lock`)
    fs.writeFileSync(lock, `${process.pid}\n`)
    const run = runBuild(cache)
    await pollUntil("the run waiting", () => run.stderr().includes("waiting for the build in progress"))
    fs.rmSync(lock)
    const { code } = await run.exited
    expect(code).toBe(1)
    expect(run.stderr()).toContain(`the build this waited for (pid ${process.pid}) failed`)
    expect(run.stderr()).not.toContain("fetching")
    expect(fs.readdirSync(cache)).toEqual([])
  })

  it("takes over a lock whose process is gone, and removes what a killed build left", async () => {
    const cache = cacheDir()
    // A pid no process has: a child that has exited.
    const gone = spawn(process.execPath, ["-e", "0"])
    await new Promise((resolve) => gone.once("exit", resolve))
    const lock = path.join(cache, `.${BUILD_ID}.lock`)
    fs.writeFileSync(lock, `${gone.pid}\n`)
    const leftover = path.join(cache, `.${BUILD_ID}.work-${gone.pid}`)
    fs.mkdirSync(leftover)
    const run = runBuild(cache)
    // Past the lock the run starts its own build (fetching the npm tarball first): stopped there.
    await pollUntil("the run building", () => run.stderr().includes("fetching"))
    killGroup(run.child)
    await run.exited
    expect(run.stderr()).toContain(`taking over from a build that is gone (pid ${gone.pid}`)
    expect(fs.existsSync(leftover)).toBe(false)
    expect(fs.readFileSync(lock, "utf8").trim()).toBe(String(run.child.pid))
  })
})
