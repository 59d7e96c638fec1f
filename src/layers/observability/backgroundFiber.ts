/**
 * The agent's long-lived background fibers (a watcher, a reporter, a reader, a timer), forked into a scope and joined
 * by no one: a defect (a throw in an Effect.sync, a bug, a synchronous EMFILE from an fs or socket call) or a failure
 * the loop leaves unhandled ends such a fiber with nothing said, and the feature it runs stops for good while the
 * agent looks healthy (the engine supervisor's loop ended so on a spawn without stdio, the engine "spawning" for
 * ever: layers/engine/EngineProcess.ts). `background` says it: one error line naming what stopped, what no longer
 * happens and that it is the agent's defect, with the cause, counted in `cgn_agent_background_failures_total{fiber}`
 * (where the Metrics service is in context; alert CgnAgentBackgroundLoopFailing); and, given `restart`, runs the loop
 * again after a capped, jittered backoff (services/retry/Backoff.ts; from the base again after a run that lasted the
 * cap). The same death in a row is said again only at its 2nd, 4th, 8th... time, counted apart from the backoff (a
 * defect that comes back after every cap-long run is not a stack trace per cap).
 * Interruption is how a scope ends its fibers: never said, counted nor restarted. An interruption the loop's own
 * work ends with while its fiber is not being interrupted (an Effect.interrupt inside, an inner fiber it joined that
 * something else interrupted) is a death like a defect: `background` tells the two apart by asking whether its own
 * fiber's scope is closing or it is itself being interrupted (`selfInterrupted`).
 */
import { Cause, Clock, Effect, Exit, Option, Random, Scope } from "effect"
import { backgroundFailures, Metrics } from "../../services/observability/Metrics.ts"
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
    : Cause.hasFails(cause)
      ? "on a failure it does not handle (a defect of the agent's)"
      : "on an interruption from within, not its scope's end (a defect of the agent's)"
  // a one-shot fiber (one test, one write) is not a loop to restart: its consequence says what follows
  const then = oneShot
    ? ""
    : retryInMs === undefined
      ? "; not restarted (restart the agent)"
      : `; restarting it in ${retryInMs} ms`
  return `${name} stopped ${how}: ${consequence}${then}${deaths > 1 ? ` (${deaths} times in a row)` : ""}`
}

/** Logs `cause` as `name`'s end, once, at error level. */
export const reportStop = (
  name: string,
  consequence: string,
  cause: Cause.Cause<unknown>,
  retryInMs?: number,
  deaths = 1,
  oneShot = false
): Effect.Effect<void> =>
  Effect.logError(stoppedLine(name, consequence, cause, retryInMs, deaths, oneShot), { fiber: name }, cause)

/** What a death is, for telling the same one again: its cause's first line (the error, without the stack). */
const causeKey = (cause: Cause.Cause<unknown>): string => Cause.pretty(cause).split("\n", 1)[0] ?? ""
const powerOfTwo = (n: number): boolean => (n & (n - 1)) === 0

type Restore = <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>

/**
 * Whether the current fiber is itself being interrupted, asked from the uninterruptible loop: `restore` opens it to
 * interruption for a yield, and one pending or arriving lands there, held by Effect.exit. Effect 4 (4.1,
 * Effect-TS/effect packages/effect/src/internal/effect.ts) records a fiber's interruption on the fiber
 * (`interruptUnsafe`: FiberImpl._interruptedCause, not public), fails the fiber with it at its next interruptible
 * point (`setInterruptible`'s continuation) and unwinds an interruptible fiber past every handler (`exitFailCause`),
 * so only an uninterruptible region can ask. The yield (not a bare
 * check): a scope ends its fibers one after another, the latest forked first (a loop joining a sibling forked after
 * it sees that sibling's interruption before its own, which comes next); it lets that one land too, when nothing
 * between them waits (an asynchronous finalizer does: the loop's scope, closed, answers that case first).
 */
const selfInterrupted = (restore: Restore): Effect.Effect<boolean> =>
  Effect.map(Effect.exit(restore(Effect.yieldNow)), Exit.isFailure)

/**
 * `self` as a background fiber named `name` (what runs: "the etcd heartbeat"); `consequence` says what no longer
 * happens once it ends ("the node's record in etcd is no longer written"). Never fails: its death is logged
 * (`reportStop`) and counted, then, with `restart`, `self` runs again after the backoff. An end by success is the
 * loop's own (a stream that ended) and is left so. Interrupted (its scope closing), it ends so, a defect met on the
 * way (a finalizer's) said but neither counted nor restarted.
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
    // The loop's own steps run uninterruptibly, `self` and the backoff's sleep with the caller's interruptibility
    // (`restore`): an interruption then ends `self` into the Exit read below instead of unwinding past it.
    return Effect.uninterruptibleMask((restore) =>
      Effect.gen(function* () {
        const metrics = Option.getOrUndefined(yield* Effect.serviceOption(Metrics))
        // the scope the loop was forked into by Effect.forkScoped (every loop of the agent's): once it is closing, an
        // interruption is its end, however long its other finalizers (run one after another) keep it from arriving
        const scope = Option.getOrUndefined(yield* Effect.serviceOption(Scope.Scope))
        const failures = metrics === undefined ? undefined : backgroundFailures(metrics.registry)
        // a 0 sample from the start: increase() sees the first death (a series that first appears at 1 shows none)
        failures?.inc({ fiber: name }, 0)
        let deaths = 0 // in a row, for the backoff: a run that lasted the cap starts them over
        let same = 0 // the same death in a row, for what is said: kept across that start over
        let lastKey: string | undefined
        for (;;) {
          const startedAt = yield* Clock.currentTimeMillis
          const exit = yield* Effect.exit(restore(self))
          if (exit._tag === "Success") return
          const cause = exit.cause
          if (Cause.hasInterrupts(cause) && (scope?.state._tag === "Closed" || (yield* selfInterrupted(restore)))) {
            if (!Cause.hasInterruptsOnly(cause)) yield* reportStop(name, consequence, cause, undefined, 1, oneShot)
            return yield* Effect.failCause(cause as Cause.Cause<never>)
          }
          failures?.inc({ fiber: name })
          if (restart === undefined) return yield* reportStop(name, consequence, cause, undefined, 1, oneShot)
          if ((yield* Clock.currentTimeMillis) - startedAt >= restart.capMs) deaths = 0
          deaths++
          const retryInMs = jitteredBackoffMs(deaths, restart.capMs, yield* Random.next, restart.baseMs)
          // The same death again in a row (a defect every round of a loop whose cap is short: the etcd heartbeat's is
          // a heartbeat; or after every cap-long run) is said again at its 2nd, 4th, 8th... time, with the count.
          const key = causeKey(cause)
          same = key === lastKey ? same + 1 : 1
          lastKey = key
          if (powerOfTwo(same)) yield* reportStop(name, consequence, cause, retryInMs, Math.max(deaths, same))
          yield* restore(Effect.sleep(retryInMs))
        }
      })
    )
  }
