// NodeHealth's capacity.max_model_len: the context one request can use on the node, as ListModels reports it (the
// configured models.<name>.max_model_len, lowered to what the engine says it serves), so a router picks a node whose
// context fits a call from the etcd record alone. A router-contract review: a call past one node's context was refused
// INVALID_ARGUMENT (not retryable) while the record said nothing of the limit, and ListModels had to be polled per node.
import { Effect, Layer } from "effect"
import { describe, expect, it } from "vitest"
import * as ConfigLayer from "../../src/layers/config/Config.ts"
import * as NodeStatusLayer from "../../src/layers/node/NodeStatus.ts"
import { EngineClient } from "../../src/services/engine/EngineClient.ts"
import { ServedContext } from "../../src/services/engine/ServedContext.ts"
import { NodeStatus } from "../../src/services/node/NodeStatus.ts"
import * as NvmlTest from "../../src/testing/Nvml.ts"
import { nodeStatusDeps } from "../support/nodeStatus.ts"

/** capacity.maxModelLen of a snapshot, configured with `configured` and the engine saying `served`. */
const contextOf = (configured: number | undefined, served: number | undefined | "no service") =>
  Effect.runPromise(
    Effect.scoped(
      Effect.map(
        Effect.flatMap(NodeStatus, (s) => s.snapshot),
        (h) => h.capacity?.maxModelLen
      ).pipe(
        Effect.provide(
          NodeStatusLayer.layer().pipe(
            Layer.provideMerge(
              nodeStatusDeps(
                ConfigLayer.layerFromObject({
                  models: {
                    m: { hf_repo: "org/m", ...(configured === undefined ? {} : { max_model_len: configured }) }
                  }
                }),
                Layer.succeed(EngineClient, {
                  streamTo: () => Effect.void,
                  load: Effect.succeed({ running: undefined, waiting: undefined, kvUsage: undefined })
                }),
                NvmlTest.layerFixed([])
              )
            ),
            Layer.provide(
              served === "no service" ? Layer.empty : Layer.succeed(ServedContext, { current: () => served })
            )
          )
        )
      )
    )
  )

describe("NodeHealth capacity.max_model_len", () => {
  it("is the configured context until the engine says less, never more; 0 when neither is known", async () => {
    expect(await contextOf(8192, "no service")).toBe(8192)
    expect(await contextOf(8192, undefined)).toBe(8192)
    expect(await contextOf(8192, 4096)).toBe(4096)
    expect(await contextOf(8192, 16384)).toBe(8192)
    expect(await contextOf(undefined, 32768)).toBe(32768)
    expect(await contextOf(undefined, undefined)).toBe(0)
  })
})
