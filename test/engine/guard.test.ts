// The orphan guard's pure parts: its command line, its fd-3 report lines, and the /proc stat parser the
// zombie-aware group liveness relies on; and the guard program's stop on each of its triggers (the lifeline, a
// signal to the guard), which must reach the engine as exactly one SIGTERM.
import { spawn } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterEach, assert, describe, it } from "@effect/vitest"
import {
  bootTimeOf,
  groupAlive,
  groupMembers,
  parseProcStat,
  processExe,
  processStartMs,
  readStat,
  startTicksOf
} from "../../src/layers/engine/processGroup.ts"
import { guardEntry } from "../../src/programs/programPaths.ts"
import { buildGuardArgs, decodeReport, encodeReport, parseGuardArgs } from "../../src/services/engine/GuardProtocol.ts"
import { START_MATCH_MS, startMatches } from "../../src/services/stateDir/ProcessStart.ts"
import { pollUntil } from "../support/poll.ts"

describe("guard command line", () => {
  it("round-trips grace and the engine argv, including words that look like options", () => {
    const args = { graceMs: 500, argv: ["vllm", "serve", "m", "--", "--grace-ms", "9"] }
    assert.deepStrictEqual(parseGuardArgs(buildGuardArgs(args)), args)
  })
  it.each([
    [["vllm"], "missing `--` before the engine command"],
    [["--grace-ms", "1", "--"], "no engine command after `--`"],
    [["--grace-ms", "soon", "--", "x"], "invalid --grace-ms soon"],
    [["--grace-ms", "-1", "--", "x"], "invalid --grace-ms -1"],
    [["--bogus", "--", "x"], "unknown guard option --bogus"]
  ])("%j -> %s", (args, expected) => assert.strictEqual(parseGuardArgs(args), expected))
  // engine.stop_grace = "0s" is a valid config (ConfigValues parseShortDuration), passed on as --grace-ms 0
  it("takes a grace of 0 ms", () =>
    assert.deepStrictEqual(parseGuardArgs(["--grace-ms", "0", "--", "x"]), { graceMs: 0, argv: ["x"] }))
})

describe("guard reports", () => {
  it.each([
    [{ t: "spawned", pid: 42 }],
    [{ t: "spawn-error", message: "spawn vllm ENOENT" }],
    [{ t: "exit", code: 1, signal: null }],
    [{ t: "exit", code: null, signal: "SIGKILL" }],
    [{ t: "stopped", outcome: "killed" }],
    [{ t: "stopped", outcome: "survived" }]
  ] as const)("%j round-trips", (report) => assert.deepStrictEqual(decodeReport(encodeReport(report).trim()), report))
  it("an exit status whose code is not a number: the code is null (the signal says how it ended)", () =>
    assert.deepStrictEqual(decodeReport('{"t":"exit","code":"1","signal":"SIGKILL"}'), {
      t: "exit",
      code: null,
      signal: "SIGKILL"
    }))
  it.each(["", "not json", "null", '{"t":"spawned"}', '{"t":"other"}', '{"t":"stopped","outcome":"maybe"}'])(
    "%j is not a report",
    (line) => assert.strictEqual(decodeReport(line), undefined)
  )
})

describe("parseProcStat", () => {
  it.each([
    ["123 (node) S 1 123 123 0 -1", { pid: 123, state: "S", ppid: 1, pgrp: 123 }],
    ["77 (a) b (c)) Z 5 70 70 0", { pid: 77, state: "Z", ppid: 5, pgrp: 70 }],
    ["9 (sleep 1000) R 8 9 9", { pid: 9, state: "R", ppid: 8, pgrp: 9 }]
  ])("%s", (text, expected) => assert.deepStrictEqual(parseProcStat(text), expected))
  it("rejects garbage", () => assert.strictEqual(parseProcStat("garbage"), undefined))
})

describe("a process's start time from /proc", () => {
  const stat = (comm: string) =>
    `4242 (${comm}) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 6158817 12345 67 18446744073709551615`
  it("reads starttime (field 22) after any command name", () => {
    assert.strictEqual(startTicksOf(stat("node")), 6158817)
    assert.strictEqual(startTicksOf(stat("a) b (c")), 6158817)
    assert.strictEqual(startTicksOf("garbage"), undefined)
    assert.strictEqual(startTicksOf("1 (x) S 1 1"), undefined)
  })
  it("reads btime, and this process's own start is within a second of now", () => {
    assert.strictEqual(bootTimeOf("cpu  1 2 3\nbtime 1796279875\nprocesses 9\n"), 1796279875)
    assert.strictEqual(bootTimeOf("cpu 1 2 3\n"), undefined)
    const started = processStartMs(process.pid)
    assert.isDefined(started)
    assert.isBelow(Math.abs(started! - (Date.now() - process.uptime() * 1000)), 1_000)
  })
})

