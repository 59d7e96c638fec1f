/**
 * runMain: runs a CLI program as the process's main fiber, with signals routed to the daemon's drain.
 * NodeRuntime.runMain interrupts the fiber on the first SIGTERM, which would skip the ordered drain
 * and exit 130; a daemon instead registers a ShutdownSignals handler and exits 0 after draining.
 * Programs that register none (check, render, generate) are interrupted as usual.
 * SIGHUP never ends the process (Node's default would kill it at once: no drain, no lease revoke): a daemon
 * routes it to a reload (`reloadOnHangup`), and without one (other programs, a daemon still starting) it is
 * ignored.
 */
import { Deferred, Effect, Queue, Runtime, type Scope } from "effect"
import { exitWhenFlushed } from "../layers/node/processExit.ts"
import { background, RESTART } from "../layers/observability/backgroundFiber.ts"

type Handler = (count: number, signal: NodeJS.Signals) => void
let handler: Handler | undefined
let hangup: (() => void) | undefined
// Set once a daemon's handler is released: its shutdown is under way (the core's teardown after the servers'), and a
// signal then changes nothing. Read as a start to interrupt, it ended a finished drain with exit 130 and a line
// saying the start was undone (a code review).
let stopping = false

/** The two signal moments a daemon waits for: the first signal (drain) and the second (skip the wait). */
export interface ShutdownSignals {
  readonly requested: Deferred.Deferred<string>
  readonly hurry: Deferred.Deferred<void>
}

/**
 * Routes SIGTERM/SIGINT to the returned deferreds for the scope's lifetime: the first completes
 * `requested` with the signal's name, the second completes `hurry`.
 */
export const shutdownSignals: Effect.Effect<ShutdownSignals, never, Scope.Scope> = Effect.gen(function* () {
  const requested = yield* Deferred.make<string>()
  const hurry = yield* Deferred.make<void>()
  yield* Effect.acquireRelease(
    Effect.sync(() => {
      handler = (count, signal) => {
        if (count === 1) Deferred.doneUnsafe(requested, Effect.succeed(signal))
        else Deferred.doneUnsafe(hurry, Effect.void)
      }
    }),
    () =>
      Effect.sync(() => {
        handler = undefined
        stopping = true
      })
  )
  return { requested, hurry }
})

/**
 * Runs `reload` on every SIGHUP for the scope's lifetime, one reload at a time: SIGHUPs that arrive during a
 * reload fold into one more. A failing reload must report and recover by itself (its error type is never).
 */
export const reloadOnHangup = <R>(reload: Effect.Effect<void, never, R>): Effect.Effect<void, never, Scope.Scope | R> =>
  Effect.gen(function* () {
    const pending = yield* Queue.sliding<void>(1)
    yield* Effect.acquireRelease(
      Effect.sync(() => {
        hangup = () => Queue.offerUnsafe(pending, undefined)
      }),
      () =>
        Effect.sync(() => {
          hangup = undefined
        })
    )
    // A reload's defect would end SIGHUP's handling for the process: said, and the next SIGHUP is taken again.
    yield* Effect.forever(Effect.andThen(Queue.take(pending), reload)).pipe(
      background("the SIGHUP reload", "SIGHUP no longer reloads anything", { restart: RESTART }),
      Effect.forkScoped
    )
  })

/** Runs `effect` as the main program; exit code 0 on success, 1 on failure, 130 when interrupted. */
export const runMain = Runtime.makeRunMain(({ fiber, teardown }) => {
  let signals = 0
  const onSignal = (signal: NodeJS.Signals) => {
    signals++
    if (handler !== undefined) handler(signals, signal)
    // before a daemon serves (its config, preflight, its start): interrupted, exit 130; `run` says so as its last
    // line, from wherever in its start (fatal.ts saidIfStoppedWhileStarting)
    else if (!stopping) fiber.interruptUnsafe(fiber.id)
  }
  const onHangup = () => hangup?.()
  fiber.addObserver((exit) => {
    // Until the process ends (the teardown, then the output's flush: at most FLUSH_WAIT_MS) signals keep a handler,
    // else Node's default would end the process by the signal (a SIGHUP too), its last lines lost; a signal then
    // changes nothing, as the exit is under way. Added before the daemon's are removed: a signal's last listener
    // removed puts back its default action at once (nodejs/node lib/internal/process/signal.js
    // stopListeningIfSignal), and a SIGTERM landing before the next listener was added ended a finished drain by the
    // signal (seen once in a loaded run of test/programs/signal-while-starting.test.ts's burst).
    const ignore = () => undefined
    for (const signal of ["SIGHUP", "SIGTERM", "SIGINT"] as const) process.on(signal, ignore)
    process.removeListener("SIGINT", onSignal)
    process.removeListener("SIGTERM", onSignal)
    process.removeListener("SIGHUP", onHangup)
    // not process.exit: the last log lines still in a pipe would be lost, and an NVML worker stuck in a native call
    // would hold the exit (layers/node/processExit.ts)
    teardown(exit, exitWhenFlushed)
  })
  process.on("SIGINT", onSignal)
  process.on("SIGTERM", onSignal)
  process.on("SIGHUP", onHangup)
})
