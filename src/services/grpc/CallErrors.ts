/**
 * CallErrors: how the agent itself ends a Generate call it had accepted for checking, apart from request
 * validation (GenerateRejected), the handoff (InvalidHandoff) and admission (Overloaded, Draining): the node
 * is not serving or cordoned, a P/D leg ran out of time, the engine stalled, the engine run ended under the call (a
 * restart, its exit, its stop), the drain cut the stream, the server shut down under an open call (a health Watch),
 * the caller stopped reading (ClientNotReading), or the agent broke.
 * Their gRPC statuses are rows of GrpcStatus.ts's table. Their messages say what happened, not where to retry: a row
 * that gives its failure the advice (GrpcFailure.advised) has StatusMessage.ts asSent append the one that agrees with
 * `cgn-retryable` ("; retry on another node", or what replaces it once the call wrote or on a pair-bound leg).
 */
import { Schema } from "effect"
import { EngineError } from "../engine/EngineClient.ts"

/** The engine is not Ready: the call is refused before it reaches the engine (a drain's refusal is Draining). */
export class NotServing extends Schema.TaggedError<NotServing>()("NotServing", {
  /** "engine is not ready (starting)". */
  reason: Schema.String
}) {
  override get message(): string {
    return this.reason
  }
}

/** An operator cordoned the node (POST /cordon): it takes no new calls until POST /uncordon; the engine still runs. */
export class NodeCordoned extends Schema.TaggedError<NodeCordoned>()("NodeCordoned", {}) {
  override get message(): string {
    return "node is cordoned (out of traffic by an operator's POST /cordon)"
  }
}

/** A P/D leg did not finish (prefill) or start (decode) within [agent].handoff_timeout. */
export class LegDeadline extends Schema.TaggedError<LegDeadline>()("LegDeadline", {
  leg: Schema.Literals(["prefill", "decode"]),
  /** The timeout as configured, formatted ("30s"). */
  timeout: Schema.String,
  /** True when the leg was still waiting for admission ([agent].max_inflight): no engine request was made. */
  queued: Schema.optional(Schema.Boolean)
}) {
  override get message(): string {
    const what = this.leg === "prefill" ? "finish" : "start"
    const after = this.queued
      ? "it was still waiting for admission ([agent].max_inflight), so the engine never saw it"
      : "the engine request was aborted"
    return `the ${this.leg} leg did not ${what} within ${this.timeout} ([agent].handoff_timeout); ${after}`
  }
}

/** The engine sent nothing for engine.stream_idle_timeout while the caller was reading (the stall watchdog). */
export class EngineStalled extends Schema.TaggedError<EngineStalled>()("EngineStalled", {
  /** The timeout as configured, formatted ("30s"). */
  idleTimeout: Schema.String
}) {
  override get message(): string {
    return `the engine sent nothing for ${this.idleTimeout} (engine.stream_idle_timeout); the engine request was aborted`
  }
}

/** Who ended the engine run under a call: the agent restarting it, the engine exiting, the agent stopping it. */
export const RunEndedBy = Schema.Literals(["restart", "exit", "stop"])
export type RunEndedBy = typeof RunEndedBy.Type

/**
 * The engine request broke off because the engine run it went to is ending or ended (services/grpc/EngineCut.ts):
 * the transport's words ("other side closed") kept after the reason the supervisor's state gives; or, with no
 * `engine`, the agent aborted it the moment it began ending the run itself (a restart, its stop), so the engine sees
 * its connections close and can exit on SIGTERM (layers/grpc/EngineCut.ts cutOnRunEnd).
 */
export class EngineRunEnded extends Schema.TaggedError<EngineRunEnded>()("EngineRunEnded", {
  by: RunEndedBy,
  /** "the engine is being restarted (POST /engine/restart by an operator)", "the engine exited (signal SIGKILL)". */
  why: Schema.String,
  /** The engine failure as the transport saw it; absent when the agent aborted the request as it ended the run. */
  engine: Schema.optional(EngineError)
}) {
  override get message(): string {
    return this.engine === undefined
      ? `${this.why}: the engine request was aborted`
      : `${this.why}: ${this.engine.message}`
  }
}

/**
 * The caller read nothing for agent.client_send_timeout while output waited for it (its HTTP/2 flow control held the
 * stream back): the engine request is aborted, freeing the engine and the admission slot, and the stream is reset
 * (its row in GrpcStatus.ts says how: a status would wait behind the output the caller does not read).
 */
export class ClientNotReading extends Schema.TaggedError<ClientNotReading>()("ClientNotReading", {
  /** The timeout as configured, formatted ("1m"). */
  timeout: Schema.String
}) {
  override get message(): string {
    return `the caller read nothing for ${this.timeout} (agent.client_send_timeout) while output waited; the engine request was aborted`
  }
}

/** The drain ended the stream after its timeout (GrpcServer.abortActive); deltas already sent stay sent. */
export class StreamAborted extends Schema.TaggedError<StreamAborted>()("StreamAborted", {
  reason: Schema.String
}) {
  override get message(): string {
    return this.reason
  }
}

/** The server closed with the call still open (a health Watch, which never ends by itself). */
export class ServerShuttingDown extends Schema.TaggedError<ServerShuttingDown>()("ServerShuttingDown", {}) {
  override get message(): string {
    return "server shutting down"
  }
}

/** A defect in the agent (a bug, not the caller's or the engine's doing). */
export class AgentDefect extends Schema.TaggedError<AgentDefect>()("AgentDefect", {
  detail: Schema.String
}) {
  override get message(): string {
    return `agent error: ${this.detail}`
  }
}
