// The bounded polls the tests use (settle: the same inside an Effect test) to wait for a condition they cannot await as an event (a process
// gone, a key written, a counter reached). Failing fast on a deadline, with what was awaited and the
// last error in the message, beats a sleep: a slow CI machine only makes the poll take longer.

import { Effect } from "effect"

/**
 * Calls `check` every `intervalMs` until it gives a value other than undefined or false, and resolves
 * with it; a throw from `check` counts as "not yet". Rejects after `timeoutMs`.
 */
export const pollUntil = async <A>(
  what: string,
  check: () => Promise<A | undefined | false> | A | undefined | false,
  timeoutMs = 10_000,
  intervalMs = 25
): Promise<A> => {
  const deadline = Date.now() + timeoutMs
  let lastError: unknown
  for (;;) {
    try {
      const v = await check()
      if (v !== undefined && v !== false) return v
    } catch (e) {
      lastError = e
    }
    if (Date.now() > deadline) break
    await new Promise((r) => setTimeout(r, intervalMs))
  }
  throw new Error(`timed out after ${timeoutMs}ms waiting for ${what}${lastError ? `: ${String(lastError)}` : ""}`)
}

/**
 * Inside an Effect test: lets every fiber (and real fs/socket I/O, one event-loop turn per step) run until `done`
 * holds; a bounded poll, never a sleep. Dies with `what` past the bound: 10 s of real time (the tests' Clock may be a
 * TestClock, which does not move by itself), counted from the wall clock rather than in turns, since real I/O on a
 * loaded machine (the libuv threadpool's fs calls) can take more turns than a fixed count allows (a CI run failed
 * "did not settle" so after 5,000 turns in well under a second).
 */
export const settle = (what: string, done: Effect.Effect<boolean>, timeoutMs = 10_000) =>
  Effect.gen(function* () {
    const deadline = performance.now() + timeoutMs
    while (performance.now() < deadline) {
      if (yield* done) return
      yield* Effect.promise(() => new Promise((resolve) => setImmediate(resolve)))
    }
    if (yield* done) return
    return yield* Effect.die(new Error(`did not settle within ${timeoutMs} ms: ${what}`))
  })
