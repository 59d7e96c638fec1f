/**
 * Whether this node serves: SERVING only while the engine is Ready and the node is not draining, unless an override
 * (the drain's NOT_SERVING at its start, shutdown) says otherwise; the Agent service (routers) is also NOT_SERVING
 * while the node is cordoned or `unhealthy` with its engine up (a GPU fault, an engine failing calls or stalled: what
 * the etcd record says, so a router that reads gRPC health leaves the node as one that reads etcd does); the server's
 * own status, which the kubelet probes, is not. Followed from the engine's
 * and the node's change streams; every change is published to grpc.health.v1 at once. Generate refuses a call
 * while the engine is not Ready, the node drains or is cordoned (`refusal`): flags read per call, no I/O. A drain's
 * refusal is admission's Draining (cgn-reason `draining`), counted by Admission when it is there: the drain
 * refuses calls here from its start, before it closes admission (programs/main.ts orderedDrain).
 */
import { Effect, Option, type Scope, Stream } from "effect"
import { EngineProcess } from "../../services/engine/EngineProcess.ts"
import { Admission, Draining } from "../../services/grpc/Admission.ts"
import { NodeCordoned, NotServing } from "../../services/grpc/CallErrors.ts"
import type { ServingStatus } from "../../services/grpc/GrpcServer.ts"
import { Cordon } from "../../services/node/Cordon.ts"
import { NodeStatus } from "../../services/node/NodeStatus.ts"
import { background, RESTART } from "../observability/backgroundFiber.ts"
import { PublishedHealth } from "./Health.ts"

export interface ServingState {
  /** The status, published for "" and the Agent service alike. */
  readonly health: PublishedHealth
  readonly setOverride: (status: ServingStatus | undefined) => void
  /** Why a new Generate call is refused now (node draining, cordoned, engine not ready), or undefined. */
  readonly refusal: () => NotServing | NodeCordoned | Draining | undefined
}

/** Follows the engine and the node until the scope closes. */
export const make: Effect.Effect<ServingState, never, EngineProcess | NodeStatus | Scope.Scope> = Effect.gen(
  function* () {
    const engine = yield* EngineProcess
    const nodeStatus = yield* NodeStatus
    // The cordon itself when present: a call right after POST /cordon (or /uncordon) has answered is decided by it,
    // not by the flag below, which the node's change stream sets a moment later. Absent (tests): the flag.
    const cordon = Option.getOrUndefined(yield* Effect.serviceOption(Cordon))
    // Counts the drain's refusals with its own (absent in tests that build the server without it).
    const admission = Option.getOrUndefined(yield* Effect.serviceOption(Admission))
    const health = new PublishedHealth()
    let engineTag: string = (yield* engine.state)._tag
    let draining = yield* nodeStatus.draining
    let cordoned = yield* nodeStatus.cordoned
    // from the node's change stream, which starts with the current state
    let unhealthy = false
    let override: ServingStatus | undefined
    // The server's status ("", the kubelet's startup and readiness probes) leaves the cordon out: a cordoned pod is
    // still a working pod, and NOT_SERVING there failed its startup probe after a container restart (kubelet kills
    // it) and made a rollout replace it first; the Agent service's status (routers) is NOT_SERVING while cordoned.
    const server = (): ServingStatus => override ?? (engineTag === "Ready" && !draining ? "SERVING" : "NOT_SERVING")
    const current = (): ServingStatus => (server() === "SERVING" && (cordoned || unhealthy) ? "NOT_SERVING" : server())
    const publish = (): void => health.publish(server(), current())
    publish()
    yield* Stream.runForEach(engine.changes, (s) =>
      Effect.sync(() => {
        engineTag = s._tag
        publish()
      })
    ).pipe(
      // followed again after a defect: the stream starts with the current state
      background("the serving status's engine follower", "gRPC health no longer follows the engine's state", {
        restart: RESTART
      }),
      Effect.forkScoped
    )
    yield* Stream.runForEach(nodeStatus.changes, (state) =>
      Effect.zipWith(nodeStatus.draining, nodeStatus.cordoned, (d, c) => {
        draining = d || state === "draining"
        // the flag, not the state: under a drain the state says "draining" whether or not the node is cordoned
        cordoned = c || state === "cordoned"
        unhealthy = state === "unhealthy"
        publish()
      })
    ).pipe(
      background("the serving status's node follower", "gRPC health no longer follows drains, cordons and faults", {
        restart: RESTART
      }),
      Effect.forkScoped
    )
    const cordonedRefusal = new NodeCordoned()
    return {
      health,
      setOverride: (status) => {
        override = status
        publish()
      },
      refusal: () => {
        if (draining) return admission === undefined ? new Draining() : admission.refuseDraining()
        // made once: the cordon's refusal per call is a flag read, nothing allocated
        if (cordon === undefined ? cordoned : cordon.isCordoned()) return cordonedRefusal
        if (engineTag === "Ready") return undefined
        return new NotServing({ reason: `engine is not ready (${engineTag.toLowerCase()})` })
      }
    }
  }
)
