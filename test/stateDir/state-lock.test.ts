// The state_dir lock's pure parts (layers/stateDir/stateLock.ts): reading a lock file, and whether its agent still
// holds it from what a contender sees. The lock taken, refused, taken over and released for real is in
// engine-process.test.ts ("the state dir"); here, a release that cannot remove the lock, and a stale lock another
// contender replaced just before this one moved it aside (node:fs/promises' rename scripted to make that race).
import { execFileSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Effect, Exit, Logger } from "effect"
import { describe, expect, it, vi } from "vitest"
import { pidAlive, processStartMs } from "../../src/layers/engine/processGroup.ts"
import { holdStateDir, lockFilePath, stateDirHeldHere } from "../../src/layers/stateDir/stateLock.ts"
import {
  decodeLock,
  HEARTBEAT_STALE_MS,
  type LockRecord,
  type LockSight,
  lockVerdict
} from "../../src/services/stateDir/LockVerdict.ts"
import { START_MATCH_MS } from "../../src/services/stateDir/ProcessStart.ts"

const record: LockRecord = {
  pid: 4242,
  startedAt: 1_700_000_000_000,
  pidNs: "pid:[4026531836]",
  host: "gpu-7",
  token: "t"
}
const sight = (over: Partial<LockSight> = {}): LockSight => ({
  self: { pid: 100, pidNs: "pid:[4026531836]", host: "gpu-7" },
  alive: true,
  startMs: record.startedAt,
  ageMs: 0,
  ...over
})

describe("lockVerdict", () => {
  it("held while its agent lives and started when the lock says", () => {
    expect(lockVerdict(record, sight())).toEqual({ _tag: "Held", by: "agent pid 4242", heartbeat: false })
    expect(lockVerdict(record, sight({ startMs: record.startedAt! + START_MATCH_MS }))._tag).toBe("Held")
    // where /proc cannot say when a process started, a live pid is taken as the holder
    expect(lockVerdict({ ...record, startedAt: undefined }, sight({ startMs: undefined }))._tag).toBe("Held")
  })

  it("stale once its agent is gone, its pid is another process's, or it names this process's own pid", () => {
    expect(lockVerdict(record, sight({ alive: false }))).toEqual({ _tag: "Stale", why: "agent pid 4242 is gone" })
    expect(lockVerdict(record, sight({ startMs: record.startedAt! + START_MATCH_MS + 1 }))).toMatchObject({
      _tag: "Stale",
      why: expect.stringMatching(/a reused pid$/)
    })
    expect(lockVerdict(record, sight({ self: { ...sight().self, pid: 4242 } }))._tag).toBe("Stale")
    expect(lockVerdict(undefined, sight())._tag).toBe("Stale")
  })

  it("from another pid namespace or host, a pid says nothing: held while its heartbeat is recent", () => {
    for (const self of [
      { pid: 1, pidNs: "pid:[4026532999]", host: "gpu-7" },
      { pid: 1, pidNs: "pid:[4026531836]", host: "gpu-8" }
    ]) {
      // the pid is not looked at: alive or not here, it is another process
      const fresh = lockVerdict(record, sight({ self, alive: false, ageMs: HEARTBEAT_STALE_MS - 1 }))
      expect(fresh).toMatchObject({ _tag: "Held", heartbeat: true })
      expect(lockVerdict(record, sight({ self, alive: true, ageMs: HEARTBEAT_STALE_MS }))._tag).toBe("Stale")
    }
  })
})

describe("decodeLock", () => {
  it("reads what the holder writes; anything else is no record", () => {
    expect(decodeLock(`${JSON.stringify(record)}\n`)).toEqual(record)
    const { startedAt: _, pidNs: __, ...bare } = record
    expect(decodeLock(JSON.stringify(bare))).toEqual({ ...bare, startedAt: undefined, pidNs: undefined })
    for (const text of ["", "{", "null", '{"pid":"1","host":"h","token":"t"}', '{"pid":1}']) {
      expect(decodeLock(text)).toBeUndefined()
    }
  })
})

describe("pidAlive", () => {
  it("pid 1 is a process (an agent without an init in its container is pid 1); 0 and below are not", () => {
    expect(pidAlive(1)).toBe(true)
    expect(pidAlive(process.pid)).toBe(true)
    for (const pid of [0, -1, 1.5]) expect(pidAlive(pid)).toBe(false)
  })
})

