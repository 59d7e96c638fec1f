/**
 * FlapDamping: route-flap damping (RFC 2439, https://www.rfc-editor.org/rfc/rfc2439: a figure of merit that each
 * flap raises and that decays exponentially, a cutoff and a reuse threshold, a ceiling) for the engine taken as
 * failing calls (FailedCalls.ts). An engine that fails a large share of calls, not all, trips the failing state and
 * clears it again many times a minute under load that ignores health: a soak (16 streams, independent HTTP 500s)
 * measured 2.5 one-second episodes a minute at 50% errors and 7 a minute, 68% of the time unhealthy, at 80%, and
 * never a restart (never failing for engine.stall_restart_after in one piece) though half its calls failed. Each trip
 * adds a penalty of 1 that halves every HALF_LIFE_MS; once it reaches SUPPRESS the failing state is held: calls that
 * complete in a row and the agent's test completion no longer clear it, until the penalty has decayed to REUSE. A clear that came meanwhile is
 * owed, and given when the hold ends, unless the engine failed a run of calls again after it; such a run, while held,
 * is a flap too (a re-trip: the state would have cleared and tripped again) and adds its penalty, as a suppressed
 * route's flaps still do. So an engine still failing much of the calls stays held, one piece, and is restarted at
 * engine.stall_restart_after; a lone trip (a transient) is never held and clears as before.
 *
 * The constants, for the defaults (engine.failed_calls_unhealthy 5; the watchdog's 1 s tick, any
 * engine.stream_idle_timeout of 8 s or more). A trip needs the last 5 calls to end before a tick to be failures (a
 * completion ends the run), so with independent errors at rate r, trips come at about 60·r⁵ a minute while the node
 * is not already failing (the soak above: 0 in 6 minutes at 30%; 2.5 to 3 a minute at 50%):
 *   r = 0.2: 0.02/min   r = 0.3: 0.15/min   r = 0.5: 1.9/min   r = 0.8: 20/min (capped by the time already failing)
 * With a half-life of 2 min, three trips never reach SUPPRESS = 3 (1 + 2^-a + 2^-b < 3 for any ages a, b > 0): it
 * takes four within about 1.8 min (four evenly spread over w minutes: 1 + 2^(-w/6) + 2^(-w/3) + 2^(-w/2) ≥ 3 for
 * w ≤ 1.8), and two trips, or a lone one, are never held.
 *   - 30%: 0.15/min makes four within 1.8 min rare: about 9 trips an hour, each followed by three more within
 *     1.8 min with chance (0.15·1.8)³/6 ≈ 0.3%, so about once a day of errors at 30% throughout (a simulation of the
 *     watchdog's tick over independent calls at 161 calls/s: held in 6 of 100 hours); 20% and less: never in practice.
 *   - 50%: 1.9/min makes 3.4 trips in 1.8 min on average: held in about 2 minutes (the simulation: median 123 s,
 *     90th percentile 252 s).
 *   - 80% and more: held within the first minute (median 29 s), the state then failing ~2/3 of the time anyway.
 * REUSE = 1 and a ceiling of CEILING = 4 bound the hold: from the suppressing trip (≥ 3) at least 2·log2(3) ≈ 3.2 min,
 * and at most 2·log2(4) = 4 min after the last trip or re-trip, so a node whose engine recovered while held is back
 * within 4 minutes, not restarted meanwhile even where stall_restart_after is shorter (a clear owed holds the restart
 * back: layers/engine/EngineStall.ts) (RFC 2439 derives its ceiling from a maximum hold-down time likewise). Re-trips at 50% come about
 * once a minute, far more often than the 4 minutes it takes to decay from the ceiling: it stays held, and is restarted
 * at engine.stall_restart_after (counted from the trip that began the held state, as for any failing state). An engine
 * that fails every call trips once and is never cleared: neither the penalty nor the restart's timing changes for it.
 * A new engine run starts without a penalty (the restart is the remedy; the run's own trips count anew).
 * Pure: time only through the `now` it is given (epoch ms); the live EngineStall keeps the state.
 */

