// The engine pid file's write (layers/engine/pidFile.ts): a write that fails is logged with the system's reason
// (EROFS, ENOSPC, ENOTDIR), never only "An error occurred in Effect.tryPromise" (a chaos soak's finding). And the
// start-up reclaim over real process groups (detached shells): a record left with this process's own pid, a dead
// agent's guard still stopping its group, a group that survives SIGKILL (stopGroup scripted), the record removed.
import { type ChildProcess, spawn } from "node:child_process"
import * as fs from "node:fs"
import * as net from "node:net"
import * as os from "node:os"
import * as path from "node:path"
import { Effect, Fiber, Logger } from "effect"
import { afterEach, describe, expect, it, vi } from "vitest"
import { type PidRecord, pidFileOfRun, pidFilePath, reclaim, writePidFile } from "../../src/layers/engine/pidFile.ts"
import { groupAlive, processExe, processStartMs } from "../../src/layers/engine/processGroup.ts"
import { testPlan } from "../../src/testing/EngineProcess.ts"
import { freePort } from "../support/ports.ts"

let dir: string | undefined
const children: Array<ChildProcess> = []
afterEach(() => {
  for (const c of children.splice(0)) {
    try {
      if (c.pid !== undefined) process.kill(-c.pid, "SIGKILL")
    } catch {}
  }
  if (dir !== undefined) fs.rmSync(dir, { recursive: true, force: true })
  dir = undefined
})

/** A shell running `script` as the leader of its own process group (as the guard spawns an engine). */
const group = (script: string): ChildProcess & { readonly pid: number } => {
  const c = spawn("sh", ["-c", script], { detached: true, stdio: "ignore" })
  children.push(c)
  if (c.pid === undefined) throw new Error("no pid")
  return c as ChildProcess & { readonly pid: number }
}

/** The record an agent pid `agentPid` wrote for the live group `pgid`. */
const recordOf = (pgid: number, agentPid: number, guardPid: number | undefined, port: number): PidRecord => ({
  agentPid,
  guardPid,
  pgid,
  host: "127.0.0.1",
  port,
  startedAt: processStartMs(pgid) ?? Date.now(),
  exe: processExe(pgid)
})

/** reclaim over `record`, written to the test's state dir: its error's reason, or "ok". */
const reclaimOver = async (record: PidRecord, run: typeof reclaim = reclaim) => {
  dir ??= fs.mkdtempSync(path.join(os.tmpdir(), "cgn-pidfile-"))
  fs.writeFileSync(pidFilePath(dir), JSON.stringify(record))
  return Effect.runPromise(
    run(testPlan({ port: record.port }), dir, 2_000).pipe(
      Effect.as("ok"),
      Effect.catch((e) => Effect.succeed(e.reason as string)),
      Effect.provide(Logger.layer([]))
    )
  )
}

/** Polls (bounded: 2 s) until /proc shows the process `pid`'s executable. */
const started = async (pid: number) => {
  for (let i = 0; i < 200 && processExe(pid) === undefined; i++) await new Promise((r) => setTimeout(r, 10))
}

