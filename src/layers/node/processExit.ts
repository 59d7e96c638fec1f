/**
 * The process's exit: after what was written to stdout and stderr is taken, within a bound, and past a worker
 * thread stuck inside a native call.
 *
 * Written output first. Node writes pipes without blocking (uv_pipe_open makes them non-blocking; Node's "A note on
 * process I/O": pipes are asynchronous on POSIX): lines a slow log collector has not taken yet wait in the
 * process's memory, and an exit drops them, the last ones of a shutdown (`cgn-agent stopped`) included. So the exit
 * waits until stdout and stderr have none pending, for FLUSH_WAIT_MS at most (a collector that never reads must not
 * hold the exit: the shutdown's bound counts this wait, programs/shutdownBound.ts).
 *
 * Then the worker threads. `process.exit()` joins every worker thread before the process ends, and
 * `worker.terminate()` cannot stop one inside a native call (V8 interrupts JavaScript only): a worker stuck in an
 * NVML call (a GPU off the bus) held the agent's exit for as long as the call lasted, after a drain that had
 * otherwise finished (measured: a worker in a 5 s native sleep held `process.exit()` 5.1 s). libc's `_exit(2)` ends
 * the process without joining its threads; the kernel's exit_group kills them, wherever they are but in an
 * uninterruptible kernel wait (D state), which nothing in user space can end, SIGKILL included. So a worker told to
 * end (`endWorker`) that has not ended yet makes the exit take the `_exit` path; an exit with no such worker is
 * Node's own.
 */
import type { Worker } from "node:worker_threads"

type Koffi = typeof import("koffi")["default"]

/** The longest the exit waits for stdout's and stderr's readers to take what was written. */
export const FLUSH_WAIT_MS = 1_000
const FLUSH_POLL_MS = 10

/** Workers told to end that have not ended: each would hold `process.exit()` until its native call returns. */
const ending = new Set<Worker>()

/** libc's `_exit`, once bound (`bindHardExit`). */
let hardExit: ((code: number) => void) | undefined

/**
 * Binds libc's `_exit` through `koffi`, ahead of need: the exit itself is synchronous, and the only moment koffi
 * can be had synchronously is where it is already loaded. The NVML layer calls this before it starts a worker.
 */
export const bindHardExit = (koffi: Koffi): void => {
  if (hardExit !== undefined) return
  try {
    // null: the symbols already in the process (libc's, linked into node), whatever libc the image has
    hardExit = koffi.load(null).func("void _exit(int)") as (code: number) => void
  } catch {
    // without it the exit waits for a stuck worker, as Node's does
  }
}

/**
 * Ends `worker` (as `worker.terminate()`), counting it as holding the exit until its 'exit' event. A worker that
 * has ended already (threadId -1 after its 'exit') holds nothing and is left alone.
 */
export const endWorker = (worker: Worker): void => {
  if (worker.threadId === -1) return
  if (!ending.has(worker)) {
    ending.add(worker)
    worker.once("exit", () => ending.delete(worker))
  }
  void worker.terminate()
}

/** How many workers told to end have not ended yet. */
export const workersHoldingExit = (): number => ending.size

/** Exits with `code` now: through `_exit` while a worker told to end is still held in a native call. */
export const exitProcess = (code: number): never => {
  if (ending.size > 0 && hardExit !== undefined) {
    const end = hardExit
    // what process.exit does before it ends the process (an 'exit' listener may change the code, or throw), which
    // `_exit` then does without joining the workers
    process.exitCode = code
    try {
      process.emit("exit", code)
    } finally {
      end(typeof process.exitCode === "number" ? process.exitCode : code)
    }
  }
  return process.exit(code)
}

const pendingOutput = (): number => process.stdout.writableLength + process.stderr.writableLength

/** Exits with `code` once stdout and stderr have nothing pending, or FLUSH_WAIT_MS on (exitProcess). */
export const exitWhenFlushed = (code: number): void => {
  process.exitCode = code
  if (pendingOutput() === 0) return void exitProcess(code)
  // performance.now: a wall clock stepped back must not stretch the wait
  const deadline = performance.now() + FLUSH_WAIT_MS
  // a poll: 'drain' comes only after a write that returned false, and a short backlog never makes one
  const timer = setInterval(() => {
    if (pendingOutput() > 0 && performance.now() < deadline) return
    clearInterval(timer)
    exitProcess(code)
  }, FLUSH_POLL_MS)
}
