/**
 * NodeStatus: the node's live view of itself, assembled from the engine state, admission counters,
 * relayed-token rate and GPUs. HealthReporter writes it to etcd; gRPC GetNodeHealth and /status return it.
 * Freshness (epoch, sequence, write time) is left empty here: only the etcd writer knows it.
 */
import { Context, type Effect, type Stream } from "effect"
import type { NodeHealth } from "../../gen/cgn/agent/v1/agent.ts"
import type { AdvertiseError } from "../registry/Advertise.ts"

export type { NodeHealth } from "../../gen/cgn/agent/v1/agent.ts"

/** The node states a router sees; "cordoned": an operator took the node out of traffic (services/node/Cordon.ts). */
export const NodeStates = ["starting", "ready", "unhealthy", "draining", "cordoned"] as const
export type NodeState = (typeof NodeStates)[number]

export interface NodeStatusService {
  /** NodeHealth computed now. */
  readonly snapshot: Effect.Effect<NodeHealth>
  /**
   * Emits whenever the node state or the engine's state changed (engine transition, drain, cordon; the same node state
   * again when only the engine's changed), so writers need not wait a heartbeat.
   */
  readonly changes: Stream.Stream<NodeState>
  /** True once a drain has begun. */
  readonly draining: Effect.Effect<boolean>
  /** True while an operator has the node cordoned (a flag read, for gRPC health and the per-call refusal). */
  readonly cordoned: Effect.Effect<boolean>
  /**
   * The port the gRPC server bound: advertised from then on where listen_grpc asks for port 0 (the OS picks it, and
   * port 0 is no address a router can dial). Called once the server listens, before the node is registered. Fails
   * when the address needs this host's interfaces and they cannot be listed (no descriptor left).
   */
  readonly grpcBound: (port: number) => Effect.Effect<void, AdvertiseError>
}

export class NodeStatus extends Context.Service<NodeStatus, NodeStatusService>()("cgn-agent/NodeStatus") {}