describe("reclaim", () => {
  it("a record an earlier agent with this process's pid left (PID 1 in a restarted container) is reclaimed, not another agent", async () => {
    const engine = group("sleep 30; true")
    await started(engine.pid)
    expect(await reclaimOver(recordOf(engine.pid, process.pid, undefined, await freePort()))).toBe("ok")
    expect(groupAlive(engine.pid)).toBe(false)
  })

  it("a dead agent's guard still stopping the group is waited for: the engine gets no second SIGTERM", async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-pidfile-"))
    const terms = path.join(dir, "terms")
    // an engine that notes every SIGTERM and keeps running; its guard KILLs the group 0.5 s on
    const engine = group(`trap 'echo TERM >> ${terms}' TERM; while :; do sleep 0.02; done`)
    const guard = group(`sleep 0.5; kill -9 -${engine.pid}`)
    await started(engine.pid)
    const deadAgent = group("exit 0")
    await new Promise((resolve) => deadAgent.once("exit", resolve))
    const record = recordOf(engine.pid, deadAgent.pid, guard.pid, await freePort())
    expect(await reclaimOver(record)).toBe("ok")
    expect(groupAlive(engine.pid)).toBe(false)
    expect(fs.existsSync(terms) ? fs.readFileSync(terms, "utf8") : "").toBe("")
  })

  it("a stale group's stop is not cut short by the agent's own interruption (a SIGTERM during start-up)", async () => {
    // an engine that ignores SIGTERM, its agent and guard dead: only the stop's SIGKILL ends it
    const engine = group("trap '' TERM; while :; do sleep 0.02; done")
    await started(engine.pid)
    const deadAgent = group("exit 0")
    await new Promise((resolve) => deadAgent.once("exit", resolve))
    dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-pidfile-"))
    fs.writeFileSync(pidFilePath(dir), JSON.stringify(recordOf(engine.pid, deadAgent.pid, undefined, await freePort())))
    const logs: Array<string> = []
    const stateDir = dir
    await Effect.runPromise(
      Effect.gen(function* () {
        const fiber = yield* Effect.forkChild(reclaim(testPlan({ port: 1 }), stateDir, 300))
        // interrupted as soon as the stop has begun (its SIGTERM sent), as runMain interrupts a starting agent
        for (let i = 0; i < 500 && !logs.some((l) => l.startsWith("stopping engine group")); i++) yield* Effect.sleep(5)
        yield* Fiber.interrupt(fiber)
      }).pipe(Effect.provide(Logger.layer([Logger.make(({ message }) => void logs.push(String([message].flat()[0])))])))
    )
    expect(logs.some((l) => l.startsWith("stopping engine group"))).toBe(true)
    // the interruption waited for the stop: the group is gone (SIGKILLed after the 300 ms grace), not left running
    expect(groupAlive(engine.pid)).toBe(false)
  })

  it("the record is removed once judged, also when the start is then refused (PortBusy)", async () => {
    const gone = group("exit 0")
    await new Promise((resolve) => gone.once("exit", resolve))
    const busy = net.createServer()
    await new Promise<void>((resolve) => busy.listen(0, "127.0.0.1", resolve))
    try {
      const { port } = busy.address() as net.AddressInfo
      expect(await reclaimOver({ ...recordOf(gone.pid, gone.pid, undefined, port), startedAt: Date.now() })).toBe(
        "PortBusy"
      )
      expect(fs.existsSync(pidFilePath(dir ?? ""))).toBe(false)
    } finally {
      await new Promise((resolve) => busy.close(resolve))
    }
  })

  it("an engine group that survives SIGKILL refuses the start: never two engines on the same GPUs", async () => {
    vi.resetModules()
    vi.doMock("../../src/layers/engine/groupWait.ts", async (original) => ({
      ...(await original<typeof import("../../src/layers/engine/groupWait.ts")>()),
      stopGroup: () => Effect.succeed("survived" as const)
    }))
    try {
      const scripted = await import("../../src/layers/engine/pidFile.ts")
      const engine = group("sleep 30; true")
      await started(engine.pid)
      const deadAgent = group("exit 0")
      await new Promise((resolve) => deadAgent.once("exit", resolve))
      const record = recordOf(engine.pid, deadAgent.pid, undefined, await freePort())
      expect(await reclaimOver(record, scripted.reclaim)).toBe("StaleEngine")
    } finally {
      vi.doUnmock("../../src/layers/engine/groupWait.ts")
      vi.resetModules()
    }
  })
})

describe("writePidFile", () => {
  it("logs why a write failed, in the system's words", async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-pidfile-"))
    const blocked = path.join(dir, "a-file")
    fs.writeFileSync(blocked, "")
    const lines: Array<string> = []
    const logger = Logger.make(({ message }) => lines.push(JSON.stringify(message)))
    await Effect.runPromise(
      writePidFile(pidFilePath(path.join(blocked, "state")), {
        pgid: 1,
        agentPid: process.pid,
        guardPid: undefined,
        host: "127.0.0.1",
        port: 8000,
        startedAt: Date.now()
      }).pipe(Effect.provide(Logger.layer([logger])))
    )
    expect(lines.join("\n")).toContain("cannot write the engine pid file")
    expect(lines.join("\n")).toContain("ENOTDIR")
  })
})

describe("a run's pid file", () => {
  it("is removed at the run's end once its group is gone, and kept (said) while a process of it lives on", async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-pidfile-"))
    const file = pidFilePath(dir)
    const lines: Array<string> = []
    const logger = Logger.make(({ message }) => lines.push(JSON.stringify(message)))
    const runWith = (pgid: number) =>
      Effect.runPromise(
        Effect.scoped(
          Effect.flatMap(pidFileOfRun(file), (pidFile) => pidFile.write(recordOf(pgid, process.pid, undefined, 8000)))
        ).pipe(Effect.provide(Logger.layer([logger])))
      )
    // a group still alive when the run's scope closes (one that survived the teardown's SIGKILL): its record stays for
    // the next run's wait and a later agent's reclaim
    const lingering = group("sleep 60")
    await started(lingering.pid)
    await runWith(lingering.pid)
    expect(fs.existsSync(file)).toBe(true)
    expect(JSON.parse(fs.readFileSync(file, "utf8")).pgid).toBe(lingering.pid)
    expect(lines.join("\n")).toContain("kept: the engine group it names is still alive after its stop")
    // a group gone by then: removed
    process.kill(-lingering.pid, "SIGKILL")
    await new Promise<void>((resolve) => lingering.once("exit", () => resolve()))
    for (let i = 0; i < 200 && groupAlive(lingering.pid); i++) await new Promise((r) => setTimeout(r, 10))
    await runWith(lingering.pid)
    expect(fs.existsSync(file)).toBe(false)
  })
})
