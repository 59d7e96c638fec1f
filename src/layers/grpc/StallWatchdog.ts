/**
 * The stall watchdog: one coarse interval for all Generate streams instead of a timer per read. A stream whose
 * read count has not moved for engine.stream_idle_timeout, while the caller is not the one holding it back (a
 * paused producer), ends with EngineStalled; the abort interrupts its fiber, which aborts the engine request. The
 * same tick ends a call whose caller held it back (its flow control, Relay.held) for agent.client_send_timeout
 * with ClientNotReading, as nginx's send_timeout does: its engine request is aborted (freeing the engine and the
 * admission slot) and the stream reset; else max_inflight callers that never read would hold the node for ever.
 * What each tick saw of the calls (stalls, completions, the calls the engine failed: ActiveCalls) then goes to the
 * engine's watch (layers/engine/engineWatch.ts), which judges the engine and tests it when nothing else would.
 */
import { Clock, Duration, Effect, Option, Schedule, type Scope } from "effect"
import { Config } from "../../services/config/Config.ts"
import { ClientNotReading, EngineStalled } from "../../services/grpc/CallErrors.ts"
import { AgentShortage, ShortageEvent } from "../../services/node/AgentShortage.ts"
import { Metrics } from "../../services/observability/Metrics.ts"
import { makeEngineWatch } from "../engine/engineWatch.ts"
import { background, RESTART } from "../observability/backgroundFiber.ts"
import type { ActiveCalls } from "./ActiveCalls.ts"

/** Runs the watchdog over `active` until the scope closes. */
export const fork = Effect.fnUntraced(function* (
  active: ActiveCalls
): Effect.fn.Return<void, never, Config | Scope.Scope> {
  const config = yield* Config
  const metrics = Option.getOrUndefined(yield* Effect.serviceOption(Metrics))
  const idleMs = Duration.toMillis(config.engine.stream_idle_timeout)
  const watchEngine = yield* makeEngineWatch
  // absent in tests that build the server without it
  const shortage = Option.getOrUndefined(yield* Effect.serviceOption(AgentShortage))
  const stalls = metrics?.engineStreamStalls.labels({ model: config.model.served_name })
  // A 0 sample from the start: prom-client writes a labelled series only once it is incremented, and increase()
  // over a series that appears at 1 sees no increase, so the first stall of a process would never alert.
  stalls?.inc(0)
  const stalledError = new EngineStalled({ idleTimeout: Duration.format(config.engine.stream_idle_timeout) })
  const sendMs = Duration.toMillis(config.agent.client_send_timeout) // 0: never
  const notReading = new ClientNotReading({ timeout: Duration.format(config.agent.client_send_timeout) })
  const notReadingCount = metrics?.clientSendTimeouts.labels({ model: config.model.served_name })
  notReadingCount?.inc(0) // a series from the start (see `stalls`)
  const tick = Effect.flatMap(Clock.currentTimeMillis, (now) => {
    let stalled = 0
    // the oldest stream that read something since the last tick (a stall restart waits while one older than the stall
    // still moves)
    let oldestMoving = Number.POSITIVE_INFINITY
    const completed = active.completed > 0
    active.completed = 0
    const completedInRow = active.completedInRowBest
    active.completedInRowBest = active.completedInRow
    const engineFailed = active.engineFailed
    active.engineFailed = 0
    const handoffFailed = active.handoffFailed
    active.handoffFailed = 0
    const handoffPeers = [...active.handoffPeers]
    active.handoffPeers.clear()
    // the longest run of calls refused for the agent's own shortage since the last look; the open run carries on
    const agentFailedPeak = active.agentFailedPeak
    active.agentFailedPeak = 0
    let cut: Array<string> | undefined
    for (const relay of active.relays) {
      // held since the tick that first saw this wait (`holds` moves with each new one): ended past the timeout, done
      // or not (a done call's output may still wait for the caller)
      const w = relay.watch
      if (relay.held && sendMs > 0) {
        if (relay.holds !== w.seenHolds) {
          w.seenHolds = relay.holds
          w.heldSince = now
        } else if (now - w.heldSince >= sendMs && relay.failure !== notReading) {
          notReadingCount?.inc()
          if (cut === undefined) cut = []
          cut.push(relay.requestId)
          relay.cut(notReading)
          continue
        }
      }
      if (!w.streaming || relay.done) continue
      if (relay.reads !== w.seenReads || relay.paused) {
        if (relay.reads !== w.seenReads) oldestMoving = Math.min(oldestMoving, w.since)
        w.seenReads = relay.reads
        w.idleSince = now
      } else if (now - w.idleSince >= idleMs) {
        w.streaming = false // once: the abort ends it
        stalls?.inc()
        stalled++
        relay.abort(stalledError)
      }
    }
    const logCut =
      cut === undefined
        ? Effect.void
        : Effect.forEach(cut, (id) =>
            Effect.logWarning(
              `the caller read nothing for ${notReading.timeout} (agent.client_send_timeout) while output waited: call ended, its engine request aborted, its stream reset`
            ).pipe(Effect.annotateLogs({ request_id: id }))
          )
    const shortageSeen =
      shortage === undefined || agentFailedPeak === 0
        ? Effect.void
        : shortage.report(ShortageEvent.CallsRefused({ inRow: agentFailedPeak, last: active.lastAgentFailure }))
    if (watchEngine === undefined) return Effect.andThen(logCut, shortageSeen)
    return Effect.andThen(
      Effect.andThen(logCut, shortageSeen),
      watchEngine({
        now,
        stalled,
        completed,
        completedInRow,
        engineFailed,
        lastEngineFailure: active.lastEngineFailure,
        handoffFailed,
        handoffPeers,
        lastHandoffFailure: active.lastHandoffFailure,
        oldestMoving: oldestMoving === Number.POSITIVE_INFINITY ? undefined : oldestMoving,
        inFlight: active.size
      })
    )
  })
  // the shorter timeout's eighth: a call held back is ended at most that late
  const watchedMs = sendMs > 0 ? Math.min(idleMs, sendMs) : idleMs
  // a tick's defect (a throw in a relay's abort) would end the watch for the process: said, and the ticks go on
  yield* tick.pipe(
    Effect.repeat(Schedule.spaced(Duration.millis(Math.min(1000, Math.max(25, watchedMs / 8))))),
    background(
      "the stall watchdog",
      "stalled streams and callers that stopped reading are no longer ended, the engine's calls no longer judged",
      { restart: RESTART }
    ),
    Effect.forkScoped
  )
})
