/**
 * One NVML worker thread (programs/nvmlWorker.ts) as the main thread sees it: requests with one reply each, and
 * the thread's end. The Nvml layer (Nvml.ts) sends a request only once the previous one has answered, and keeps
 * every policy (deadlines, backoff, logging).
 */
import { Worker } from "node:worker_threads"
import { Duration, Effect, Option } from "effect"
import type { NvmlReply, NvmlRequest } from "./nvmlSession.ts"
import { endWorker } from "./processExit.ts"

/** A reply, or the thread gone before it answered (an exception in it, or terminated). */
export type ThreadReply = NvmlReply | { readonly op: "exited"; readonly why: string }

export interface NvmlThread {
  /** Sends `request` and waits for its reply; an interrupted wait leaves the request running in the thread. */
  readonly call: (request: NvmlRequest) => Effect.Effect<ThreadReply>
  /**
   * Ends the thread now, without waiting. An NVML call it is inside still runs to its end, and until then the
   * process exits through processExit.ts, which does not wait for it.
   */
  readonly terminate: Effect.Effect<void>
  /** Asks the thread to shut NVML down and end, waits up to `wait` for that, then terminates it. */
  readonly release: (wait: Duration.Duration) => Effect.Effect<void>
}

/** Starts the worker thread at `program`; `onWorker` sees it (tests count and watch the threads). */
export const spawnThread = (program: string, onWorker?: (worker: Worker) => void): Effect.Effect<NvmlThread, Error> =>
  Effect.try({
    try: () => new Worker(program),
    catch: (e) => (e instanceof Error ? e : new Error(String(e)))
  }).pipe(
    Effect.map((worker) => {
      // The thread never keeps the process alive by itself: every wait on it is bounded by a timer of its caller.
      worker.unref()
      onWorker?.(worker)
      let waiting: ((reply: ThreadReply) => void) | undefined
      let error: string | undefined
      let exited: string | undefined
      const settle = (reply: ThreadReply) => {
        const resume = waiting
        waiting = undefined
        resume?.(reply)
      }
      worker.on("message", (reply: NvmlReply) => settle(reply))
      // An "error" event nobody listens to is thrown in the main thread: an exception in the worker must only end
      // the worker, whose exit then settles the request in flight.
      worker.on("error", (e) => {
        error = e.message
      })
      worker.on("exit", (code) => {
        exited = error ?? `exit code ${code}`
        settle({ op: "exited", why: exited })
      })
      const ended = Effect.callback<void>((resume) => {
        if (exited !== undefined) return resume(Effect.void)
        const onExit = () => resume(Effect.void)
        worker.once("exit", onExit)
        return Effect.sync(() => void worker.off("exit", onExit))
      })
      // a worker that has exited holds nothing: it is not ended again (down() after the worker's own end)
      const terminate = Effect.sync(() => exited === undefined && endWorker(worker))
      return {
        call: (request) =>
          Effect.callback<ThreadReply>((resume) => {
            if (exited !== undefined) return resume(Effect.succeed({ op: "exited", why: exited }))
            waiting = (reply) => resume(Effect.succeed(reply))
            worker.postMessage(request)
            return Effect.sync(() => {
              waiting = undefined
            })
          }),
        terminate,
        release: (wait) =>
          Effect.gen(function* () {
            if (exited !== undefined) return
            worker.postMessage({ op: "close" } satisfies NvmlRequest)
            const closed = yield* Effect.timeoutOption(ended, wait)
            // terminate() cannot stop a thread inside a native call: V8 interrupts JavaScript only, so a thread stuck
            // in NVML ends only when that call returns (measured with the fake library's FAKE_NVML_BLOCK_FILE; a
            // koffi call on libuv's threadpool would hold the same way). process.exit() would wait for it, so the
            // program exits through processExit.ts, which does not. The Nvml layer is released after the drain and
            // the lease revoke (programs/main.ts builds those inside the daemon's scope), so nothing waits on this
            // before then.
            if (Option.isNone(closed)) {
              yield* Effect.logWarning("NVML worker still inside a call; the agent exits without waiting for it", {
                waited: Duration.format(wait)
              })
            }
            yield* terminate
          })
      }
    })
  )
