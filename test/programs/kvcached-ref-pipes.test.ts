// cgn-kvcached-ref (src/programs/kvcachedReceiver.ts) whose output pipes' readers are gone (a log collector
// stopped): Node ignores SIGPIPE, so its write to such a pipe fails with EPIPE, raised a tick later as an 'error'
// on process.stderr / process.stdout. Its one line, `{"msg":"listening"}` on stderr, written that way ended the
// receiver at start (uncaught EPIPE, exit 1) before it served anything. It must serve on.
import { type ChildProcess, spawn } from "node:child_process"
import * as fs from "node:fs"
import * as net from "node:net"
import * as os from "node:os"
import * as path from "node:path"
import { afterEach, describe, expect, it } from "vitest"
import { KV_WIRE_VERSION } from "../../src/services/kv/KvcachedRpc.ts"
import { receiverEntry } from "../support/kvcached.ts"
import { pollUntil } from "../support/poll.ts"

const cleanups: Array<() => unknown> = []
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c()
})

/** One Hello over the contract's NDJSON socket protocol: the receiver's answer line, or why there is none. */
const hello = (uds: string, id: string): Promise<unknown> =>
  new Promise((resolve, reject) => {
    const socket = net.connect(uds)
    let text = ""
    socket.on("error", reject)
    socket.on("data", (d: Buffer) => {
      text += d.toString()
      const line = text.split("\n")[0]
      if (text.includes("\n") && line !== undefined) {
        socket.destroy()
        resolve(JSON.parse(line))
      }
    })
    socket.on("close", () => reject(new Error(`connection closed before an answer: ${JSON.stringify(text)}`)))
    const payload = { version: KV_WIRE_VERSION, node_id: "n1", cluster: "c1", model: "m", engine: "vllm" }
    const request = {
      _tag: "Request",
      id,
      tag: "Hello",
      payload: { ...payload, block_size: 16, dp_size: 1, epoch: "e1" },
      headers: []
    }
    socket.on("connect", () => socket.write(`${JSON.stringify(request)}\n`))
  })

describe("cgn-kvcached-ref with its output pipes closed by their readers", () => {
  it("serves on: its log line to a closed stderr is dropped, not an uncaught EPIPE that ended it at start", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kvref-"))
    cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }))
    const uds = path.join(dir, "r.sock")
    const proc: ChildProcess = spawn(process.execPath, [receiverEntry, "--uds", uds], {
      stdio: ["ignore", "pipe", "pipe"]
    })
    const exited = new Promise<string>((resolve) =>
      proc.once("exit", (code, signal) => resolve(`exited (${signal ?? `code ${code}`})`))
    )
    cleanups.push(async () => {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGKILL")
      await exited
    })
    // The readers gone before the receiver writes anything: every write to either pipe now fails with EPIPE.
    proc.stdout?.destroy()
    proc.stderr?.destroy()
    const died = exited.then((how) => {
      throw new Error(`the receiver ${how}`)
    })
    const answered = pollUntil("a Hello answered", () => hello(uds, "1"), 60_000, 20)
    expect(await Promise.race([answered, died])).toEqual({
      _tag: "Exit",
      requestId: "1",
      exit: { _tag: "Success", value: { applied: null } }
    })
    // Still serving well after its log line was written (the EPIPE comes a tick after the write).
    expect(await Promise.race([hello(uds, "2"), died])).toMatchObject({ requestId: "2", exit: { _tag: "Success" } })
    expect(proc.exitCode).toBe(null)
    died.catch(() => {})
    proc.kill("SIGTERM")
    await exited
  }, 90_000)
})
