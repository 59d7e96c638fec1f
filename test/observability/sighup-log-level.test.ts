// A SIGHUP that moves the log level says so in a line the new level lets through: "SIGHUP: log level info -> warn"
// was logged at info once warn applied, so a raise was never written (a chaos soak). Raised, it is logged at the new
// level; lowered, at info.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Console, Effect } from "effect"
import { afterEach, beforeEach, describe, expect, it } from "vitest"
import * as Logging from "../../src/layers/observability/Logging.ts"

let dir: string
let savedEnv: string | undefined
beforeEach(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-sighup-level-"))
  savedEnv = process.env.CGN_LOG_LEVEL
  delete process.env.CGN_LOG_LEVEL
})
afterEach(() => {
  fs.rmSync(dir, { recursive: true, force: true })
  if (savedEnv !== undefined) process.env.CGN_LOG_LEVEL = savedEnv
})

/** The lines the agent's logger (started at `from`) writes for a SIGHUP that finds `to` in the config file. */
const hangup = async (
  from: "info" | "warn",
  to: "info" | "warn" | "error"
): Promise<Array<Record<string, unknown>>> => {
  const file = path.join(dir, "agent.toml")
  fs.writeFileSync(
    file,
    `[agent]\nlog_level = "${to}"\n[engine]\nkind = "llama_cpp"\nurl = "http://127.0.0.1:8080"\n[models.m]\npath = "/m.gguf"\n`
  )
  const written: Array<Record<string, unknown>> = []
  const console: Console.Console = Object.assign(Object.create(globalThis.console), {
    error: (line: string) => written.push(JSON.parse(line) as Record<string, unknown>)
  })
  await Effect.runPromise(
    Logging.hangupReload(file).pipe(
      Effect.provide(Logging.layer(from)),
      Effect.provideService(Console.Console, console)
    )
  )
  return written
}

describe("SIGHUP's log level line", () => {
  it("is written when the level is raised (info -> warn, info -> error), at the new level", async () => {
    expect(await hangup("info", "warn")).toEqual([
      expect.objectContaining({ level: "warn", msg: "SIGHUP: log level info -> warn" })
    ])
    expect(await hangup("info", "error")).toEqual([
      expect.objectContaining({ level: "error", msg: "SIGHUP: log level info -> error" })
    ])
  })

  it("is written at info when the level is lowered (warn -> info)", async () => {
    expect(await hangup("warn", "info")).toEqual([
      expect.objectContaining({ level: "info", msg: "SIGHUP: log level warn -> info" })
    ])
  })
})
