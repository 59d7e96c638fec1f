// The reference receiver's Unix socket (src/layers/kv/ownedSocketPath.ts, receiverSocketServer.ts). A receiver that
// stops removes its socket path only while the path is still its own: libuv removes it by name, so a receiver whose
// path was deleted and taken by a newer one deleted the newer one's socket, and every agent was cut off (ENOENT).
// A peer that drops its connection (the agent giving up on a paused receiver) is routine: no error-level stack trace
// "Unhandled error in SocketServer" per connection.
import { type ChildProcess, spawn } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Cause, Effect, Exit, Layer, Scope } from "effect"
import { Socket } from "effect/socket"
import { afterEach, describe, expect, it } from "vitest"
import * as ReceiverLive from "../../src/layers/kv/kvcachedReceiver.ts"
import * as OwnedSocketPath from "../../src/layers/kv/ownedSocketPath.ts"
import { peerDropped } from "../../src/layers/kv/receiverSocketServer.ts"
import { answerHello, connectUds, helloLine, receiverEntry } from "../support/kvcached.ts"
import { followLines } from "../support/lines.ts"

const cleanups: Array<() => unknown> = []
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c()
})

const tmpDir = () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kvsock-"))
  cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }))
  return dir
}

const answered = (id: number) => ({ _tag: "Exit", requestId: id, exit: { _tag: "Success", value: { applied: null } } })

/** The reference receiver in this process, on `uds`, until the returned stop. */
const receiver = async (uds: string) => {
  const scope = await Effect.runPromise(Scope.make())
  const stop = () => Effect.runPromise(Scope.close(scope, Exit.void))
  cleanups.push(stop)
  await Effect.runPromise(Layer.buildWithScope(ReceiverLive.layer({ path: uds }), scope))
  return stop
}

const isSocket = (p: string) => fs.lstatSync(p, { throwIfNoEntry: false })?.isSocket() === true

describe("the reference receiver's socket path", () => {
  it("is left to a newer receiver that took it after it was deleted", async () => {
    const uds = path.join(tmpDir(), "k.sock")
    const stopA = await receiver(uds)
    fs.rmSync(uds) // an operator or a tmp cleaner
    const stopB = await receiver(uds)
    expect(await answerHello(uds, 1, cleanups)).toEqual(answered(1))

    await stopA()
    expect(isSocket(uds)).toBe(true)
    expect(await answerHello(uds, 2, cleanups)).toEqual(answered(2))

    await stopB()
    expect(fs.existsSync(uds)).toBe(false)
  })

  it("is removed when its receiver stops, and nothing else is left in its directory", async () => {
    const dir = tmpDir()
    const uds = path.join(dir, "k.sock")
    const stop = await receiver(uds)
    expect(fs.readdirSync(dir)).toEqual(["k.sock"])
    expect(await answerHello(uds, 1, cleanups)).toEqual(answered(1))
    await stop()
    expect(fs.readdirSync(dir)).toEqual([])
  })

  it("is not taken over where something already is (a receiver that got there first keeps it)", async () => {
    const dir = tmpDir()
    const uds = path.join(dir, "k.sock")
    fs.writeFileSync(uds, "someone's")
    const exit = await Effect.runPromiseExit(Effect.scoped(OwnedSocketPath.make(uds)))
    const error = Exit.isFailure(exit) ? Cause.squash(exit.cause) : undefined
    expect(error).toMatchObject({ reason: { _tag: "SocketServerOpenError", cause: { code: "EEXIST" } } })
    expect(fs.readdirSync(dir)).toEqual(["k.sock"])
    expect(fs.readFileSync(uds, "utf8")).toBe("someone's")
  })
})

const readError = (code: string) =>
  new Socket.SocketError({
    reason: new Socket.SocketReadError({ cause: Object.assign(new Error(`read ${code}`), { code }) })
  })
const writeError = (code: string) =>
  new Socket.SocketError({
    reason: new Socket.SocketWriteError({ cause: Object.assign(new Error(`write ${code}`), { code }) })
  })

describe("a connection's end in the reference receiver", () => {
  it("is a dropped peer only when every failure is a read or write its peer cut", () => {
    expect(peerDropped(Cause.die(readError("ECONNRESET")))).toBe("ECONNRESET")
    expect(peerDropped(Cause.fail(writeError("EPIPE")))).toBe("EPIPE")
    expect(peerDropped(Cause.combine(Cause.die(readError("ECONNRESET")), Cause.interrupt()))).toBe("ECONNRESET")
    // the server's own errors are still reported
    expect(peerDropped(Cause.die(new Error("boom")))).toBeUndefined()
    expect(peerDropped(Cause.die(readError("EACCES")))).toBeUndefined()
    expect(peerDropped(Cause.combine(Cause.die(readError("ECONNRESET")), Cause.die(new Error("boom"))))).toBeUndefined()
    expect(peerDropped(Cause.interrupt())).toBeUndefined()
  })

  it("logs no stack trace when peers dropped their connections while the receiver was stopped", async () => {
    const uds = path.join(tmpDir(), "r.sock")
    const proc: ChildProcess = spawn(process.execPath, [receiverEntry, "--uds", uds], {
      stdio: ["ignore", "pipe", "pipe"]
    })
    // 'close': it exited and its stdout and stderr are read to the end
    const exited = new Promise<number | null>((resolve) => proc.once("close", (code) => resolve(code)))
    cleanups.push(async () => {
      if (proc.exitCode === null && proc.signalCode === null) {
        proc.kill("SIGCONT")
        proc.kill("SIGKILL")
      }
      await exited
    })
    const out = followLines(proc.stdout)
    const err = followLines(proc.stderr)
    await err.waitFor((l) => l.includes('"msg":"listening"'), 60_000, "the receiver listening")

    // What the agent does on its ping timeout to a paused receiver: a Hello and a Ping, then it closes (3 times).
    proc.kill("SIGSTOP")
    for (let i = 0; i < 3; i++) {
      const gone = await connectUds(uds)
      gone.on("error", () => {})
      await new Promise<void>((resolve, reject) =>
        gone.write(`${helloLine(i)}{"_tag":"Ping"}\n`, (e) => (e ? reject(e) : resolve()))
      )
      const closed = new Promise((resolve) => gone.once("close", resolve))
      gone.destroy()
      await closed
    }
    proc.kill("SIGCONT")
    // Resumed, it reads those connections (their events come first) and answers into them, then this one.
    expect(await answerHello(uds, 9, cleanups)).toEqual(answered(9))
    proc.kill("SIGTERM")
    expect(await exited).toBe(130)

    const logged = [...out.lines, ...err.lines].join("\n")
    expect(logged).not.toMatch(/Unhandled|SocketError|ERROR/)
  }, 120_000)
})
