/**
 * An in-memory HealthReporter for tests of its callers (the drain, /status, metrics): it records what
 * would be written instead of talking to etcd, and reports itself as standalone until marked draining.
 */
import { Effect, Layer, Ref } from "effect"
import { HealthReporter, type RegistrationStatus } from "../services/HealthReporter.ts"
import { type NodeHealth, NodeStatus } from "../services/NodeStatus.ts"

const standalone: RegistrationStatus = {
  state: "standalone",
  key: undefined,
  leaseId: undefined,
  epoch: undefined,
  leaseTtlMs: undefined,
  leaseAgeMs: undefined,
  sinceKeepAliveMs: undefined,
  sequence: 0,
  lastWriteAt: undefined,
  publishedState: undefined,
  lastError: undefined,
  conflict: undefined,
  writes: 0,
  writeFailures: 0,
  leasesGranted: 0,
  leasesLost: 0
}

/** Records every flush and the drain mark; `lastRecord` is the last NodeStatus snapshot flushed. */
export const layerTest: Layer.Layer<HealthReporter, never, NodeStatus> = Layer.effect(
  HealthReporter,
  Effect.gen(function* () {
    const node = yield* NodeStatus
    const status = yield* Ref.make(standalone)
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
      flush: write()
    })
  })
)
