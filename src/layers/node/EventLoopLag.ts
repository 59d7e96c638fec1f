/**
 * Live EventLoopLag: a perf_hooks.monitorEventLoopDelay histogram read and reset every window, plus the
 * worst delay since start. The histogram runs on libuv's timer, so it measures the lag that the etcd
 * heartbeat itself would suffer. Enabled and disabled with the layer's scope.
 */
import { monitorEventLoopDelay } from "node:perf_hooks"
import { Duration, Effect, Layer, Ref, Schedule } from "effect"
import { EventLoopLag, type LagSample, lagMs } from "../../services/node/EventLoopLag.ts"
import { background, RESTART } from "../observability/backgroundFiber.ts"

export interface EventLoopLagOptions {
  /**
   * Sampling resolution of the histogram, default 100 ms. Each sample is a libuv timer firing, i.e. a wake-up
   * of an otherwise idle agent (~0.2 ms of CPU each on a small VM: 20 ms cost ~10 ms of CPU a second). A stall
   * of B ms is still seen as a delay between B - 100 and B ms, fine for a lease renewed every few seconds.
   */
  readonly resolutionMs?: number
  /** Window after which current/p99/windowMax roll over, default 5 s. */
  readonly window?: Duration.Input
}

export const layer = (options: EventLoopLagOptions = {}): Layer.Layer<EventLoopLag> =>
  Layer.effect(
    EventLoopLag,
    Effect.gen(function* () {
      const windowMs = Duration.toMillis(Duration.fromInputUnsafe(options.window ?? "5 seconds"))
      const resolutionMs = options.resolutionMs ?? 100
      const lag = (ns: number) => lagMs(ns, resolutionMs)
      const histogram = yield* Effect.acquireRelease(
        Effect.sync(() => {
          const h = monitorEventLoopDelay({ resolution: resolutionMs })
          h.enable()
          return h
        }),
        (h) => Effect.sync(() => h.disable())
      )
      const last = yield* Ref.make<LagSample>({ currentMs: 0, p99Ms: 0, windowMaxMs: 0, maxMs: 0, windowMs })
      const roll = Effect.gen(function* () {
        const windowMax = histogram.count > 0 ? lag(histogram.max) : 0
        const sample = {
          currentMs: histogram.count > 0 ? lag(histogram.mean) : 0,
          p99Ms: histogram.count > 0 ? lag(histogram.percentile(99)) : 0,
          windowMaxMs: windowMax
        }
        histogram.reset()
        yield* Ref.update(last, (s) => ({ ...sample, maxMs: Math.max(s.maxMs, windowMax), windowMs }))
      })
      yield* roll.pipe(
        Effect.repeat(Schedule.spaced(Duration.millis(windowMs))),
        Effect.delay(windowMs),
        background("the event-loop lag sampler", "the event loop's lag is no longer sampled (its last window stays)", {
          restart: RESTART
        }),
        Effect.forkScoped
      )
      // Between rolls, the running window's worst delay still counts toward the all-time max.
      const sample = Ref.get(last).pipe(
        Effect.map((s) => {
          const running = histogram.count > 0 ? lag(histogram.max) : 0
          return { ...s, maxMs: Math.max(s.maxMs, running) }
        })
      )
      return EventLoopLag.of({ sample })
    })
  )
