/**
 * The stall watchdog: one coarse interval for all Generate streams instead of a timer per read. A stream whose
 * read count has not moved for engine.stream_idle_timeout, while the caller is not the one holding it back (a
 * paused producer), ends with EngineStalled; the abort interrupts its fiber, which aborts the
 * engine request. Each tick's verdict also goes to EngineStall (when present), which tells health that the
 * engine is wedged, unless a call completed in the same tick (then the engine is not wedged). While
 * stalled with no call in flight, the engine is asked for a short test completion (stallProbe.ts); so is a Ready
 * engine that has had no call for engine.idle_probe_after, since nothing else would show it wedged while idle.
 * Each tick also reports the calls the engine failed since its completions (ActiveCalls.engineFailed), which
 * EngineStall counts in a row (engine.failed_calls_unhealthy); an engine newly taken as failing calls is tested at
 * once, not an idle timeout after the last test: input-specific errors from a sound engine clear within one test.
 * The same tick ends a call whose caller held it back (its flow control, Relay.held) for agent.client_send_timeout
 * with ClientNotReading, as nginx's send_timeout does: its engine request is aborted (freeing the engine and the
 * admission slot) and the stream reset; else max_inflight callers that never read would hold the node for ever.
 */
import { Clock, Duration, Effect, Option, Schedule, type Scope } from "effect"
import { Config } from "../../services/config/Config.ts"
import { EngineClient } from "../../services/engine/EngineClient.ts"
import { EngineProcess } from "../../services/engine/EngineProcess.ts"
import { EngineStall, isStalled } from "../../services/engine/EngineStall.ts"
import { ClientNotReading, EngineStalled } from "../../services/grpc/CallErrors.ts"
import { Metrics } from "../../services/observability/Metrics.ts"
import { probeShape, stallProbe } from "../engine/stallProbe.ts"
import type { ActiveCalls } from "./ActiveCalls.ts"

