/**
 * EngineCut: why a Generate call's engine request broke off, when the engine run it went to is ending or has ended
 * under it: the agent restarts the engine (an operator's POST /engine/restart, a stall restart, failed liveness),
 * the engine exited, or the agent stops it. The transport only sees a closed socket ("other side closed", "socket
 * hang up"); the supervisor's state says why, so the call's status can say it too (CallErrors.EngineRunEnded).
 * Decided from the engine's state and run numbers, never from when things happened: the supervisor publishes a
 * restart's ending (Unhealthy with `ending`) before it signals the engine (layers/engine/watch.ts, runOnce.ts), so a
 * socket the restart closes is seen after it; an engine that died by itself closes its sockets before its exit is
 * reported, which layers/grpc/EngineCut.ts waits for (bounded) while the run still shows Ready. When the agent ends
 * the run itself (`agentCut`), the calls in flight are not left for the engine to close: they are cut the moment the
 * ending is published (layers/grpc/EngineCut.ts cutOnRunEnd), since an engine with open streams may not exit on
 * SIGTERM (llama-server's connection threads wait for results its stopped task loop never sends). Pure.
 */
import type { EngineError } from "../engine/EngineClient.ts"
import {
  type EngineState,
  type ExitRecord,
  type RequestedEnd,
  RunEndWords,
  type UnhealthyEnding
} from "../engine/EngineProcess.ts"
import { describeStatus } from "../engine/EngineState.ts"
import { EngineRunEnded, type RunEndedBy } from "./CallErrors.ts"

/** Why the engine run is ending or ended, as the call's status says it. */
export interface RunEnding {
  readonly by: RunEndedBy
  /** "the engine is being restarted (POST /engine/restart by an operator)", "the engine exited (signal SIGKILL)". */
  readonly why: string
}

const restarting = (why: string): RunEnding => ({ by: "restart", why: `the engine is being restarted (${why})` })

/** A restart asked for, as a caller reads it: an operator's by the admin API, a stall restart by its reason. */
const restartWhy = (end: RequestedEnd): RunEnding =>
  restarting(end.source === "admin" ? "POST /engine/restart by an operator" : end.reason)

/** An ended run, as a caller reads it, by how it ended (its record's `endedBy`). */
const fromExit = (exit: ExitRecord): RunEnding => {
  const end = exit.endedBy
  switch (end.kind) {
    case "exited":
      return { by: "exit", why: RunEndWords.exited(describeStatus(exit)) }
    case "requested":
      return restartWhy(end)
    case "unhealthy":
      return restarting(end.reason)
    case "stopped":
      return { by: "stop", why: "the agent stopped the engine" }
    // a run that never became Ready, or one whose exit status never came: said as its exit record says it
    case "failed":
    case "startupTimeout":
      return { by: "restart", why: `the engine run ended (${RunEndWords.record(end)})` }
  }
}

/** A run being torn down (Unhealthy), as a caller reads it, by its `ending`; `reason`: the Unhealthy state's. */
const tornDown = (ending: UnhealthyEnding | undefined, reason: string): RunEnding => {
  switch (ending?.kind) {
    case "requested":
      return restartWhy(ending)
    case "exited":
      return { by: "exit", why: RunEndWords.exited(ending.status) }
    case undefined:
      // failed liveness: the supervisor ends the run (a probe's verdict that the engine no longer answers)
      return restarting(reason)
  }
}

/**
 * Why the engine run a call went to is ending or has ended, from the supervisor's state now, or undefined while it
 * is Ready (a run ends only through Unhealthy, so a call, made while some run was Ready, was cut by the ending of
 * the run the state names, or of the one before a Starting run). `exits`: the runs' exit records, newest first.
 */
export const runEnding = (state: EngineState, exits: ReadonlyArray<ExitRecord>): RunEnding | undefined => {
  switch (state._tag) {
    case "Ready":
      return undefined
    case "Unhealthy":
      return tornDown(state.ending, state.reason)
    case "Restarting":
      return fromExit(state.lastExit)
    case "Starting": {
      const previous = exits.find((x) => x.run === state.run - 1)
      return previous === undefined ? undefined : fromExit(previous)
    }
    case "Stopping":
      return { by: "stop", why: "the agent is stopping the engine" }
    case "Stopped":
      return { by: "stop", why: "the agent stopped the engine" }
  }
}

/**
 * The ending the calls in flight get at once, because the agent itself is ending the run they went to (a restart
 * asked for, a stall restart, failed liveness, its stop), or undefined: the run is Ready, or it ended by itself (the
 * engine exited: its sockets are closed already, and each call keeps the transport's words after the exit's,
 * `explainCut`). The same decision and words as a cut call's (`runEnding`). `exits` as there.
 */
export const agentCut = (state: EngineState, exits: ReadonlyArray<ExitRecord>): EngineRunEnded | undefined => {
  const ending = runEnding(state, exits)
  return ending === undefined || ending.by === "exit"
    ? undefined
    : new EngineRunEnded({ by: ending.by, why: ending.why })
}

/**
 * The connection broke (refused, reset, closed mid-stream) with no word of the engine's: what an engine that died
 * leaves. Its exit reaches the supervisor through the orphan guard's report, which can trail the closed socket.
 */
export const connectionBroke = (e: EngineError): boolean =>
  e.reason === "Connect" ||
  (e.reason === "Stream" && e.status === undefined && e.engineType === undefined && e.engineCode === undefined)

/** The engine failure `e` as the run's end explains it, or `e` when the run is not ending. */
export const explainCut = (e: EngineError, ending: RunEnding | undefined): EngineError | EngineRunEnded =>
  ending === undefined ? e : new EngineRunEnded({ by: ending.by, why: ending.why, engine: e })
