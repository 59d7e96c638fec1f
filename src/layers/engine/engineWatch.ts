/**
 * The engine's health as the calls show it, once per stall-watchdog tick: what the tick saw of the calls (streams it
 * ended as stalled, calls completed, calls the engine failed, the oldest stream still moving) goes to EngineStall,
 * which tells health that the engine is wedged or failing calls; and the engine's own test completion
 * (stallProbe.ts) is sent when nothing else would show it: stalled with no call in flight, a rank that may hang
 * alone after a stream stalled, calls newly failing (tested as soon as none is in flight), decode legs failing before
 * their first text (whose cause may be their prefill node: the test says whether it is this engine), or a Ready
 * engine with no call for engine.idle_probe_after. The gRPC layer's watchdog (layers/grpc/StallWatchdog.ts) ends the calls; this
 * judges the engine.
 */
import { Duration, Effect, Option, type Scope } from "effect"
import { Config } from "../../services/config/Config.ts"
import { EngineClient } from "../../services/engine/EngineClient.ts"
import { EngineProcess } from "../../services/engine/EngineProcess.ts"
import { EngineStall, isStalled } from "../../services/engine/EngineStall.ts"
import { addHandoffFailed, type HandoffRun, handoffsAsEngines } from "../../services/engine/FailedCalls.ts"
import { probeShape } from "./probeShape.ts"
import { stallProbe } from "./stallProbe.ts"

/** What one watchdog tick saw of the calls. */
export interface CallsTick {
  readonly now: number
  /** Streams this tick ended for engine.stream_idle_timeout. */
  readonly stalled: number
  /** Whether a call completed since the last tick (its engine stream ended as the engine ends one). */
  readonly completed: boolean
  /** The most calls completed in a row since the engine last failed one (ActiveCalls.completedInRowBest). */
  readonly completedInRow: number
  /** Calls the engine failed since the later of the last completion and the last tick, and the last one's words. */
  readonly engineFailed: number
  readonly lastEngineFailure: string
  /**
   * Decode legs the engine failed before their first text, counted as engineFailed is (ActiveCalls.handoffFailed),
   * the last one's words, and the prefill nodes they read from.
   */
  readonly handoffFailed: number
  readonly lastHandoffFailure: string
  readonly handoffPeers: ReadonlyArray<string>
  /** When the oldest stream that read something since the last tick began; undefined: none moved. */
  readonly oldestMoving: number | undefined
  /** Calls in flight now. */
  readonly inFlight: number
}

/** Judges the engine at each tick. */
export type EngineWatch = (tick: CallsTick) => Effect.Effect<void>

/**
 * The watch for the configured engine, its test completion running in the current scope; undefined when there is no
 * EngineStall to tell (tests, tools).
 */
