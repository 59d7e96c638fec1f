/**
 * An in-memory HealthReporter for tests of its callers (the drain, /status, metrics): it records what
 * would be written instead of talking to etcd, and reports itself as standalone until marked draining.
 */
import { Effect, Layer, Ref } from "effect"
import { type NodeHealth, NodeStatus } from "../services/node/NodeStatus.ts"
import { HealthReporter, standaloneStatus } from "../services/registry/HealthReporter.ts"

/** Records every flush and the drain mark; `lastRecord` is the last NodeStatus snapshot flushed. */
export const layerTest: Layer.Layer<HealthReporter, never, NodeStatus> = Layer.effect(
  HealthReporter,
  Effect.gen(function* () {
    const node = yield* NodeStatus
    const status = yield* Ref.make(standaloneStatus)
    const last = yield* Ref.make<NodeHealth | undefined>(undefined)
    const write = (publishedState?: string) =>
      Effect.gen(function* () {
        const record = yield* node.snapshot
        yield* Ref.set(last, record)
        yield* Ref.update(status, (s) => ({
          ...s,
          sequence: s.sequence + 1,
          writes: s.writes + 1,
          lastWriteAt: new Date().toISOString(),
          publishedState: publishedState ?? record.state
        }))
      })
    return HealthReporter.of({
      status: Ref.get(status),
      lastRecord: Ref.get(last),
      markDraining: write("draining"),
      flush: write(),
      reloadTls: Effect.undefined
    })
  })
)
