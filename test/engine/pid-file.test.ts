// The engine pid file's write (layers/engine/pidFile.ts): a write that fails is logged with the system's reason
// (EROFS, ENOSPC, ENOTDIR), never only "An error occurred in Effect.tryPromise" (a chaos soak's finding).
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Effect, Logger } from "effect"
import { afterEach, describe, expect, it } from "vitest"
import { pidFilePath, writePidFile } from "../../src/layers/engine/pidFile.ts"

let dir: string | undefined
afterEach(() => {
  if (dir !== undefined) fs.rmSync(dir, { recursive: true, force: true })
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
