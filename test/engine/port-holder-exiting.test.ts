// engine.verify_listener against an engine caught exiting (layers/engine/portHolder.ts, run.ts, watch.ts). A chaos
// soak killed llama-server, put a foreign HTTP server on its port, and saw a restarted run go Ready for ~11 ms:
// the new llama-server could not bind and exited, a look at its group caught it exiting, its /proc/<pid>/fd
// unreadable (EACCES once exit_mm() ran, unless root; ENOENT once reaped), and an unreadable member made the
// verdict "unknown", which trusts the probe: the foreign server's 200 made the run Ready. A member that is gone or
// exiting holds nothing (the port is another's); only a live member not ours to read leaves it unknown. And while
// the guard has not reported the engine's pid, readiness waits: an answer then is no one's known.
import { spawn } from "node:child_process"
import * as fs from "node:fs"
import { createServer, type Server } from "node:net"
import { assert, it as effectIt } from "@effect/vitest"
import { Deferred, Effect, Fiber, Logger, Ref } from "effect"
import { TestClock } from "effect/testing"
import { afterEach, describe, expect, it } from "vitest"
import { holdsNothing, type ProcReads, portHolderFrom } from "../../src/layers/engine/portHolder.ts"
import { readStat } from "../../src/layers/engine/processGroup.ts"
import { spawnRun } from "../../src/layers/engine/run.ts"
import { watchRun } from "../../src/layers/engine/watch.ts"
import { guardEntry } from "../../src/programs/programPaths.ts"
import type { LaunchPlan } from "../../src/services/engine/Engine.ts"
import { type EngineHostService, type PortHolder, valueIfDone } from "../../src/services/engine/EngineHost.ts"
import type { RestartRequest } from "../../src/services/engine/EngineProcess.ts"
import type { SupervisorEvent } from "../../src/services/engine/EngineState.ts"
import { testPlan } from "../../src/testing/EngineProcess.ts"
import { pollUntil, settle } from "../support/poll.ts"
import { testSettings } from "../support/supervisor.ts"

const cleanups: Array<() => Promise<void> | void> = []
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c()
})

/** A /proc/<pid>/stat line: state, pgrp and flags as given (the rest as a sleeping llama-server's). */
const stat = (pid: number, state: string, pgrp: number, flags: number) =>
  `${pid} (llama-server) ${state} 1 ${pgrp} ${pgrp} 0 -1 ${flags} 96 0 0 0 0 0 0 0 20 0 1 0 1045655 0 0`
const PF_EXITING = 0x4
const LIVE = 0x400100 // PF_RANDOMIZE | PF_FORKNOEXEC: an ordinary process's flags, not exiting

const errno = (code: string) => Object.assign(new Error(code), { code })

describe("a member whose fds cannot be read", () => {
  it("holds nothing when reaped, a zombie, exiting or out of the group; is unknown when alive and not ours", () => {
    const g = 4242
    expect(holdsNothing("ENOENT", { failed: "ENOENT" }, g)).toBe(true)
    expect(holdsNothing("EACCES", { failed: "ENOENT" }, g)).toBe(true) // reaped between the two reads
    expect(holdsNothing("EACCES", stat(g, "R", g, LIVE | PF_EXITING), g)).toBe(true) // exit_mm() ran
    expect(holdsNothing("EACCES", stat(g, "Z", g, 0x40042c), g)).toBe(true) // a zombie, as a real one reads
    expect(holdsNothing("EACCES", stat(g, "X", g, LIVE), g)).toBe(true)
    expect(holdsNothing("EACCES", stat(g, "S", 77, LIVE), g)).toBe(true) // setsid, or its pid reused
    expect(holdsNothing("EACCES", stat(g, "S", g, LIVE), g)).toBe(false) // another user's engine, hidepid
    expect(holdsNothing("EACCES", { failed: "EACCES" }, g)).toBe(false)
    expect(holdsNothing(undefined, "garbage", g)).toBe(false)
  })
})