describe("release", () => {
  // chattr +i makes a file that even root cannot remove (ext4, xfs); where it cannot be set the case is skipped,
  // named.
  const canChattr = (() => {
    const probe = path.join(os.tmpdir(), `cgn-chattr-${process.pid}`)
    try {
      fs.writeFileSync(probe, "")
      execFileSync("chattr", ["+i", probe], { stdio: "ignore" })
      execFileSync("chattr", ["-i", probe], { stdio: "ignore" })
      return true
    } catch {
      return false
    } finally {
      fs.rmSync(probe, { force: true })
    }
  })()

  // what the lease record relies on (layers/registry/leaseRecord.ts): only the holder may act as this node's agent
  it("stateDirHeldHere: true while this process holds the lock and it is still this holding's, false otherwise", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-lock-held-"))
    const other = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-lock-other-"))
    try {
      expect(await stateDirHeldHere(dir)).toBe(false)
      const seen = await Effect.runPromise(
        Effect.scoped(
          Effect.gen(function* () {
            yield* holdStateDir(dir)
            const held = yield* Effect.promise(() => stateDirHeldHere(dir))
            // the same directory spelled relative to the working directory
            const relative = yield* Effect.promise(() => stateDirHeldHere(path.relative(process.cwd(), dir)))
            const elsewhere = yield* Effect.promise(() => stateDirHeldHere(other))
            // another agent took it over (this one silent past the heartbeat): no longer this holding's
            const before = fs.readFileSync(lockFilePath(dir), "utf8")
            fs.writeFileSync(lockFilePath(dir), `${JSON.stringify({ ...record, token: "successor" })}\n`)
            const takenOver = yield* Effect.promise(() => stateDirHeldHere(dir))
            fs.writeFileSync(lockFilePath(dir), before)
            return { held, relative, elsewhere, takenOver }
          })
        )
      )
      expect(seen).toEqual({ held: true, relative: true, elsewhere: false, takenOver: false })
      // released with its scope
      expect(await stateDirHeldHere(dir)).toBe(false)
    } finally {
      fs.rmSync(dir, { recursive: true, force: true })
      fs.rmSync(other, { recursive: true, force: true })
    }
  })

  it("removes the lock at its release only while it is this holding's: a successor's lock stays", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-lock-release-"))
    const lock = lockFilePath(dir)
    // another agent took the lock over meanwhile (this one's heartbeat silent past HEARTBEAT_STALE_MS)
    const successor = `${JSON.stringify({ ...record, token: "successor" })}\n`
    try {
      const exit = await Effect.runPromiseExit(
        Effect.scoped(
          Effect.andThen(
            holdStateDir(dir),
            Effect.sync(() => fs.writeFileSync(lock, successor))
          )
        )
      )
      expect(Exit.isSuccess(exit), String(exit)).toBe(true)
      expect(fs.readFileSync(lock, "utf8")).toBe(successor)
    } finally {
      fs.rmSync(dir, { recursive: true, force: true })
    }
  })

  it("a stale lock another contender replaced meanwhile is put back: that agent holds the state_dir, this one is refused", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-lock-race-"))
    const lock = lockFilePath(dir)
    const self = { pidNs: fs.readlinkSync("/proc/self/ns/pid"), host: os.hostname() }
    // left by an agent that is gone: judged stale at once
    const dead = Number(execFileSync("sh", ["-c", "sh -c 'echo $$'"], { encoding: "utf8" }).trim())
    fs.writeFileSync(lock, `${JSON.stringify({ ...self, pid: dead, startedAt: 0, token: "dead" })}\n`)
    // the other contender, alive: it takes the stale lock over between this one's judging it and moving it aside
    const other = process.ppid
    const othersLock = `${JSON.stringify({ ...self, pid: other, startedAt: processStartMs(other), token: "other" })}\n`
    vi.resetModules()
    vi.doMock("node:fs/promises", async (original) => {
      const real = await original<typeof import("node:fs/promises")>()
      let raced = false
      const rename = async (from: string, to: string) => {
        if (!raced && from === lock && to.endsWith(".stale")) {
          raced = true
          await real.writeFile(lock, othersLock)
        }
        return real.rename(from, to)
      }
      return { ...real, default: { ...real, rename }, rename }
    })
    try {
      const { holdStateDir: hold } = await import("../../src/layers/stateDir/stateLock.ts")
      const exit = await Effect.runPromiseExit(Effect.scoped(hold(dir)).pipe(Effect.provide(Logger.layer([]))))
      expect(JSON.stringify(exit)).toContain('"reason":"AnotherAgent"')
      expect(fs.readFileSync(lock, "utf8")).toBe(othersLock)
    } finally {
      vi.doUnmock("node:fs/promises")
      vi.resetModules()
      fs.rmSync(dir, { recursive: true, force: true })
    }
  })

  it.skipIf(!canChattr)(
    "a lock that cannot be removed is logged and left to the next agent, not a defect",
    async () => {
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-lock-release-"))
      const lock = lockFilePath(dir)
      const warnings: Array<string> = []
      const logger = Logger.make(({ logLevel, message }) => {
        if (logLevel === "Warn") warnings.push([message].flat().join(" "))
      })
      try {
        const exit = await Effect.runPromiseExit(
          Effect.scoped(
            Effect.andThen(
              holdStateDir(dir),
              Effect.sync(() => execFileSync("chattr", ["+i", lock]))
            )
          ).pipe(Effect.provide(Logger.layer([logger])))
        )
        expect(Exit.isSuccess(exit), String(exit)).toBe(true)
        expect(warnings.some((w) => w.includes(`could not remove ${lock}`))).toBe(true)
      } finally {
        execFileSync("chattr", ["-i", lock], { stdio: "ignore" })
        fs.rmSync(dir, { recursive: true, force: true })
      }
    }
  )
})
