/**
 * EventLoopLag: how late the event loop runs timers. A blocked loop starves the etcd heartbeat and puts
 * the lease at risk (Dynamo moved its keepalive to a dedicated thread for this reason), so the lag is
 * measured all the time and exposed in metrics and /status. The live layer is layers/node/EventLoopLag.ts.
 */
import { Context, type Effect } from "effect"

export interface LagSample {
  /** Mean delay over the last completed window, ms. */
  readonly currentMs: number
  /** 99th percentile over the last completed window, ms. */
  readonly p99Ms: number
  /** Worst delay in the last completed window, ms. */
  readonly windowMaxMs: number
  /** Worst delay since start, ms. */
  readonly maxMs: number
  /** Length of a window, ms. */
  readonly windowMs: number
}

export interface EventLoopLagService {
  readonly sample: Effect.Effect<LagSample>
}

export class EventLoopLag extends Context.Service<EventLoopLag, EventLoopLagService>()("cgn-agent/EventLoopLag") {}

/** Nanoseconds (what perf_hooks histograms record) to milliseconds, rounded to 0.01. */
export const nsToMs = (ns: number): number => (Number.isFinite(ns) ? Math.round(ns / 10_000) / 100 : 0)

/**
 * The lag a histogram value says, ms: perf_hooks' event-loop-delay histogram records the time between two of its
 * timer's runs, the sampling interval included (an idle loop at resolution 100 reads ~100 ms: measured, Node 24),
 * so the interval is taken off; never below 0.
 */
export const lagMs = (ns: number, resolutionMs: number): number =>
  Math.max(0, Math.round((nsToMs(ns) - resolutionMs) * 100) / 100)
