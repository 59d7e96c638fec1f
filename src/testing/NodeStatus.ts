/**
 * A NodeStatus that tests drive by hand: set the state, the draining flag or any NodeHealth field, and
 * `changes` emits like the live one (src/layers/node/NodeStatus.ts) would.
 */
import { Context, Effect, Layer, PubSub, Ref, Stream } from "effect"
import { NodeHealth } from "../gen/cgn/agent/v1/agent.ts"
import { type NodeState, NodeStatus } from "../services/node/NodeStatus.ts"

/** Controls of the test NodeStatus. */
export interface NodeStatusTestControls {
  /** Sets the node state (and the draining flag when the state is "draining"), emitting a change. */
  readonly setState: (state: NodeState) => Effect.Effect<void>
  /** Replaces fields of the snapshot; emits a change when the state field changes. */
  readonly update: (f: (current: NodeHealth) => NodeHealth) => Effect.Effect<void>
  /** How many times `snapshot` was read. */
  readonly reads: Effect.Effect<number>
}

export class NodeStatusTest extends Context.Service<NodeStatusTest, NodeStatusTestControls>()(
  "cgn-agent/NodeStatusTest"
) {}

/** A plausible starting snapshot; `overrides` replace top-level fields. */
export const testNodeHealth = (overrides: Partial<NodeHealth> = {}): NodeHealth =>
  NodeHealth.fromPartial({
    nodeId: "node-test",
    cluster: "default",
    agentVersion: "0.0.0-test",
    advertiseAddr: "127.0.0.1:7071",
    role: "both",
    state: "starting",
    engine: { kind: "vllm", model: "m", phase: "starting", restarts: 0, detail: "" },
    load: { inflight: 0, queued: 0, engineRunning: 0, engineWaiting: 0, kvUsage: -1, tokensPerSecond: 0 },
    capacity: { maxInflight: 256, maxQueue: 1024, gpus: [] },
    ...overrides
  })

/** NodeStatus plus its controls, for tests. */
export const layerTest = (initial: Partial<NodeHealth> = {}): Layer.Layer<NodeStatus | NodeStatusTest> =>
  Layer.effectContext(
    Effect.gen(function* () {
      const current = yield* Ref.make(testNodeHealth(initial))
      const draining = yield* Ref.make(initial.state === "draining")
      const reads = yield* Ref.make(0)
      const pubsub = yield* Effect.acquireRelease(PubSub.unbounded<NodeState>(), PubSub.shutdown)
      const update = (f: (h: NodeHealth) => NodeHealth) =>
        Effect.gen(function* () {
          const before = (yield* Ref.get(current)).state
          const after = f(yield* Ref.get(current))
          yield* Ref.set(current, after)
          if (after.state === "draining") yield* Ref.set(draining, true)
          if (after.state !== before) yield* PubSub.publish(pubsub, after.state as NodeState)
        })
      const status = NodeStatus.of({
        snapshot: Ref.updateAndGet(reads, (n) => n + 1).pipe(Effect.andThen(Ref.get(current))),
        changes: Stream.fromPubSub(pubsub),
        draining: Ref.get(draining),
        cordoned: Effect.map(Ref.get(current), (h) => h.state === "cordoned"),
        grpcBound: () => Effect.void
      })
      const controls = NodeStatusTest.of({
        setState: (state) => update((h) => ({ ...h, state })),
        update,
        reads: Ref.get(reads)
      })
      return Context.make(NodeStatus, status).pipe(Context.add(NodeStatusTest, controls))
    })
  )
