/**
 * The agent's bounded waits on processes, on Effect's Clock (so a TestClock drives them): poll a check until it
 * holds or the bound passes, and the group stop (one TERM, grace, KILL, confirmed) the reclaim runs. The orphan
 * guard runs the same sequence in plain Node (it stays a tiny program without Effect).
 */
import { Clock, Effect } from "effect"
import type { StopOutcome } from "../../services/engine/GuardProtocol.ts"
import { groupAlive, KILL_WAIT_MS, signalGroup } from "./processGroup.ts"

/** Calls `check` every `everyMs` until it returns true or `ms` passed on the Clock; true when it held. */
export const pollUntil = (check: () => boolean, ms: number, everyMs = 25): Effect.Effect<boolean> =>
  Effect.gen(function* () {
    const end = (yield* Clock.currentTimeMillis) + ms
    for (;;) {
      if (check()) return true
      const now = yield* Clock.currentTimeMillis
      if (now >= end) return false
      yield* Effect.sleep(Math.min(everyMs, end - now))
    }
  })

/** The guard's stop sequence on the Clock: ONE TERM (engines take a second as "exit now"), grace, KILL, confirm. */
export const stopGroup = (pgid: number, graceMs: number, killWaitMs = KILL_WAIT_MS): Effect.Effect<StopOutcome> =>
  Effect.gen(function* () {
    if (!groupAlive(pgid)) return "gone"
    signalGroup(pgid, "SIGTERM")
    // continued, a stopped member takes the TERM now (programs/guard.ts stopGroup says why)
    signalGroup(pgid, "SIGCONT")
    if (yield* pollUntil(() => !groupAlive(pgid), graceMs)) return "terminated"
    signalGroup(pgid, "SIGKILL")
    return (yield* pollUntil(() => !groupAlive(pgid), killWaitMs)) ? "killed" : "survived"
  })
