// The GPU Xid record's writer (layers/node/xidRecordWriter.ts) over a scripted write, on a TestClock: a clear whose
// write outlives its wait never lets two writes run at once nor an older record land after a newer one (a review
// showed it with a 7 s fsync); a failing disk is said once per errno code; counts alone wait 30 s; the flush writes
// the last change; temp files of earlier processes are swept.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber, Logger } from "effect"
import { TestClock } from "effect/testing"
import { recordWriter } from "../../src/layers/node/xidRecordWriter.ts"
import { sweepTemps } from "../../src/layers/stateDir/stateFiles.ts"

/** A write the test settles by hand: what each write wrote, in order, and how many ran at once at most. */
const scripted = () => {
  const writes: Array<{ content: string; settle: (error?: Error) => void }> = []
  let running = 0
  let maxRunning = 0
  const writeFile = (_file: string, content: string) =>
    new Promise<string | undefined>((resolve, reject) => {
      running++
      maxRunning = Math.max(maxRunning, running)
      writes.push({
        content,
        settle: (error) => {
          running--
          if (error === undefined) resolve(undefined)
          else reject(error)
        }
      })
    })
  return { writes, writeFile, maxRunning: () => maxRunning }
}

/** Lets the detached fibers and promise callbacks run. */
const settleAll = Effect.promise(() => new Promise((r) => setImmediate(r)))

const errno = (code: string, file: string) => Object.assign(new Error(`${code}: open '${file}'`), { code })

describe("the Xid record's writer", () => {
  it.effect("a clear whose write outlives its wait: one write at a time, the newest record last", () =>
    Effect.gen(function* () {
      const s = scripted()
      let version = 1
      const writer = recordWriter("/x/gpu-xids.json", () => `v${version}`, s.writeFile)
      const clear = yield* Effect.forkChild(Effect.flip(writer.writeNow))
      yield* settleAll
      yield* TestClock.adjust("5 seconds")
      const failure = yield* Fiber.join(clear)
      assert.strictEqual(failure._tag, "XidRecordError")
      assert.match(failure.message, /no answer within 5s/)
      // the clear is undone and a new Xid comes while the first write still runs: no second write yet
      version = 2
      yield* writer.note("xids")
      yield* settleAll
      assert.deepStrictEqual(
        s.writes.map((w) => w.content),
        ["v1"]
      )
      s.writes[0]?.settle()
      yield* settleAll
      assert.deepStrictEqual(
        s.writes.map((w) => w.content),
        ["v1", "v2"]
      )
      s.writes[1]?.settle()
      yield* settleAll
      assert.strictEqual(s.maxRunning(), 1)
    })
  )

  it.effect("a failing disk is said once per errno code, whatever file each write names", () => {
    const lines: Array<string> = []
    const logger = Logger.make(({ message }) => lines.push(JSON.stringify(message)))
    return Effect.gen(function* () {
      const s = scripted()
      const writer = recordWriter("/x/gpu-xids.json", () => "v", s.writeFile)
      for (let i = 0; i < 3; i++) {
        yield* writer.note("xids")
        yield* settleAll
        s.writes[i]?.settle(errno("EROFS", `/x/gpu-xids.json.1.${i}.tmp`))
        yield* settleAll
      }
      assert.strictEqual(s.writes.length, 3)
      assert.strictEqual(lines.filter((l) => l.includes("cannot write the GPU Xid record")).length, 1)
    }).pipe(Effect.provide(Logger.layer([logger])))
  })

  it.effect(
    "event counts alone are written once 30 s (README) have passed since the last write, not a moment less",
    () =>
      Effect.gen(function* () {
        const s = scripted()
        const writer = recordWriter("/x/gpu-xids.json", () => "v", s.writeFile)
        yield* writer.note("xids")
        yield* settleAll
        s.writes[0]?.settle()
        yield* settleAll
        yield* writer.note("counts")
        yield* TestClock.adjust("29999 millis")
        yield* writer.note("none")
        yield* settleAll
        assert.strictEqual(s.writes.length, 1, "counts wait")
        yield* TestClock.adjust("1 millis")
        yield* writer.note("none")
        yield* settleAll
        assert.strictEqual(s.writes.length, 2, "written at 30 s")
      })
  )

  it.effect("a failed clear leaves the next write due at once: the next sample writes", () =>
    Effect.gen(function* () {
      const s = scripted()
      const writer = recordWriter("/x/gpu-xids.json", () => "v", s.writeFile)
      yield* writer.note("xids")
      yield* settleAll
      s.writes[0]?.settle()
      yield* settleAll
      const clear = yield* Effect.forkChild(Effect.flip(writer.writeNow))
      yield* settleAll
      s.writes[1]?.settle(errno("EIO", "/x/gpu-xids.json"))
      assert.strictEqual((yield* Fiber.join(clear))._tag, "XidRecordError")
      yield* writer.note("none")
      yield* settleAll
      assert.strictEqual(s.writes.length, 3, "written again at once, not 30 s after the last write")
    })
  )

  it.effect("the flush writes the last change after the write in flight", () =>
    Effect.gen(function* () {
      const s = scripted()
      let version = 1
      const writer = recordWriter("/x/gpu-xids.json", () => `v${version}`, s.writeFile)
      yield* writer.note("xids")
      yield* settleAll
      version = 2
      yield* writer.note("counts")
      const flush = yield* Effect.forkChild(writer.flush)
      yield* settleAll
      s.writes[0]?.settle()
      yield* settleAll
      s.writes[1]?.settle()
      yield* Fiber.join(flush)
      assert.deepStrictEqual(
        s.writes.map((w) => w.content),
        ["v1", "v2"]
      )
    })
  )

  it.effect("temp files of earlier processes are swept, this process's and other files kept", () =>
    Effect.gen(function* () {
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-xid-sweep-"))
      const file = path.join(dir, "gpu-xids.json")
      const names = ["gpu-xids.json", "gpu-xids.json.1.3.tmp", `gpu-xids.json.${process.pid}.1.tmp`, "cordon.json"]
      for (const n of names) fs.writeFileSync(path.join(dir, n), "")
      yield* sweepTemps(file)
      assert.deepStrictEqual(fs.readdirSync(dir).sort(), names.filter((n) => n !== "gpu-xids.json.1.3.tmp").sort())
      fs.rmSync(dir, { recursive: true, force: true })
    })
  )
})
