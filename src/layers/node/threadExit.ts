/**
 * The process's exit past a worker thread stuck inside a native call. `process.exit()` joins every worker thread
 * before the process ends, and `worker.terminate()` cannot stop one inside a native call (V8 interrupts JavaScript
 * only): a worker stuck in an NVML call (a GPU off the bus) held the agent's exit for as long as the call lasted,
 * after a drain that had otherwise finished (measured: a worker in a 5 s native sleep held `process.exit()` 5.1 s).
 * libc's `_exit(2)` ends the process without joining its threads; the kernel's exit_group kills them, wherever
 * they are but in an uninterruptible kernel wait (D state), which nothing in user space can end, SIGKILL included.
 *
 * So a worker that was told to end (`endWorker`) and has not ended yet holds the exit, and `exitProcess` takes the
 * `_exit` path only then: an exit with no such worker is Node's own (its 'exit' event, its flushes).
 */
import type { Worker } from "node:worker_threads"

/** Workers told to end that have not ended: each would hold `process.exit()` until its native call returns. */
const ending = new Set<Worker>()

/**
 * libc's `_exit`, bound through koffi once a worker is told to end (the NVML layer has loaded koffi by then, so the
 * import settles within the turn): loaded ahead, because the exit itself must be synchronous.
 */
let hardExit: ((code: number) => void) | undefined
let loading = false
const prepareHardExit = () => {
  if (loading) return
  loading = true
  void import("koffi").then(
    (koffi) => {
      // null: the symbols already in the process (libc's, linked into node), whatever libc the image has
      hardExit = koffi.default.load(null).func("void _exit(int)") as (code: number) => void
    },
    () => undefined // without koffi the exit waits for the worker, as before
  )
}

/** Ends `worker` (as `worker.terminate()`), counting it as holding the exit until its 'exit' event. */
export const endWorker = (worker: Worker): void => {
  prepareHardExit()
  if (!ending.has(worker)) {
    ending.add(worker)
    worker.once("exit", () => ending.delete(worker))
  }
  void worker.terminate()
}

/** How many workers told to end have not ended yet. */
export const workersHoldingExit = (): number => ending.size

/**
 * Exits with `code`. With a worker still held in a native call, Node's exit would wait for it: `process.exit`'s
 * 'exit' event is emitted as Node would, and then libc's `_exit` ends the process. stdout and stderr writes are
 * synchronous on Linux for files, pipes and TTYs (Node's "A note on process I/O"), so every log line already
 * written is out.
 */
export const exitProcess = (code: number): never => {
  if (ending.size > 0 && hardExit !== undefined) {
    process.exitCode = code
    process.emit("exit", code)
    hardExit(code)
  }
  return process.exit(code)
}