export const makeEngineWatch: Effect.Effect<EngineWatch | undefined, never, Config | Scope.Scope> = Effect.gen(
  function* () {
    const config = yield* Config
    const stall = Option.getOrUndefined(yield* Effect.serviceOption(EngineStall))
    if (stall === undefined) return undefined
    const client = Option.getOrUndefined(yield* Effect.serviceOption(EngineClient))
    // The test asks only a Ready engine: from a restart's request to the next run's start the engine is being stopped
    // or is absent, and a test request there fails for that alone (a soak saw warnings of "still stalled" all through
    // it).
    const engine = Option.getOrUndefined(yield* Effect.serviceOption(EngineProcess))
    const engineReady =
      engine === undefined ? Effect.succeed(true) : Effect.map(engine.state, (s) => s._tag === "Ready")
    const idleMs = Duration.toMillis(config.engine.stream_idle_timeout)
    const quietMs = Duration.toMillis(config.engine.idle_probe_after)
    // when a call last completed: a test the engine-wide queue held while calls completed is no wedge (stallProbe.ts)
    let lastCompletedAt = Number.NEGATIVE_INFINITY
    const probe =
      client === undefined
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
    // Since when the engine has had no call in flight, not Ready or stalled counting as not quiet: the idle test waits
    // idle_probe_after from a run's start, and from the end of a stall.
    let quietSince: number | undefined
    // A stream stalled and its ranks are still to be tested (stallProbe.ts streamStalled), once the probe is free.
    let rankTestOwed = false
    // The failing-calls episode (EngineStall's `failing.since`) whose test was put forward.
    let testedFailingSince: number | undefined
    // Decode legs the engine failed before their first text, in a row since a call completed; at
    // engine.failed_calls_unhealthy of them from one prefill node (`handoffsDue`) the engine's own test judges them
    // (stallProbe.ts handoffs), from two or more they are the engine's (FailedCalls.ts addHandoffFailed)
    const threshold = config.engine.failed_calls_unhealthy
    let handoffRun: HandoffRun | undefined
    let handoffsDue: HandoffRun | undefined

    const testWhenOwed = (t: CallsTick): Effect.Effect<void> =>
      probe === undefined
        ? Effect.void
        : Effect.flatMap(Effect.zip(stall.state, engineReady), ([s, ready]) => {
            // a stream stalled, or a rank is taken as hung (tested again until every rank answers, calls in flight
            // or not: under load the stall's own test never runs)
            if (t.stalled > 0 || s.testFailed?.ranks !== undefined) rankTestOwed = true
            if (!ready) {
              // a run that ends takes its streams' stalls with it (the next one starts clear), and its legs' failures
              quietSince = undefined
              rankTestOwed = false
              handoffRun = undefined
              handoffsDue = undefined
              return Effect.void
            }
            // a rank that hangs alone: tested after a stream stalled, calls in flight or not
            const rankTest = rankTestOwed
              ? Effect.map(probe.streamStalled(t.now), (started) => {
                  if (started) rankTestOwed = false
                })
              : Effect.void
            // newly failing calls: its first test as soon as no call is in flight
            if (s.failing !== undefined && s.failing.since !== testedFailingSince) {
              testedFailingSince = s.failing.since
              probe.soon()
            }
            // already failing calls, the legs' failures add nothing; else their test, calls in flight or not (a decode
            // node keeps its traffic meanwhile), at the probe's pace
            if (s.failing !== undefined) handoffsDue = undefined
            const due = handoffsDue
            const handoffTest =
              due === undefined
                ? Effect.void
                : Effect.map(probe.handoffs(t.now, due), (started) => {
                    if (started) handoffsDue = undefined
                  })
            if (t.inFlight > 0) {
              quietSince = undefined
              return Effect.andThen(handoffTest, rankTest)
            }
            // stalled with no call: the stall's own test, which goes to every rank too (and clears the stall)
            if (isStalled(s)) {
              quietSince = undefined
              return Effect.map(probe.stalled(t.now), (started) => {
                if (started) rankTestOwed = false
              })
            }
            if (t.completed || quietSince === undefined) quietSince = t.now
            if (due !== undefined) return Effect.andThen(handoffTest, rankTest)
            if (quietMs <= 0 || t.now - quietSince < quietMs) return rankTest
            quietSince = t.now // the next test another idle_probe_after on
            return Effect.andThen(rankTest, probe.idle(t.now))
          })

    return (t: CallsTick) => {
      if (t.completed) {
        lastCompletedAt = t.now
        handoffRun = undefined
        handoffsDue = undefined
      }
      // after the tick's completions, as engineFailed; a run that reached the count is judged, and a new one begins
      const step = addHandoffFailed(handoffRun, t.handoffFailed, t.lastHandoffFailure, t.handoffPeers, threshold)
      handoffRun = step.run
      const legsFailed =
        step.due?.by === "engine"
          ? stall.callsFailed(t.now, step.due.run.calls, handoffsAsEngines(step.due.run))
          : Effect.void
      if (step.due?.by === "test")
        handoffsDue =
          handoffsDue === undefined ? step.due.run : { ...step.due.run, calls: handoffsDue.calls + step.due.run.calls }
      return Effect.andThen(
        // a call completed in the same tick: the engine is not wedged, and the stall is not even noted (noted and
        // cleared at once, it logged "unhealthy" and "no longer stalled" in the same millisecond)
        t.stalled > 0 && !t.completed ? stall.stalled(t.now, t.stalled) : Effect.void,
        t.completed ? stall.completed(t.now, undefined, false, t.completedInRow) : Effect.void
      ).pipe(
        // after the completions: these failed after the last of them (ActiveCalls.engineFailed)
        Effect.andThen(
          t.engineFailed > 0 ? stall.callsFailed(t.now, t.engineFailed, t.lastEngineFailure) : Effect.void
        ),
        Effect.andThen(legsFailed),
        Effect.andThen(t.oldestMoving === undefined ? Effect.void : stall.moved(t.now, t.oldestMoving)),
        Effect.andThen(testWhenOwed(t))
      )
    }
  }
)
