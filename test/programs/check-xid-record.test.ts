// `check` prints its problem list, its summary and `warning:` lines only: the GPU Xid record it reads in state_dir
// (layers/node/xidMemory.ts, read only for check and render) logged a JSON line amid them when it could not be read
// (a root-owned 0700 state_dir read by another user; here a directory where the record goes), a cause check already
// lists as agent.state_dir's when it is the directory's. The daemon still warns of it.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Effect, Exit, Layer, Logger, References, Scope } from "effect"
import { afterEach, describe, expect, it } from "vitest"
import { remembering, xidRecordPath } from "../../src/layers/node/xidMemory.ts"
import type { NvmlSampler } from "../../src/services/node/Nvml.ts"
import { runCli } from "../support/cli.ts"

const dirs: Array<string> = []
afterEach(() => {
  for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true })
})

/** A state_dir (0700) whose Xid record cannot be read: a directory stands where the file goes. */
const unreadableRecord = () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-check-xids-"))
  dirs.push(dir)
  const state = path.join(dir, "state")
  fs.mkdirSync(state, { mode: 0o700 })
  fs.mkdirSync(xidRecordPath(state))
  const boot = path.join(dir, "boot_id")
  fs.writeFileSync(boot, "boot-1\n")
  return { dir, state, boot }
}

/** The lines the memory logs at start, as `Level message`, for the daemon (readOnly false) or check (true). */
const startLines = async (state: string, boot: string, readOnly: boolean) => {
  const lines: Array<string> = []
  const logging = Layer.mergeAll(
    Logger.layer([Logger.make(({ logLevel, message }) => lines.push(`${logLevel} ${[message].flat()[0]}`))]),
    Layer.succeed(References.MinimumLogLevel, "Debug")
  )
  const none = Effect.succeed([])
  const sampler: NvmlSampler = { gpus: none, sampleNow: none, unavailable: Effect.succeed("no NVML here") }
  const scope = Effect.runSync(Scope.make())
  await Effect.runPromise(
    remembering(sampler, { stateDir: state, bootIdFile: boot, readOnly }).pipe(
      Scope.provide(scope),
      Effect.provide(logging)
    )
  )
  await Effect.runPromise(Scope.close(scope, Exit.void))
  return lines
}

describe("check and the GPU Xid record", () => {
  it("the daemon warns of a record it cannot read; check's read says it at debug only", async () => {
    const { state, boot } = unreadableRecord()
    const cannot = `cannot read the GPU Xid record ${xidRecordPath(state)}`
    expect((await startLines(state, boot, false)).filter((l) => l.includes(cannot))).toEqual([
      expect.stringMatching(/^Warn /)
    ])
    expect((await startLines(state, boot, true)).filter((l) => l.includes(cannot))).toEqual([
      expect.stringMatching(/^Debug /)
    ])
  })

  it("check prints no JSON log line", async () => {
    const { dir, state } = unreadableRecord()
    const config = path.join(dir, "agent.toml")
    fs.writeFileSync(
      config,
      `[agent]\nstate_dir = "${state}"\n[engine]\nkind = "openai_compat"\nurl = "http://127.0.0.1:8000"\n[models.m]\nhf_repo = "a/b"\n`
    )
    const r = await runCli(["check", "--config", config], { CGN_NVML_LIBRARY: "none" })
    const json = `${r.stdout}\n${r.stderr}`.split("\n").filter((l) => l.trimStart().startsWith("{"))
    expect(json).toEqual([])
    expect(r.stdout).toContain(`${config}: ok`)
  }, 30_000)
})