describe("a process group's members and an engine's executable, from /proc", () => {
  /** Polls `check` every 10 ms, at most 5 s: a process's state as it comes. */
  const until = async (what: string, check: () => boolean) => {
    for (let i = 0; i < 500; i++) {
      if (check()) return
      await new Promise((r) => setTimeout(r, 10))
    }
    throw new Error(`timed out waiting for ${what}`)
  }

  it("counts a zombie member as dead (PID 1 in a container often does not reap)", async () => {
    // sh forks a short sleep, then execs a long one that never reaps it: a zombie stays in the group
    const p = spawn("sh", ["-c", "sleep 0.01 & exec sleep 30"], { detached: true, stdio: "ignore" })
    const pgid = p.pid as number
    try {
      const zombies = () =>
        fs
          .readdirSync("/proc")
          .filter((n) => /^\d+$/.test(n))
          .map((n) => readStat(Number(n)))
          .filter((st) => st !== undefined && st.pgrp === pgid && st.state === "Z")
      await until("the zombie", () => zombies().length === 1)
      assert.deepStrictEqual(groupMembers(pgid), [pgid])
      process.kill(pgid, "SIGKILL")
      // the group's leader killed, only the zombie is left (its parent gone, init reaps it in its own time)
      await until("the group counted dead", () => !groupAlive(pgid))
    } finally {
      try {
        process.kill(-pgid, "SIGKILL")
      } catch {}
    }
  })

  it("reads a replaced executable's path without the ' (deleted)' the link then carries", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-exe-"))
    const exe = path.join(dir, "engine")
    fs.copyFileSync(fs.realpathSync("/bin/sleep"), exe)
    fs.chmodSync(exe, 0o700)
    const p = spawn(exe, ["30"], { stdio: "ignore" })
    try {
      const pid = p.pid as number
      await until("the exec", () => processExe(pid) === exe)
      fs.rmSync(exe) // a package upgrade replaces the binary under the running engine
      assert.strictEqual(fs.readlinkSync(`/proc/${pid}/exe`), `${exe} (deleted)`)
      assert.strictEqual(processExe(pid), exe)
    } finally {
      p.kill("SIGKILL")
      fs.rmSync(dir, { recursive: true, force: true })
    }
  })

  it("takes a recorded start within 15 s of /proc's for the same process, and one further off for a reused pid", () => {
    assert.strictEqual(START_MATCH_MS, 15_000)
    assert.isTrue(startMatches(100_000, 115_000))
    assert.isTrue(startMatches(115_000, 100_000))
    assert.isFalse(startMatches(100_000, 116_000))
    assert.isFalse(startMatches(100_000, 40_000))
  })
})

describe("the guard program's stop", () => {
  /** An engine that says each SIGTERM it gets on stderr and exits 1 s after the first, as a graceful shutdown does. */
  const engine =
    "let n = 0; process.on('SIGTERM', () => { process.stderr.write('TERM ' + ++n + '\\n'); if (n === 1) setTimeout(() => process.exit(0), 1000) });" +
    "setInterval(() => {}, 1000); process.stderr.write('up\\n')"

  /** The guard over that engine (grace 10 s), its stdin the lifeline; resolves once the engine is up. */
  const startGuard = async (engineCode = engine) => {
    const guard = spawn(
      process.execPath,
      [guardEntry(), "--grace-ms", "10000", "--", process.execPath, "-e", engineCode],
      {
        stdio: ["pipe", "ignore", "pipe", "pipe"]
      }
    )
    const out = { stderr: "", reports: "" }
    guard.stderr?.on("data", (d) => (out.stderr += String(d)))
    guard.stdio[3]?.on("data", (d) => (out.reports += String(d)))
    const exited = new Promise<{ code: number | null; signal: string | null }>((resolve) =>
      guard.once("exit", (code, signal) => resolve({ code, signal }))
    )
    // every line the engine wrote is read once its stderr (shared with the guard's) is closed: the group gone
    const closed = new Promise<void>((resolve) => guard.once("close", () => resolve()))
    const pgid = () => Number(/"t":"spawned","pid":(\d+)/.exec(out.reports)?.[1])
    cleanups.push(() => {
      guard.kill("SIGKILL")
      try {
        if (pgid() > 0) process.kill(-pgid(), "SIGKILL")
      } catch {}
    })
    await pollUntil("the engine up", () => out.stderr.includes("up\n") && pgid() > 0)
    return { guard, out, exited, closed, pgid: pgid() }
  }
  const cleanups: Array<() => void> = []
  afterEach(() => {
    for (const c of cleanups.splice(0)) c()
  })
  const terms = (stderr: string) => stderr.split("\n").filter((l) => l.startsWith("TERM"))

  // A second TERM is the engine's "exit now" (guard.ts stopGroup); Ctrl-C on an agent run in a terminal signals the
  // agent and the guard (same process group) while the agent closes the lifeline: two triggers, one stop.
  it("a SIGINT to the guard during the stop the lifeline began sends no second SIGTERM", async () => {
    const { guard, out, exited, closed, pgid } = await startGuard()
    guard.stdin?.end()
    await pollUntil("the first TERM", () => terms(out.stderr).length > 0)
    guard.kill("SIGINT")
    assert.deepStrictEqual(await exited, { code: 0, signal: null })
    assert.isFalse(groupAlive(pgid))
    await closed
    assert.deepStrictEqual(terms(out.stderr), ["TERM 1"])
    assert.include(out.reports, '{"t":"stopped","outcome":"terminated"}')
  }, 20_000)

  it("an engine that exits by itself: its exit status, then the stop of a group already gone, exit 0", async () => {
    const { out, exited, pgid } = await startGuard(
      "process.stderr.write('up\\n'); setTimeout(() => process.exit(3), 100)"
    )
    assert.deepStrictEqual(await exited, { code: 0, signal: null })
    assert.isFalse(groupAlive(pgid))
    assert.deepStrictEqual(out.reports.trim().split("\n").slice(1).map(decodeReport), [
      { t: "exit", code: 3, signal: null },
      { t: "stopped", outcome: "gone" }
    ])
  }, 20_000)

  it.each(["SIGTERM", "SIGINT", "SIGHUP"] as const)(
    "%s to the guard stops the engine's group as the lifeline does (one SIGTERM, the group gone) before it exits",
    async (signal) => {
      const { guard, out, exited, closed, pgid } = await startGuard()
      guard.kill(signal)
      assert.deepStrictEqual(await exited, { code: 0, signal: null })
      assert.isFalse(groupAlive(pgid))
      await closed
      assert.deepStrictEqual(terms(out.stderr), ["TERM 1"])
    },
    20_000
  )
})
