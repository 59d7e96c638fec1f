// ServingState's per-call refusal and the cordon: a call right after POST /cordon (or /uncordon) has answered is
// decided by the Cordon service itself, not by the flag the node's change stream sets a moment later (the test's
// NodeStatus never emits the cordon at all, so only the direct read can see it).
import { assert, describe, it } from "@effect/vitest"
import { Clock, Effect, Layer } from "effect"
import { Status } from "nice-grpc-common"
import * as AdmissionLive from "../../src/layers/grpc/Admission.ts"
import * as ServingState from "../../src/layers/grpc/ServingState.ts"
import { State } from "../../src/services/engine/EngineState.ts"
import { Admission } from "../../src/services/grpc/Admission.ts"
import { toGrpcFailure } from "../../src/services/grpc/GrpcStatus.ts"
import { Cordon } from "../../src/services/node/Cordon.ts"
import * as CordonTest from "../../src/testing/Cordon.ts"
import { layerTest as engineLayerTest } from "../../src/testing/EngineProcess.ts"
import { NodeStatusTest, layerTest as nodeStatusLayerTest } from "../../src/testing/NodeStatus.ts"

describe("ServingState.refusal and the cordon", () => {
  it.effect("refuses at once after a cordon and admits at once after the uncordon, before any change event", () =>
    Effect.gen(function* () {
      const ready = State.Ready({ since: yield* Clock.currentTimeMillis, run: 0 })
      const deps = Layer.mergeAll(engineLayerTest({ initial: ready }), nodeStatusLayerTest(), CordonTest.layerMemory)
      yield* Effect.gen(function* () {
        const serving = yield* ServingState.make
        const cordon = yield* Cordon
        assert.strictEqual(serving.refusal(), undefined)
        yield* cordon.cordon("maintenance")
        assert.strictEqual(serving.refusal()?._tag, "NodeCordoned")
        yield* cordon.uncordon
        assert.strictEqual(serving.refusal(), undefined)
      }).pipe(Effect.scoped, Effect.provide(deps))
    })
  )
})

// The drain refuses new calls here from its start (before it closes admission): with admission's Draining, so the
// caller reads cgn-reason `draining` (README's list, the one status table) and the refusal is counted where /status
// and admission_refusals_total{reason="draining"} read it. The soak saw `not_serving` and both counts at 0.
describe("ServingState.refusal and the drain", () => {
  it.effect("refuses with Draining, cgn-reason draining, counted in admission's refusedDraining", () =>
    Effect.gen(function* () {
      const ready = State.Ready({ since: yield* Clock.currentTimeMillis, run: 0 })
      const deps = Layer.mergeAll(
        engineLayerTest({ initial: ready }),
        nodeStatusLayerTest({ state: "draining" }),
        AdmissionLive.layerWith({ maxInflight: 4, maxQueue: 4 })
      )
      yield* Effect.gen(function* () {
        const serving = yield* ServingState.make
        const admission = yield* Admission
        const refused = serving.refusal()
        assert.strictEqual(refused?._tag, "Draining")
        const f = toGrpcFailure(refused!)
        assert.deepStrictEqual(
          [f.code, f.trailers["cgn-reason"], f.retryElsewhere],
          [Status.UNAVAILABLE, "draining", true]
        )
        serving.refusal()
        assert.strictEqual((yield* admission.stats).refusedDraining, 2)
      }).pipe(Effect.scoped, Effect.provide(deps))
    })
  )
})

// The Agent service's health (what a router's health check reads) follows the node's `unhealthy` as the etcd record
// does (a GPU fault, an engine failing calls or stalled, while the engine is still Ready); the server's (""), which
// the kubelet probes, does not: a pod whose engine fails calls is not one to restart for it.
describe("ServingState's health and the node's unhealthy state", () => {
  it.live('the Agent service NOT_SERVING while the node is unhealthy with its engine Ready; "" stays SERVING', () =>
    Effect.gen(function* () {
      const ready = State.Ready({ since: yield* Clock.currentTimeMillis, run: 0 })
      const deps = Layer.mergeAll(engineLayerTest({ initial: ready }), nodeStatusLayerTest({ state: "ready" }))
      yield* Effect.gen(function* () {
        const serving = yield* ServingState.make
        const node = yield* NodeStatusTest
        const impl = serving.health.implementation
        const set: Array<string> = []
        const original = impl.setStatus.bind(impl)
        impl.setStatus = (service, status) => {
          set.push(`${service || '""'} ${status}`)
          original(service, status)
        }
        // the change stream is subscribed to by a forked fiber, and what the test NodeStatus publishes before that
        // is not replayed: unhealthy and ready in turn (ready changes nothing while SERVING) until it is seen, bounded
        for (let i = 0; i < 500 && set.length === 0; i++) {
          yield* node.setState("unhealthy")
          yield* Effect.sleep("2 millis")
          if (set.length === 0) yield* node.setState("ready")
        }
        yield* node.setState("ready")
        for (let i = 0; i < 500 && set.length < 2; i++) yield* Effect.sleep("2 millis")
        assert.deepStrictEqual(set, ["cgn.agent.v1.Agent NOT_SERVING", "cgn.agent.v1.Agent SERVING"])
        // calls are still admitted: a router that reads the record may send one, and it may well complete
        assert.strictEqual(serving.refusal(), undefined)
      }).pipe(Effect.scoped, Effect.provide(deps))
    })
  )
})