/** How long the penalty takes to halve. */
export const HALF_LIFE_MS = 120_000
/** Penalty each trip (or re-trip while held) adds. */
export const TRIP_PENALTY = 1
/** Penalty at which the failing state is held. */
export const SUPPRESS = 3
/** Penalty below which a hold ends. */
export const REUSE = 1
/** The most penalty kept (bounds the hold after the last trip to HALF_LIFE_MS · log2(CEILING / REUSE)). */
export const CEILING = 4

export interface Damping {
  /** The penalty at `at`. */
  readonly penalty: number
  /** When the penalty was last added to (epoch ms). */
  readonly at: number
  /** The penalty reached SUPPRESS at or before `at` and had not decayed to REUSE since (RFC 2439's suppressed). */
  readonly suppressed: boolean
  /** A clear (calls completed in a row, the test) came while held, no run of failed calls since: given at the end. */
  readonly owed: boolean
}

export const undamped: Damping = { penalty: 0, at: 0, suppressed: false, owed: false }

/** The penalty at `now`: halved every HALF_LIFE_MS since it was last added to. */
export const penaltyAt = (d: Damping, now: number): number => d.penalty * 2 ** (-Math.max(0, now - d.at) / HALF_LIFE_MS)

/** When a hold ends (epoch ms, whole): the penalty decayed to REUSE; undefined while not suppressed. */
export const releaseAt = (d: Damping): number | undefined =>
  d.suppressed ? d.at + Math.ceil(HALF_LIFE_MS * Math.log2(d.penalty / REUSE)) : undefined

/** Whether the failing state is held at `now`. */
export const isHeld = (d: Damping, now: number): boolean => {
  const until = releaseAt(d)
  return until !== undefined && now < until
}

/**
 * The engine was taken as failing calls at `now`, or a run of calls failed again while it is held after a clear was
 * owed (a re-trip): the penalty added; held from here when it reaches SUPPRESS, or still held.
 */
export const onTrip = (d: Damping, now: number): Damping => {
  const penalty = Math.min(CEILING, penaltyAt(d, now) + TRIP_PENALTY)
  return { penalty, at: now, suppressed: isHeld(d, now) || penalty >= SUPPRESS, owed: false }
}

/**
 * What a run of calls failed at `now` (it reached engine.failed_calls_unhealthy) does while the engine is already
 * taken as failing: a re-trip when held with a clear owed (the state would have cleared and tripped again), else
 * nothing (undefined: the run goes on, as before).
 */
export const onFailedRun = (d: Damping, now: number): Damping | undefined =>
  d.owed && isHeld(d, now) ? onTrip(d, now) : undefined

/**
 * A clear came at `now` (calls completed in a row, or the agent's test): whether it clears the failing state (true:
 * not held), else the damping with the clear owed.
 */
export const onClear = (d: Damping, now: number): true | Damping =>
  isHeld(d, now) ? (d.owed ? d : { ...d, owed: true }) : true

/** At the hold's end (`releaseAt`): whether the owed clear clears the failing state now, and the damping after. */
export const onRelease = (d: Damping, now: number): readonly [clear: boolean, after: Damping] =>
  isHeld(d, now) ? [false, d] : [d.owed, { ...d, suppressed: false, owed: false }]

/**
 * When a hold ends, about (epoch ms): `releaseAt` rounded up to the minute, for the node's reason; undefined while not
 * suppressed. A minute: each re-trip moves the end on, and the reason (NodeHealth, written on each change) then
 * changes at most once a minute.
 */
export const aboutUntil = (d: Damping): number | undefined => {
  const at = releaseAt(d)
  return at === undefined ? undefined : Math.ceil(at / 60_000) * 60_000
}
