/**
 * GrpcServer: the agent's gRPC endpoint ([agent].listen_grpc): Agent (Generate, ListModels,
 * GetNodeHealth), grpc.health.v1.Health and server reflection. The live layer is layers/grpc/GrpcServer.ts.
 * Health is SERVING only while the engine is Ready and the node is not draining; `setHealthOverride`
 * lets the drain force NOT_SERVING before anything else notices.
 */
import { Context, type Effect } from "effect"
import type { HealthImplementation } from "grpc-health-check"

/** The fully qualified name of the Agent service, as health checks and reflection name it. */
export const AGENT_SERVICE = "cgn.agent.v1.Agent"

export type ServingStatus = "SERVING" | "NOT_SERVING"

export interface GrpcServerService {
  /** The bound address, `host:port` (the real port when listen_grpc asked for port 0). */
  readonly address: string
  /**
   * The grpc.health.v1 state this server serves, for another listener to serve the same one (the plaintext
   * health listener): one state, so a change reaches Check and Watch on both at once.
   */
  readonly healthState: HealthImplementation
  /** Forces a status (e.g. NOT_SERVING at the start of a drain); undefined returns to the automatic one. */
  readonly setHealthOverride: (status: ServingStatus | undefined) => Effect.Effect<void>
  /** Generate calls being relayed now. */
  readonly activeStreams: Effect.Effect<number>
  /** Completes when no Generate call is being relayed (at once if none is). */
  readonly awaitNoStreams: Effect.Effect<void>
  /**
   * Ends every Generate in flight with UNAVAILABLE and `reason` (the drain, after its timeout); their
   * engine requests are aborted. Deltas already sent stay sent.
   */
  readonly abortActive: (reason: string) => Effect.Effect<void>
  /**
   * When a prefill leg last handed off KV that outlives it (Clock ms; undefined: none yet): vLLM's prefill engine
   * keeps a leg's blocks for its decode leg to read after the leg ended (Relay.handedOffAt), so the drain keeps the
   * engine a while after it (programs/main.ts). An SGLang leg ends only once its KV is sent: never here.
   */
  readonly lastHandoffAt: Effect.Effect<number | undefined>
}

export class GrpcServer extends Context.Service<GrpcServer, GrpcServerService>()("cgn-agent/GrpcServer") {}
