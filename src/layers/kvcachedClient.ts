/**
 * The Unix-socket client towards cgn-kvcached: connect, send Hello, then drain the LineQueue in chunks,
 * one write in flight at a time (a slow reader makes the queue, not the agent, absorb the backlog).
 * On any failure: reconnect with capped, jittered backoff, resend the chunk that was in flight (kvcached
 * skips seqs it already applied), log each connected/disconnected change once. Never fails.
 */
import * as net from "node:net"
import { Effect } from "effect"
import { jitteredBackoffMs } from "../services/Backoff.ts"
import type { Resync } from "../services/KvWire.ts"
import type { LineQueue, QueuedLine } from "./kvQueue.ts"

export interface WriterOptions {
  readonly path: string
  readonly queue: LineQueue
  readonly hello: () => string
  readonly resync: (r: Resync) => string
  readonly backoffMaxMs: number
  readonly onConnected: (connected: boolean, error: string | undefined) => void
  readonly onForwarded: (batches: number) => void
}

const CHUNK = 512

const connect = (path: string) =>
  Effect.callback<net.Socket, Error>((resume) => {
    const sock = net.createConnection(path)
    const onError = (err: Error) => {
      sock.destroy()
      resume(Effect.fail(err))
    }
    sock.once("error", onError)
    sock.once("connect", () => {
      sock.off("error", onError)
      resume(Effect.succeed(sock))
    })
    return Effect.sync(() => sock.destroy())
  })

/** Resolves when the data is handed to the kernel; fails when the socket breaks first. */
const write = (sock: net.Socket, data: string) =>
  Effect.callback<void, Error>((resume) => {
    let done = false
    const finish = (err: Error | null | undefined) => {
      if (done) return
      done = true
      sock.off("close", onClose)
      sock.off("error", finish)
      resume(err ? Effect.fail(err) : Effect.void)
    }
    const onClose = () => finish(new Error("kvcached closed the connection"))
    sock.once("close", onClose)
    sock.once("error", finish)
    sock.write(data, finish)
  })

/** Waits for a queue push, or fails when the socket closes meanwhile (so a dead peer is noticed early). */
const awaitWork = (sock: net.Socket, queue: LineQueue) =>
  Effect.callback<void, Error>((resume) => {
    const onClose = () => {
      queue.cancelWake()
      resume(Effect.fail(new Error("kvcached closed the connection")))
    }
    sock.once("close", onClose)
    queue.onPush(() => {
      sock.off("close", onClose)
      resume(Effect.void)
    })
    return Effect.sync(() => {
      sock.off("close", onClose)
      queue.cancelWake()
    })
  })

const countBatches = (lines: ReadonlyArray<QueuedLine>) => lines.reduce((n, l) => n + (l.batch ? 1 : 0), 0)

/** Runs until interrupted. */
export const runWriter = (o: WriterOptions): Effect.Effect<never> =>
  Effect.gen(function* () {
    let failures = 0
    let connected: boolean | undefined
    let inflight: Array<QueuedLine> = []
    const setState = (up: boolean, error: string | undefined) =>
      Effect.gen(function* () {
        o.onConnected(up, error)
        if (connected === up) return
        connected = up
        if (up) yield* Effect.logInfo("kvcached connected", { uds: o.path })
        else yield* Effect.logWarning("kvcached unavailable; queueing KV events", { uds: o.path, error })
      })
    for (;;) {
      const session = Effect.acquireUseRelease(
        connect(o.path),
        (sock) =>
          Effect.gen(function* () {
            sock.on("error", () => {}) // surfaced through write/close; keep it from being unhandled
            sock.resume() // kvcached does not talk back; discard anything it sends
            yield* write(sock, o.hello())
            yield* setState(true, undefined)
            failures = 0
            for (;;) {
              if (inflight.length === 0) {
                if (o.queue.size === 0) yield* awaitWork(sock, o.queue)
                inflight = o.queue.take(CHUNK, o.resync)
                if (inflight.length === 0) continue
              }
              yield* write(sock, inflight.map((l) => l.line).join(""))
              o.onForwarded(countBatches(inflight))
              inflight = []
            }
          }),
        (sock) => Effect.sync(() => sock.destroy())
      )
      const err = yield* Effect.flip(session)
      failures++
      yield* setState(false, err.message)
      yield* Effect.sleep(jitteredBackoffMs(failures, o.backoffMaxMs, Math.random()))
    }
  })