/** Runs the watchdog over `active` until the scope closes. */
export const fork = Effect.fnUntraced(function* (
  active: ActiveCalls
): Effect.fn.Return<void, never, Config | Scope.Scope> {
  const config = yield* Config
  const metrics = Option.getOrUndefined(yield* Effect.serviceOption(Metrics))
  const stall = Option.getOrUndefined(yield* Effect.serviceOption(EngineStall))
  const client = Option.getOrUndefined(yield* Effect.serviceOption(EngineClient))
  // The probe asks only a Ready engine: from a restart's request to the next run's start the engine is being stopped or
  // is absent, and a test request there fails for that alone (a soak saw warnings of "still stalled" all through it).
  const engine = Option.getOrUndefined(yield* Effect.serviceOption(EngineProcess))
  const engineReady = engine === undefined ? Effect.succeed(true) : Effect.map(engine.state, (s) => s._tag === "Ready")
  const idleMs = Duration.toMillis(config.engine.stream_idle_timeout)
  const quietMs = Duration.toMillis(config.engine.idle_probe_after)
  // when a call last completed: a test the engine-wide queue held while calls completed is no wedge (stallProbe.ts)
  let lastCompletedAt = Number.NEGATIVE_INFINITY
  const probe =
    stall === undefined || client === undefined
      ? undefined
      : stallProbe(
          client,
          stall,
          idleMs,
          probeShape(config.engine.kind, config.agent.role, config.model.dp, config.engine.proxied_kind),
          yield* Effect.scope,
          Duration.format(config.engine.idle_probe_after),
          engineReady,
          () => lastCompletedAt,
          // a test the engine answered with an error: again at liveness's pace (stallProbe.ts)
          Math.min(idleMs, Duration.toMillis(config.engine.liveness_interval))
        )
  const stalls = metrics?.engineStreamStalls.labels({ model: config.model.served_name })
  // A 0 sample from the start: prom-client writes a labelled series only once it is incremented, and increase()
  // over a series that appears at 1 sees no increase, so the first stall of a process would never alert.
  stalls?.inc(0)
  const stalledError = new EngineStalled({ idleTimeout: Duration.format(config.engine.stream_idle_timeout) })
  const sendMs = Duration.toMillis(config.agent.client_send_timeout) // 0: never
  const notReading = new ClientNotReading({ timeout: Duration.format(config.agent.client_send_timeout) })
  const notReadingCount = metrics?.clientSendTimeouts.labels({ model: config.model.served_name })
  notReadingCount?.inc(0) // a series from the start (see `stalls`)
  // Since when the engine has had no call in flight, not Ready or stalled counting as not quiet: the idle test waits
  // idle_probe_after from a run's start, and from the end of a stall.
  let quietSince: number | undefined
  // A stream stalled and its ranks are still to be tested (stallProbe.ts streamStalled), once the probe is free.
  let rankTestOwed = false
  // The failing-calls episode (EngineStall's `failing.since`) whose test was put forward.
  let testedFailingSince: number | undefined
  const tick = Effect.flatMap(Clock.currentTimeMillis, (now) => {
    let stalled = 0
    // the oldest stream that read something since the last tick (a stall restart waits while one older than the stall
    // still moves)
    let oldestMoving = Number.POSITIVE_INFINITY
    const completed = active.completed > 0
    active.completed = 0
    const inRow = active.completedInRowBest
    active.completedInRowBest = active.completedInRow
    const engineFailed = active.engineFailed
    active.engineFailed = 0
    if (completed) lastCompletedAt = now
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
    if (stall === undefined) return logCut
    const noted = Effect.andThen(
      // a call completed in the same tick: the engine is not wedged, and the stall is not even noted (noted and
      // cleared at once, it logged "unhealthy" and "no longer stalled" in the same millisecond)
      stalled > 0 && !completed ? stall.stalled(now, stalled) : Effect.void,
      completed ? stall.completed(now, undefined, false, inRow) : Effect.void
    ).pipe(
      // after the completions: these failed after the last of them (ActiveCalls.engineFailed)
      Effect.andThen(engineFailed > 0 ? stall.callsFailed(now, engineFailed, active.lastEngineFailure) : Effect.void),
      Effect.andThen(oldestMoving === Number.POSITIVE_INFINITY ? Effect.void : stall.moved(now, oldestMoving)),
      Effect.andThen(
        probe === undefined
          ? Effect.void
          : Effect.flatMap(Effect.zip(stall.state, engineReady), ([s, ready]) => {
              // a stream stalled, or a rank is taken as hung (tested again until every rank answers, calls in flight
              // or not: under load the stall's own test never runs)
              if (stalled > 0 || s.testFailed?.ranks !== undefined) rankTestOwed = true
              if (!ready) {
                // a run that ends takes its streams' stalls with it (the next one starts clear)
                quietSince = undefined
                rankTestOwed = false
                return Effect.void
              }
              // a rank that hangs alone: tested after a stream stalled, calls in flight or not
              const rankTest = rankTestOwed
                ? Effect.map(probe.streamStalled(now), (started) => {
                    if (started) rankTestOwed = false
                  })
                : Effect.void
              // newly failing calls: its first test as soon as no call is in flight
              if (s.failing !== undefined && s.failing.since !== testedFailingSince) {
                testedFailingSince = s.failing.since
                probe.soon()
              }
              if (active.size > 0) {
                quietSince = undefined
                return rankTest
              }
              // stalled with no call: the stall's own test, which goes to every rank too (and clears the stall)
              if (isStalled(s)) {
                quietSince = undefined
                return Effect.map(probe.stalled(now), (started) => {
                  if (started) rankTestOwed = false
                })
              }
              if (completed || quietSince === undefined) quietSince = now
              if (quietMs <= 0 || now - quietSince < quietMs) return rankTest
              quietSince = now // the next test another idle_probe_after on
              return Effect.andThen(rankTest, probe.idle(now))
            })
      )
    )
    return Effect.andThen(logCut, noted)
  })
  // the shorter timeout's eighth: a call held back is ended at most that late
  const watchedMs = sendMs > 0 ? Math.min(idleMs, sendMs) : idleMs
  yield* tick.pipe(
    Effect.repeat(Schedule.spaced(Duration.millis(Math.min(1000, Math.max(25, watchedMs / 8))))),
    Effect.forkScoped
  )
})
