// The cordon: the pure decisions (state precedence draining > cordoned > the rest, the reason's validation, the
// record's text) and the live layer's record in agent.state_dir (written atomically on cordon, removed on
// uncordon, read at start; a failed write is a typed error and the node stays as it was).
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Effect, Layer, Logger, Result } from "effect"
import { afterEach, describe, expect, it } from "vitest"
import * as ConfigLayer from "../../src/layers/config/Config.ts"
import * as CordonLive from "../../src/layers/node/Cordon.ts"
import { readiness } from "../../src/services/admin/Admin.ts"
import type { EngineState } from "../../src/services/engine/EngineProcess.ts"
import {
  Cordon,
  decodeRecord,
  encodeRecord,
  MAX_REASON_LENGTH,
  parseCordonBody,
  validateReason
} from "../../src/services/node/Cordon.ts"
import { nodeState } from "../../src/services/node/NodeHealthView.ts"
import { testNodeHealth } from "../../src/testing/NodeStatus.ts"

const ready: EngineState = { _tag: "Ready", since: 0, run: 1 }
const starting: EngineState = { _tag: "Starting", since: 0, run: 1, phase: "loading" }

describe("cordon decisions (pure)", () => {
  it("state precedence: draining > cordoned > a problem > the engine's state", () => {
    expect(nodeState(ready, true, "gpu fault", true)).toBe("draining")
    expect(nodeState(ready, false, "gpu fault", true)).toBe("cordoned")
    expect(nodeState(starting, false, undefined, true)).toBe("cordoned")
    expect(nodeState(ready, false, "gpu fault", false)).toBe("unhealthy")
    expect(nodeState(ready, false, undefined, false)).toBe("ready")
    expect(nodeState(ready, false)).toBe("ready")
  })

  it("readiness says just 'cordoned'; the drain's reason wins", () => {
    expect(readiness(testNodeHealth({ state: "cordoned" }), false)).toEqual({ ready: false, reason: "cordoned" })
    expect(readiness(testNodeHealth({ state: "cordoned" }), true)).toEqual({ ready: false, reason: "draining" })
  })

  it("the reason: optional, trimmed, bounded, printable; the body JSON or empty", () => {
    expect(parseCordonBody("")).toEqual(Result.succeed(""))
    expect(parseCordonBody("{}")).toEqual(Result.succeed(""))
    expect(parseCordonBody('{"reason": "  GPU 3 Xid 79  "}')).toEqual(Result.succeed("GPU 3 Xid 79"))
    expect(parseCordonBody('{"reason": "débogage GPU"}')).toEqual(Result.succeed("débogage GPU"))
    expect(parseCordonBody('{"reason": "GPU 🔥 \\ud83d\\udd25"}')).toEqual(Result.succeed("GPU 🔥 🔥"))
    expect(validateReason("é".repeat(MAX_REASON_LENGTH))._tag).toBe("Success")
    // README: at most 256 printable characters; an emoji is one character (two UTF-16 units)
    expect(validateReason("😀".repeat(256))).toEqual(Result.succeed("😀".repeat(256)))
    expect(Result.isFailure(validateReason("😀".repeat(257)))).toBe(true)
    for (const bad of [
      "{",
      "[1]",
      '"x"',
      "null",
      '{"reason": 3}',
      '{"reason": "a\\nb"}',
      '{"reason": "\\u001b[31m"}',
      // a bidi override and a zero-width space (format characters: they change what a reader sees), a lone surrogate
      '{"reason": "\\u202eevil"}',
      '{"reason": "a\\u200bb"}',
      '{"reason": "\\ud800x"}'
    ]) {
      expect(Result.isFailure(parseCordonBody(bad)), bad).toBe(true)
    }
    expect(Result.isFailure(validateReason("x".repeat(MAX_REASON_LENGTH + 1)))).toBe(true)
  })

  it("the record's text round-trips; anything else is not a record", () => {
    const record = { since: Date.parse("2025-03-01T10:00:00Z"), reason: "bench" }
    expect(decodeRecord(encodeRecord(record))).toEqual(record)
    for (const bad of ["", "{", "{}", '{"since": "yesterday"}', '{"since": "2025-03-01T10:00:00Z", "reason": 1}']) {
      expect(decodeRecord(bad), bad).toBeUndefined()
    }
  })
})

const dirs: Array<string> = []
afterEach(() => {
  for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true })
})
const tempDir = () => {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-cordon-"))
  dirs.push(d)
  return d
}

