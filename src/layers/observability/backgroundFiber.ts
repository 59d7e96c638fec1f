/**
 * The agent's long-lived background fibers (a watcher, a reporter, a reader, a timer), forked into a scope and joined
 * by no one: a defect (a throw in an Effect.sync, a bug, a synchronous EMFILE from an fs or socket call) or a failure
 * the loop leaves unhandled ends such a fiber with nothing said, and the feature it runs stops for good while the
 * agent looks healthy (the engine supervisor's loop ended so on a spawn without stdio, the engine "spawning" for
 * ever: layers/engine/EngineProcess.ts). `background` says it: one error line naming what stopped, what no longer
 * happens and that it is the agent's defect, with the cause; and, given `restart`, runs the loop again after a
 * capped, jittered backoff (services/retry/Backoff.ts; from the base again after a run that lasted the cap), the
 * same defect in a row said again only at its 2nd, 4th, 8th... time, so one that comes back every run does not
 * flood the log. Interruption is how a scope ends its fibers: never said, never restarted.
 */
import { Cause, Clock, Effect, Random } from "effect"
import { jitteredBackoffMs } from "../../services/retry/Backoff.ts"

export interface Restart {
  /** The first retry's delay (ms); doubling per death in a row. */
  readonly baseMs: number
  /** The longest delay (ms); a run that lasted this long starts the backoff over. */
  readonly capMs: number
}

/** The default restart: 1 s doubling to 1 minute, the agent's usual reconnect pace. */
export const RESTART: Restart = { baseMs: 1_000, capMs: 60_000 }

/**
 * The error line for `name`'s end by `cause` (not an interruption only); `retryInMs`: restarted after that, the
 * `deaths`-th time in a row.
 */
export const stoppedLine = (
  name: string,
  consequence: string,
  cause: Cause.Cause<unknown>,
  retryInMs?: number,
  deaths = 1,
  oneShot = false
): string => {
  const how = Cause.hasDies(cause)
    ? "on a defect of the agent's"
    : "on a failure it does not handle (a defect of the agent's)"
  // a one-shot fiber (one test, one write) is not a loop to restart: its consequence says what follows
  const then = oneShot
    ? ""
    : retryInMs === undefined
      ? "; not restarted (restart the agent)"
      : `; restarting it in ${retryInMs} ms`
  return `${name} stopped ${how}: ${consequence}${then}${deaths > 1 ? ` (${deaths} times in a row)` : ""}`
}

/** Logs `cause` as `name`'s end, once, at error level; nothing for an interruption (a scope ending the fiber). */
export const reportStop = (
  name: string,
  consequence: string,
  cause: Cause.Cause<unknown>,
  retryInMs?: number,
  deaths = 1,
  oneShot = false
): Effect.Effect<void> =>
  Cause.hasInterruptsOnly(cause)
    ? Effect.void
    : Effect.logError(stoppedLine(name, consequence, cause, retryInMs, deaths, oneShot), { fiber: name }, cause)

/** What a death is, for telling the same one again: its cause's first line (the error, without the stack). */
const causeKey = (cause: Cause.Cause<unknown>): string => Cause.pretty(cause).split("\n", 1)[0] ?? ""
const powerOfTwo = (n: number): boolean => (n & (n - 1)) === 0

/**
 * `self` as a background fiber named `name` (what runs: "the etcd heartbeat"); `consequence` says what no longer
 * happens once it ends ("the node's record in etcd is no longer written"). Never fails: its end other than by
 * interruption is logged (`reportStop`), then, with `restart`, `self` runs again after the backoff. An end by
 * success is the loop's own (a stream that ended) and is left so.
 */
export const background =
  (
    name: string,
    consequence: string,
    options: { readonly restart?: Restart | undefined; readonly oneShot?: true } = {}
  ) =>
  <A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<void, never, R> => {
    const restart = options.restart
    const oneShot = options.oneShot === true
    if (restart === undefined)
      return self.pipe(
        Effect.asVoid,
        Effect.catchCause((cause) =>
          Cause.hasInterrupts(cause)
            ? Effect.andThen(reportStop(name, consequence, cause, undefined, 1, oneShot), Effect.failCause(cause))
            : reportStop(name, consequence, cause, undefined, 1, oneShot)
        )
      ) as Effect.Effect<void, never, R>
    return Effect.gen(function* () {
      let deaths = 0
      let lastKey: string | undefined
      for (;;) {
        const startedAt = yield* Clock.currentTimeMillis
        const exit = yield* Effect.exit(self)
        if (exit._tag === "Success") return
        // interrupted (the scope closing): ended as asked, a defect met on the way said but not restarted
        if (Cause.hasInterrupts(exit.cause)) {
          yield* reportStop(name, consequence, exit.cause)
          return yield* Effect.failCause(exit.cause as Cause.Cause<never>)
        }
        if ((yield* Clock.currentTimeMillis) - startedAt >= restart.capMs) deaths = 0
        deaths++
        const retryInMs = jitteredBackoffMs(deaths, restart.capMs, yield* Random.next, restart.baseMs)
        // The same death again in a row (a defect every round of a loop whose cap is short: the etcd heartbeat's is a
        // heartbeat) is said again at its 2nd, 4th, 8th... time, with the count: not a stack trace per round.
        const key = causeKey(exit.cause)
        const again = deaths > 1 && key === lastKey
        lastKey = key
        if (!again || powerOfTwo(deaths)) yield* reportStop(name, consequence, exit.cause, retryInMs, deaths)
        yield* Effect.sleep(retryInMs)
      }
    })
  }
