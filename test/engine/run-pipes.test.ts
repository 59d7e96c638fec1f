// One engine run's output pipes against a grandchild that escapes the engine's process group (setsid) and keeps
// the engine's stdout and stderr: the guard stops the group, the grandchild lives on and holds the pipes' write
// ends, so no end of file ever comes. The run's release must still close the agent's side of the pipes; it
// left them open for as long as the grandchild lived, two fds per engine restart. Also the run's last lines, its
// output flood bound, the outcome its stop reports, and a guard that cannot be spawned.
import { execFileSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Deferred, Effect, Exit, Logger, Scope } from "effect"
import { afterEach, describe, expect, it } from "vitest"
import { pidAlive } from "../../src/layers/engine/processGroup.ts"
import { spawnRun } from "../../src/layers/engine/run.ts"
import { guardEntry } from "../../src/programs/programPaths.ts"
import type { LaunchPlan } from "../../src/services/engine/Engine.ts"
import { pollUntil } from "../support/poll.ts"

const cleanups: Array<() => void> = []
afterEach(() => {
  for (const c of cleanups.splice(0).reverse()) c()
})

/** This process's open fds, each with what it points to (`socket:[inode]`, `pipe:[inode]`, a path). */
const openFds = (): Map<string, string> => {
  const fds = new Map<string, string>()
  for (const fd of fs.readdirSync("/proc/self/fd")) {
    try {
      fds.set(fd, fs.readlinkSync(`/proc/self/fd/${fd}`))
    } catch {
      // The directory's own fd, closed once listed.
    }
  }
  return fds
}

const setsidAvailable = (() => {
  try {
    execFileSync("setsid", ["true"])
    return true
  } catch {
    return false
  }
})()

describe("an engine run's output pipes", () => {
  it.skipIf(!setsidAvailable || !fs.existsSync("/proc/self/fd"))(
    "are closed when the run's scope closes, even while a grandchild that left the group (setsid) holds them",
    async () => {
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-pipes-"))
      cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }))
      // The engine: a grandchild in its own session, with the engine's stdout and stderr, writes its pid; the
      // engine itself serves on until the guard stops its group.
      const engine = path.join(dir, "engine.sh")
      fs.writeFileSync(engine, `#!/bin/sh\nsetsid sh -c 'echo $$ > "$1"; exec sleep 1000' sh "$1" &\nexec sleep 1000\n`)
      const grandchildren: Array<number> = []
      cleanups.push(() => {
        for (const pid of grandchildren) if (pidAlive(pid)) process.kill(pid, "SIGKILL")
      })
      for (let run = 1; run <= 3; run++) {
        const pidFile = path.join(dir, `grandchild-${run}`)
        const plan = { argv: ["/bin/sh", engine, pidFile], env: {} } as unknown as LaunchPlan
        const before = openFds()
        const scope = await Effect.runPromise(Scope.make())
        await Effect.runPromise(
          Scope.provide(scope)(spawnRun(guardEntry())(plan, { run, graceMs: 200, linesKept: 10 }))
        )
        // The run's pipes: what this process opened for it (stdin, stdout, stderr, the guard's report pipe).
        const opened = [...openFds()].filter(([fd, target]) => before.get(fd) !== target)
        expect(opened.length).toBeGreaterThanOrEqual(3)
        const grandchild = await pollUntil(
          `run ${run}'s grandchild pid`,
          () => {
            const text = fs.existsSync(pidFile) ? fs.readFileSync(pidFile, "utf8").trim() : ""
            return text === "" ? undefined : Number(text)
          },
          10_000,
          10
        )
        grandchildren.push(grandchild)
        await Effect.runPromise(Scope.close(scope, Exit.void))
        // The grandchild outlived the run (its own session), holding the write ends: no end of file comes.
        expect(pidAlive(grandchild)).toBe(true)
        const stillOpen = () => {
          const now = openFds()
          return opened.filter(([fd, target]) => now.get(fd) === target)
        }
        await pollUntil(`run ${run}'s pipes closed`, () => stillOpen().length === 0, 2_000, 10).catch(() => {
          throw new Error(`run ${run}: still open after its release: ${JSON.stringify(stillOpen())}`)
        })
      }
    },
    30_000
  )
})

describe("an engine run's last lines", () => {
  it("keep the line naming a known cause (the plan's exit hints) past a traceback longer than the lines kept", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-lines-"))
    cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }))
    // The cause on stdout, then 60 lines of a traceback on stderr (vLLM's API server prints ~40 after it), exit 1.
    const engine = path.join(dir, "engine.sh")
    fs.writeFileSync(
      engine,
      "#!/bin/sh\necho 'ValueError: No available memory for the cache blocks.'\n" +
        'i=0; while [ $i -lt 60 ]; do echo "  File x.py, line $i" >&2; i=$((i+1)); done\nexit 1\n'
    )
    const plan = {
      argv: ["/bin/sh", engine],
      env: {},
      exitHints: [{ patterns: ["No available memory for the cache blocks"], hint: "raise gpu_memory_utilization" }]
    } as unknown as LaunchPlan
    const lines = await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const run = yield* spawnRun(guardEntry())(plan, { run: 0, graceMs: 200, linesKept: 10 })
          yield* Deferred.await(run.exited)
          yield* run.drainOutput(2_000)
          return yield* run.lastLines
        })
      )
    )
    expect(lines).toHaveLength(10)
    expect(lines[0]).toBe("[stdout] ValueError: No available memory for the cache blocks.")
    expect(lines.at(-1)).toBe("[stderr]   File x.py, line 59")
  }, 30_000)
})