describe("portHolder over /proc as an exiting engine leaves it", () => {
  const header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode"
  // port 8000 (0x1F40), listened on by socket 4711: the foreign server's
  const tcp = `${header}\n   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4711 1 0 100 0 0 10 0`
  const g = 100
  /** /proc with the engine's group leader (100, fds readable) and a member 101 as `member` says. */
  const proc = (member: { fd: Error | ReadonlyArray<string>; stat: Error | string }): ProcReads => ({
    text: (p) => {
      if (p === "/proc/net/tcp") return tcp
      if (p === "/proc/101/stat") {
        if (member.stat instanceof Error) throw member.stat
        return member.stat
      }
      throw errno("ENOENT")
    },
    dir: (p) => {
      if (p === "/proc/100/fd") return ["0", "1", "2"]
      if (p === "/proc/101/fd") {
        if (member.fd instanceof Error) throw member.fd
        return member.fd
      }
      throw errno("ENOENT")
    },
    link: (p) => (p === "/proc/100/fd/2" ? "socket:[9]" : p === "/proc/101/fd/5" ? "socket:[4711]" : "/dev/null")
  })

  it("another's when a member is caught exiting, reaped or a zombie; unknown only for a live one not ours", () => {
    const exiting = proc({ fd: errno("EACCES"), stat: stat(101, "R", g, LIVE | PF_EXITING) })
    expect(portHolderFrom(exiting, 8000, g, [100, 101])).toBe("other")
    expect(portHolderFrom(proc({ fd: errno("ENOENT"), stat: errno("ENOENT") }), 8000, g, [100, 101])).toBe("other")
    expect(portHolderFrom(proc({ fd: errno("EACCES"), stat: stat(101, "Z", g, 0) }), 8000, g, [100, 101])).toBe("other")
    // root reads an exiting task's fd table after exit_files() as empty, no error
    expect(portHolderFrom(proc({ fd: [], stat: stat(101, "R", g, PF_EXITING) }), 8000, g, [100, 101])).toBe("other")
    expect(portHolderFrom(proc({ fd: errno("EACCES"), stat: stat(101, "S", g, LIVE) }), 8000, g, [100, 101])).toBe(
      "unknown"
    )
    expect(portHolderFrom(proc({ fd: ["5"], stat: stat(101, "S", g, LIVE) }), 8000, g, [100, 101])).toBe("engine")
  })

  it.skipIf(!fs.existsSync("/proc/self/stat"))(
    "another's, on this kernel, when the group's members are a reaped process and a zombie",
    async () => {
      // The port, held by this process: outside the groups below.
      const server: Server = createServer()
      await new Promise<void>((r) => server.listen(0, "127.0.0.1", r))
      cleanups.push(() => new Promise<void>((r) => server.close(() => r())))
      const port = (server.address() as { port: number }).port

      // A group leader that keeps an unreaped child: `sleep` never waits, so `sleep 0` stays a zombie.
      const leader = spawn("/bin/sh", ["-c", "sleep 0 & exec sleep 30"], { detached: true, stdio: "ignore" })
      const leaderGone = new Promise((r) => leader.once("exit", r))
      cleanups.push(async () => {
        leader.kill("SIGKILL")
        await leaderGone
      })
      const pgid = leader.pid!
      const zombie = await pollUntil("the zombie", () =>
        fs
          .readdirSync("/proc")
          .map(Number)
          .find((pid) => {
            const st = readStat(pid)
            return st !== undefined && st.ppid === pgid && st.state === "Z"
          })
      )
      const reads: ProcReads = {
        text: (p) => fs.readFileSync(p, "utf8"),
        dir: (p) => fs.readdirSync(p),
        link: (p) => fs.readlinkSync(p)
      }
      // A zombie's fd directory: EACCES to anyone but root (no mm: owned by root), empty to root.
      expect(portHolderFrom(reads, port, pgid, [zombie])).toBe("other")

      // A member reaped since it was listed: its fd directory is ENOENT.
      const brief = spawn("/bin/true", [], { detached: true, stdio: "ignore" })
      await new Promise((r) => brief.once("exit", r))
      expect(fs.existsSync(`/proc/${brief.pid}`)).toBe(false)
      expect(portHolderFrom(reads, port, brief.pid!, [brief.pid!])).toBe("other")
    },
    15_000
  )
})

