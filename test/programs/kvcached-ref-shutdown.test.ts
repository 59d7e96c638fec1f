// cgn-kvcached-ref (src/programs/kvcachedReceiver.ts) paused (SIGSTOP) while a peer opened a connection, sent a
// Hello and a Ping, and closed it (the agent does so on its ping timeout, then reconnects). Resumed, the receiver
// reads both and answers into a socket whose peer is gone: EPIPE. Upstream's writer then waited forever on that
// destroyed socket in the RpcServer's uninterruptible answer write, and the server's shutdown waited on it: SIGTERM
// (and every signal after it) left the receiver alive, only SIGKILL ended it (src/layers/kv/receiverSocketServer.ts).
import { type ChildProcess, spawn } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterEach, describe, expect, it } from "vitest"
import { answerHello, connectUds, helloLine, receiverEntry } from "../support/kvcached.ts"
import { followLines } from "../support/lines.ts"

const cleanups: Array<() => unknown> = []
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c()
})

describe("cgn-kvcached-ref answering a connection its peer closed while the receiver was stopped", () => {
  it("keeps serving, and SIGTERM still ends it", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kvref-"))
    cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }))
    const uds = path.join(dir, "r.sock")
    const proc: ChildProcess = spawn(process.execPath, [receiverEntry, "--uds", uds], {
      stdio: ["ignore", "pipe", "pipe"]
    })
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
      proc.once("exit", (code, signal) => resolve({ code, signal }))
    )
    cleanups.push(async () => {
      if (proc.exitCode === null && proc.signalCode === null) {
        proc.kill("SIGCONT")
        proc.kill("SIGKILL")
      }
      await exited
    })
    const errors = followLines(proc.stdout)
    await followLines(proc.stderr).waitFor((l) => l.includes('"msg":"listening"'), 60_000, "the receiver listening")

    proc.kill("SIGSTOP")
    const gone = await connectUds(uds)
    gone.on("error", () => {})
    // both in the receiver's socket buffer before the peer closes (the write callback: handed to the kernel)
    await new Promise<void>((resolve, reject) =>
      gone.write(`${helloLine(1)}{"_tag":"Ping"}\n`, (e) => (e ? reject(e) : resolve()))
    )
    const closed = new Promise((resolve) => gone.once("close", resolve))
    gone.destroy()
    await closed
    proc.kill("SIGCONT")

    // Resumed, it reads the Hello and the Ping and answers both into the closed connection: the read then fails, a
    // routine dropped peer (no error log); it still serves the next connection.
    expect(await answerHello(uds, 2, cleanups)).toEqual({
      _tag: "Exit",
      requestId: 2,
      exit: { _tag: "Success", value: { applied: null } }
    })

    proc.kill("SIGTERM")
    let deadline: NodeJS.Timeout | undefined
    const how = await Promise.race([
      exited,
      new Promise<"alive">((resolve) => {
        deadline = setTimeout(() => resolve("alive"), 20_000)
      })
    ])
    clearTimeout(deadline)
    // It ended by itself, through its runtime's interrupt (NodeRuntime.runMain: code 130), not killed by the signal.
    expect(how).toEqual({ code: 130, signal: null })
    expect(errors.lines.filter((l) => /Unhandled|SocketError/.test(l))).toEqual([])
  }, 120_000)
})