describe("an engine run that floods its output", () => {
  it("logs its first 10,000 lines, then 1,000 a second, and counts the others once a second while it is quiet", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-flood-"))
    cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }))
    // 30,000 lines ended by "\r" at once (a progress bar redrawn with no pause), then quiet until stopped.
    const engine = path.join(dir, "engine.mjs")
    fs.writeFileSync(engine, `process.stderr.write("42%\\r".repeat(30000), () => setInterval(() => {}, 1 << 30))\n`)
    const plan = { argv: [process.execPath, engine], env: {} } as unknown as LaunchPlan
    const logs: Array<string> = []
    const logger = Logger.make(({ message }) => {
      for (const m of [message].flat()) if (typeof m === "string") logs.push(m)
    })
    const kept = await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const run = yield* spawnRun(guardEntry())(plan, { run: 0, graceMs: 200, linesKept: 5 })
          const count = (l: string) => Number(/^engine output: (\d+) line/.exec(l)?.[1] ?? 0)
          // every line either logged or counted: the count comes a second after the flood, the engine quiet
          yield* Effect.promise(() =>
            pollUntil(
              "the flood's lines logged or counted",
              () => logs.filter((l) => l === "42%").length + logs.reduce((n, l) => n + count(l), 0) === 30_000,
              10_000,
              20
            )
          )
          return yield* run.lastLines
        })
      ).pipe(Effect.provide(Logger.layer([logger])))
    )
    const logged = logs.filter((l) => l === "42%").length
    expect(logged).toBeGreaterThanOrEqual(10_000)
    expect(logged).toBeLessThan(15_000)
    expect(logs.filter((l) => l.startsWith("engine output: ")).length).toBeLessThanOrEqual(2)
    // /status's last lines are the flood's last, whatever was logged
    expect(kept).toEqual(Array(5).fill("[stderr] 42%"))
  }, 30_000)
})

describe("an engine run's output that ends", () => {
  it("counts the lines not logged when the output ends, not only once a second while it runs", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-flood-end-"))
    cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }))
    // the same flood, the engine then exiting at once: the output ends before a second's count is due
    const engine = path.join(dir, "engine.mjs")
    fs.writeFileSync(engine, `process.stderr.write("42%\\r".repeat(30000), () => process.exit(0))\n`)
    const plan = { argv: [process.execPath, engine], env: {} } as unknown as LaunchPlan
    const logs: Array<string> = []
    const logger = Logger.make(({ message }) => {
      for (const m of [message].flat()) if (typeof m === "string") logs.push(m)
    })
    await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const run = yield* spawnRun(guardEntry())(plan, { run: 0, graceMs: 200, linesKept: 5 })
          yield* Deferred.await(run.exited)
          // the output read to its end
          yield* run.drainOutput(5_000)
        })
      ).pipe(Effect.provide(Logger.layer([logger])))
    )
    const count = (l: string) => Number(/^engine output: (\d+) line/.exec(l)?.[1] ?? 0)
    expect(logs.filter((l) => l === "42%").length + logs.reduce((n, l) => n + count(l), 0)).toBe(30_000)
  }, 30_000)
})

describe("an engine run's stop", () => {
  it("says how the guard stopped the group: an engine that takes its SIGTERM is 'terminated', not 'gone'", async () => {
    const plan = { argv: [process.execPath, "-e", "setInterval(() => {}, 1 << 30)"], env: {} } as unknown as LaunchPlan
    const logs: Array<string> = []
    const logger = Logger.make(({ message }) => {
      for (const m of [message].flat()) if (typeof m === "string") logs.push(m)
    })
    const { pgid, outcome } = await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          // a grace far past the engine's own exit on TERM: the guard's report, not a timer, decides the outcome
          const run = yield* spawnRun(guardEntry())(plan, { run: 0, graceMs: 10_000, linesKept: 5 })
          const pgid = yield* Deferred.await(run.pid)
          return { pgid, outcome: yield* run.stop }
        })
      ).pipe(Effect.provide(Logger.layer([logger])))
    )
    // run.ts: the guard's "stopped" report is read to the pipe's end; the agent seeing the guard gone by then is
    // no "gone" (the log once said "stopped: gone" for an engine that was terminated)
    expect(outcome).toBe("terminated")
    expect(logs).toContain(`engine group ${pgid} stopped: terminated`)
  }, 30_000)
})

describe("an engine run whose guard cannot be spawned", () => {
  it("ends at once with why, said to be the guard's (Node throws E2BIG from spawn for an argument past 128 KiB)", async () => {
    const plan = { argv: [process.execPath, "x".repeat(200_000)], env: {} } as unknown as LaunchPlan
    const { pid, exit, outcome } = await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const run = yield* spawnRun(guardEntry())(plan, { run: 0, graceMs: 200, linesKept: 5 })
          return {
            pid: yield* Deferred.await(run.pid),
            exit: yield* Deferred.await(run.exited),
            outcome: yield* run.stop
          }
        })
      )
    )
    expect([pid, exit.code, exit.signal, outcome]).toEqual([undefined, null, null, "gone"])
    // "guard: " as the guard's 'error' event says it (run.ts): the guard itself, not the engine it would start
    // (the guard's own report for that is "spawn failed: ..."), could not be spawned
    expect(exit.problem).toMatch(/^guard: spawn E2BIG$/)
  }, 30_000)
})