describe("an engine run's port holder before the guard reports the pid", () => {
  it.skipIf(!fs.existsSync("/proc/self/stat"))(
    "waits for the pid, then judges the listener: no answer is taken as the engine's meanwhile",
    async () => {
      const server: Server = createServer()
      await new Promise<void>((r) => server.listen(0, "127.0.0.1", r))
      cleanups.push(() => new Promise<void>((r) => server.close(() => r())))
      const port = (server.address() as { port: number }).port
      const plan = { argv: ["/bin/sleep", "30"], env: {} } as unknown as LaunchPlan
      const { known, holder } = await Effect.runPromise(
        Effect.scoped(
          Effect.gen(function* () {
            const run = yield* spawnRun(guardEntry())(plan, { run: 0, graceMs: 200, linesKept: 10 })
            // The guard (a fresh node process) cannot have reported yet: no event-loop turn since the spawn.
            const known = yield* valueIfDone(run.pid)
            return { known, holder: yield* run.portHolder(port) }
          })
        ).pipe(Effect.provide(Logger.layer([])))
      )
      expect(known).toBeUndefined()
      expect(holder).toBe("other")
    },
    15_000
  )

  it("an engine that could not be spawned (no pid at all): nothing on the port is its", async () => {
    const plan = { argv: ["/nonexistent/cgn-engine"], env: {} } as unknown as LaunchPlan
    const { pid, exit, holder } = await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const run = yield* spawnRun(guardEntry())(plan, { run: 0, graceMs: 200, linesKept: 10 })
          const exit = yield* Deferred.await(run.exited)
          return { pid: yield* Deferred.await(run.pid), exit, holder: yield* run.portHolder(1) }
        })
      ).pipe(Effect.provide(Logger.layer([])))
    )
    expect(pid).toBeUndefined()
    expect(exit.problem).toMatch(/spawn failed/)
    expect(holder).toBe("other")
  }, 15_000)
})

describe("readiness while the holder waits", () => {
  const settings = testSettings()
  const supervise = (events: Array<SupervisorEvent>) =>
    Effect.gen(function* () {
      return {
        plan: testPlan(),
        settings,
        host: { probe: () => Effect.succeed({ ok: true }) } as unknown as EngineHostService,
        publish: (e: SupervisorEvent) => Effect.sync(() => void events.push(e)),
        memory: undefined,
        endReadyRun: yield* Ref.make<Deferred.Deferred<RestartRequest> | undefined>(undefined),
        shortage: undefined
      }
    })

  effectIt.effect("is not Ready while the pid is unknown, Ready once the engine's group holds the port", () =>
    Effect.gen(function* () {
      const events: Array<SupervisorEvent> = []
      const pid = yield* Deferred.make<PortHolder>()
      const readyAt = yield* Deferred.make<number>()
      const s = yield* supervise(events)
      yield* Effect.forkChild(watchRun(s, { run: 0, since: 0, readyAt, holder: Deferred.await(pid) }))
      yield* TestClock.adjust(30_000)
      assert.isFalse(events.some((e) => e._tag === "ProbeOk"))
      yield* Deferred.succeed(pid, "engine")
      yield* settle(
        "Ready",
        Effect.sync(() => events.some((e) => e._tag === "ProbeOk"))
      )
    }).pipe(Effect.provide(Logger.layer([])))
  )

  effectIt.effect("times out at the startup budget when the pid never comes", () =>
    Effect.gen(function* () {
      const events: Array<SupervisorEvent> = []
      const readyAt = yield* Deferred.make<number>()
      const s = yield* supervise(events)
      const watch = yield* Effect.forkChild(watchRun(s, { run: 0, since: 0, readyAt, holder: Effect.never }))
      yield* TestClock.adjust(60_000)
      assert.deepStrictEqual(yield* Fiber.join(watch), { kind: "startupTimeout" })
      assert.isTrue(events.some((e) => e._tag === "StartupTimedOut"))
      assert.isFalse(events.some((e) => e._tag === "ProbeOk"))
    }).pipe(Effect.provide(Logger.layer([])))
  )
})
