// ServingState's per-call refusal and the cordon: a call right after POST /cordon (or /uncordon) has answered is
// decided by the Cordon service itself, not by the flag the node's change stream sets a moment later (the test's
// NodeStatus never emits the cordon at all, so only the direct read can see it).
import { assert, describe, it } from "@effect/vitest"
import { Clock, Effect, Layer } from "effect"
import * as ServingState from "../../src/layers/grpc/ServingState.ts"
import { State } from "../../src/services/engine/EngineState.ts"
import { Cordon } from "../../src/services/node/Cordon.ts"
import * as CordonTest from "../../src/testing/Cordon.ts"
import { layerTest as engineLayerTest } from "../../src/testing/EngineProcess.ts"
import { layerTest as nodeStatusLayerTest } from "../../src/testing/NodeStatus.ts"

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
