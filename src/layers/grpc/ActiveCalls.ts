/**
 * The Generate calls being relayed now: what the drain counts, waits for and aborts, what the stall watchdog looks
 * at, and what the end of the engine run under them cuts (EngineCut.ts cutOnRunEnd). The "no call left" signal is a
 * Latch, open exactly while the set is empty.
 */
import { Effect, Latch } from "effect"
import { agentFailedCall, engineFailedCall, type GenerateError } from "../../services/grpc/GrpcStatus.ts"
import type { Relay } from "./Relay.ts"

export class ActiveCalls {
  readonly relays = new Set<Relay>()
  /** Calls that completed (their engine stream ended as the engine ends one) since the watchdog last looked. */
  completed = 0
  /**
   * Calls the engine failed (GrpcStatus.engineFailedCall) since the later of the last completion and the watchdog's
   * last look, and the last one's status message: the watchdog reports them after this look's completions, so the
   * run EngineStall counts keeps the calls' order across a tick.
   */
  engineFailed = 0
  lastEngineFailure = ""
  /**
   * Decode legs the engine failed before their first text (Relay.readsHandoff), since as engineFailed but apart from
   * it, and neither ending nor counting in completedInRow: the KV they read lives on their prefill node, and a prefill
   * engine that crashed, restarted or drained fails every leg reading from it on each decode node, whose own engine
   * may be sound. Not the engine's until its own test fails too, or legs from two prefill nodes fail
   * (`handoffPeers`; layers/engine/engineWatch.ts): counted as the engine's, a crash-looping prefill node took every
   * decode node it served out of traffic, and held them there for flapping (a P/D soak).
   */
  handoffFailed = 0
  lastHandoffFailure = ""
  readonly handoffPeers = new Set<string>()
  /** The latest Relay.handedOffAt of a call that ended (Clock ms; 0: none): GrpcServer.lastHandoffAt. */
  lastHandoffAt = 0
  /**
   * Calls completed in a row since the engine last failed one (in the order the calls ended), and the most it reached
   * since the watchdog's last look: what clears an engine taken as failing calls (FailedCalls.ts failingCleared).
   */
  completedInRow = 0
  completedInRowBest = 0
  /**
   * Calls the agent's own host failed on their way to the engine (GrpcStatus.agentFailedCall) in a row, in the order
   * calls ended, since a call last completed; the most that run reached since the watchdog's last look (a run that a
   * completion ended between two looks still counts: AgentShortage trips on it); the last one's status message.
   */
  agentFailedInRow = 0
  agentFailedPeak = 0
  lastAgentFailure = ""
  readonly #idle = Latch.makeUnsafe(true)
  /** While set, the agent is ending the engine run: a call added now ends with it at once (see `cutWhile`). */
  #cut: GenerateError | undefined = undefined

  add(relay: Relay): void {
    this.relays.add(relay)
    this.#idle.closeUnsafe()
    // A call that got past the serving check in the moment between the run's ending being published and that check
    // learning of it would go to an engine being stopped: it ends as the calls in flight did.
    if (this.#cut !== undefined) relay.abort(this.#cut)
  }

  delete(relay: Relay): void {
    if (!this.relays.delete(relay)) return
    if (relay.handedOffAt > this.lastHandoffAt) this.lastHandoffAt = relay.handedOffAt
    if (relay.completed) {
      this.completed++
      this.engineFailed = 0
      this.handoffFailed = 0
      this.handoffPeers.clear()
      this.agentFailedInRow = 0
      if (++this.completedInRow > this.completedInRowBest) this.completedInRowBest = this.completedInRow
    } else if (relay.failure !== undefined) {
      const failed = engineFailedCall(relay.failure)
      if (failed !== undefined && relay.readsHandoff && relay.firstTextAt === 0) {
        this.handoffFailed++
        this.lastHandoffFailure = failed
        this.handoffPeers.add(relay.handoffPeer)
      } else if (failed !== undefined) {
        this.engineFailed++
        this.lastEngineFailure = failed
        this.completedInRow = 0
      }
      const agents = agentFailedCall(relay.failure)
      if (agents !== undefined) {
        if (++this.agentFailedInRow > this.agentFailedPeak) this.agentFailedPeak = this.agentFailedInRow
        this.lastAgentFailure = agents
      }
    }
    if (this.relays.size === 0) this.#idle.openUnsafe()
  }

  get size(): number {
    return this.relays.size
  }

  /** Ends every call in flight with `failure` (a call already ending keeps its own reason: Relay.abort). */
  abortAll(failure: GenerateError): void {
    for (const relay of this.relays) relay.abort(failure)
  }

  /**
   * `failure` while the agent ends the engine run (every call in flight and every call added meanwhile ends with it,
   * its engine request aborted), undefined once a run is Ready again.
   */
  cutWhile(failure: GenerateError | undefined): void {
    this.#cut = failure
    if (failure !== undefined) this.abortAll(failure)
  }

  /** Completes when no call is being relayed (at once if none is). */
  readonly awaitEmpty: Effect.Effect<void> = Effect.suspend(() => this.#idle.await)
}
