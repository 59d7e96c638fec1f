// The agent's stop of a stale engine group (layers/engine/groupWait.ts stopGroup: ONE TERM, CONT, the grace, KILL,
// confirmed), which the start-up reclaim (pidFile.ts) runs, over real process groups (detached shells) on a TestClock:
// a group already gone, one that exits on the TERM after the KILL wait but within the grace, one that takes no TERM,
// and a stopped one. Each outcome is what the reclaim logs and acts on ("survived" refuses the start).
import { type ChildProcess, spawn } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterEach, assert, describe, it } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import { TestClock } from "effect/testing"
import { stopGroup } from "../../src/layers/engine/groupWait.ts"
import { groupAlive, readStat } from "../../src/layers/engine/processGroup.ts"
import { settle } from "../support/poll.ts"

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

/** `command` as the leader of its own process group (as the guard spawns an engine). */
const group = (command: string, args: ReadonlyArray<string>): ChildProcess & { readonly pid: number } => {
  const c = spawn(command, args, { detached: true, stdio: "ignore" })
  children.push(c)
  if (c.pid === undefined) throw new Error("no pid")
  return c as ChildProcess & { readonly pid: number }
}

/** A file in the test's temp dir, for a shell to say what it did (a trap that ran). */
const marker = (name: string) => {
  dir ??= fs.mkdtempSync(path.join(os.tmpdir(), "cgn-groupwait-"))
  return path.join(dir, name)
}

/** A bounded wait (real time) for what a process does by itself. */
const until = (what: string, holds: () => boolean) => settle(what, Effect.sync(holds), 10_000)

describe("stopGroup", () => {
  it.effect("a group already gone is 'gone', not 'terminated'", () =>
    Effect.gen(function* () {
      const c = group("sh", ["-c", "exit 0"])
      yield* Effect.promise(() => new Promise((resolve) => c.once("exit", resolve)))
      assert.strictEqual(yield* stopGroup(c.pid, 1_000, 100), "gone")
    })
  )

  it.effect("a group that exits on the TERM after the KILL wait, within the grace: waited for, 'terminated'", () =>
    Effect.gen(function* () {
      const [ready, termed, go] = [marker("ready"), marker("termed"), marker("go")]
      const c = group("sh", [
        "-c",
        `trap 'touch ${termed}; while [ ! -e ${go} ]; do sleep 0.01; done; exit 0' TERM; touch ${ready}; while :; do sleep 0.01; done`
      ])
      yield* until("the trap set", () => fs.existsSync(ready))
      const fiber = yield* Effect.forkChild(stopGroup(c.pid, 2_000, 100))
      yield* until("the TERM taken", () => fs.existsSync(termed))
      // ten KILL waits on, within the grace: no KILL yet
      yield* TestClock.adjust(1_000)
      assert.isTrue(groupAlive(c.pid), "not killed within the grace")
      assert.isUndefined(fiber.pollUnsafe(), "still waiting out the grace")
      fs.writeFileSync(go, "")
      yield* until("the group's exit", () => !groupAlive(c.pid))
      yield* TestClock.adjust(25)
      assert.strictEqual(yield* Fiber.join(fiber), "terminated")
    })
  )

  it.effect("a group that takes no TERM is KILLed at the end of the grace: 'killed', so the start goes on", () =>
    Effect.gen(function* () {
      const [ready, termed] = [marker("ready"), marker("termed")]
      // the shell notes the TERM and runs on (its sleeps die of it and are started again)
      const c = group("sh", ["-c", `trap 'touch ${termed}' TERM; touch ${ready}; while :; do sleep 0.01; done`])
      yield* until("the trap set", () => fs.existsSync(ready))
      const fiber = yield* Effect.forkChild(stopGroup(c.pid, 1_000, 10_000))
      yield* until("the TERM taken", () => fs.existsSync(termed))
      yield* TestClock.adjust(999)
      assert.isTrue(groupAlive(c.pid), "alive through the grace")
      yield* TestClock.adjust(1)
      yield* until("the group KILLed", () => !groupAlive(c.pid))
      yield* TestClock.adjust(25)
      assert.strictEqual(yield* Fiber.join(fiber), "killed")
    })
  )

  it.effect("a stopped group is continued: it takes the TERM at once, 'terminated', not KILLed after the grace", () =>
    Effect.gen(function* () {
      const c = group("sleep", ["30"])
      process.kill(c.pid, "SIGSTOP")
      yield* until("the process stopped", () => readStat(c.pid)?.state === "T")
      const fiber = yield* Effect.forkChild(stopGroup(c.pid, 60_000, 100))
      // no time passes on the Clock: only the TERM, taken once continued, can end it
      yield* until("the group's exit", () => !groupAlive(c.pid))
      yield* TestClock.adjust(25)
      assert.strictEqual(yield* Fiber.join(fiber), "terminated")
    })
  )
})