/** Runs `f` on a live cordon over `stateDir`; what it logs ("LEVEL message") goes to `logs` when given. */
const withCordon = <A, E>(
  stateDir: string,
  f: (c: Cordon["Service"]) => Effect.Effect<A, E>,
  logs: Array<string> = []
) =>
  Effect.runPromise(
    Effect.flatMap(Cordon, f).pipe(
      Effect.provide(
        CordonLive.layer.pipe(
          Layer.provide(
            ConfigLayer.layerFromObject({ models: { m: { hf_repo: "org/m" } }, agent: { state_dir: stateDir } })
          )
        )
      ),
      Effect.provide(
        Logger.layer([Logger.make(({ logLevel, message }) => logs.push(`${logLevel} ${[message].flat().join(" ")}`))])
      )
    )
  )

describe("cordon record in agent.state_dir (live layer)", () => {
  it("written on cordon, read at the next start, removed on uncordon", async () => {
    const dir = path.join(tempDir(), "state") // not there yet: the cordon creates it
    const file = CordonLive.cordonFilePath(dir)
    const first = await withCordon(dir, (c) => c.cordon("GPU 3"))
    expect(first.already).toBe(false)
    expect(decodeRecord(fs.readFileSync(file, "utf8"))).toEqual(first.record)
    expect(fs.readdirSync(dir)).toEqual(["cordon.json"]) // no temp file left behind

    // the start says so: an operator who forgot the cordon sees why the node takes no calls
    const logs: Array<string> = []
    const restarted = await withCordon(dir, (c) => Effect.all([c.current, c.cordon(""), c.cordon("GPU 3")]), logs)
    expect(logs.filter((l) => l.includes("starting cordoned"))).toEqual([
      expect.stringMatching(/^Warn starting cordoned: new Generate calls are refused until POST \/uncordon/)
    ])
    expect(restarted[0]).toEqual(first.record)
    // no reason, or the same one: the record as it was
    expect(restarted[1]).toEqual({ already: true, record: first.record })
    expect(restarted[2]).toEqual({ already: true, record: first.record })
    // a new reason replaces the old on disk, the time the cordon began kept
    const renamed = await withCordon(dir, (c) => c.cordon("GPU 3 replaced; waiting for burn-in"))
    expect(renamed).toEqual({
      already: true,
      record: { since: first.record.since, reason: "GPU 3 replaced; waiting for burn-in" }
    })
    expect(decodeRecord(fs.readFileSync(file, "utf8"))).toEqual(renamed.record)

    expect(await withCordon(dir, (c) => c.uncordon)).toEqual({ was: true })
    expect(fs.existsSync(file)).toBe(false)
    expect(await withCordon(dir, (c) => c.cordoned)).toBe(false)
  })

  it("a record that cannot be read starts the node cordoned (the operator's intent is kept)", async () => {
    const dir = tempDir()
    fs.writeFileSync(CordonLive.cordonFilePath(dir), "half a rec")
    // a link is not followed (README): unreadable too
    const linked = tempDir()
    fs.writeFileSync(path.join(linked, "elsewhere"), "{}")
    fs.symlinkSync(path.join(linked, "elsewhere"), CordonLive.cordonFilePath(linked))
    for (const d of [dir, linked]) {
      const [cordoned, record] = await withCordon(d, (c) => Effect.all([c.cordoned, c.current]))
      expect(cordoned).toBe(true)
      // the reason /status shows for it, so the operator knows to look at the file
      expect(record?.reason).toBe("unreadable cordon record")
    }
  })

  it("a record with the longest reason (256 characters, 4 UTF-8 bytes each) reads back at the next start", async () => {
    const dir = tempDir()
    const reason = "😀".repeat(256) // README: at most 256 printable characters; an emoji is one
    const first = await withCordon(dir, (c) => c.cordon(reason))
    expect(await withCordon(dir, (c) => c.current)).toEqual(first.record)
  })

  it("a failed write is a CordonPersistError naming the file, and the node stays uncordoned", async () => {
    const notADir = path.join(tempDir(), "file")
    fs.writeFileSync(notADir, "")
    const [error, cordoned] = await withCordon(notADir, (c) => Effect.all([Effect.flip(c.cordon("x")), c.cordoned]))
    expect(error._tag).toBe("CordonPersistError")
    expect(error.message).toContain(CordonLive.cordonFilePath(notADir))
    expect(cordoned).toBe(false)
  })
})
