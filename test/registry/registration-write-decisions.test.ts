/**
 * What one round of layers/registry/registrationStep.ts decides about a write, over a scripted etcd (no process):
 * when a heartbeat's rewrite falls due, what a shutdown's write says, when a refused write withdraws the key (only a
 * refusal etcd answered, of a record whose state differs from the key's: an etcd over its space quota, the NOSPACE
 * alarm, answers keepalives and refuses writes; etcd-io/etcd server/etcdserver/api/v3rpc/rpctypes/error.go
 * ErrGRPCNoSpace), and how often a standing conflict is logged.
 */
import { assert, describe, it } from "@effect/vitest"
import { Duration, Effect, Layer, Logger } from "effect"
import { TestClock } from "effect/testing"
import { NodeHealth } from "../../src/gen/cgn/agent/v1/agent.ts"
import type { EtcdOps, WriteOutcome } from "../../src/layers/registry/etcdClient.ts"
import { EtcdUnavailable } from "../../src/services/registry/HealthReporter.ts"
import { NodeStatusTest, layerTest as nodeStatusTest } from "../../src/testing/NodeStatus.ts"
import { registrationStepOf } from "../support/registrationStep.ts"

/** etcd that keeps each record written and counts revokes; `refuse` (when set) is the error every rewrite gets. */
const scripted = () => {
  const written: Array<NodeHealth> = []
  const etcd: { refuse: EtcdUnavailable | undefined; held: string | undefined; revokes: number } = {
    refuse: undefined,
    held: undefined,
    revokes: 0
  }
  const put = (value: string) =>
    Effect.suspend((): Effect.Effect<WriteOutcome, EtcdUnavailable> => {
      if (etcd.held !== undefined) return Effect.succeed({ _tag: "Held", holder: { lease: etcd.held, value: "{}" } })
      if (etcd.refuse !== undefined) return Effect.fail(etcd.refuse)
      written.push(NodeHealth.fromJSON(JSON.parse(value)))
      return Effect.succeed({ _tag: "Written" })
    })
  const ops: EtcdOps = {
    grant: () => Effect.succeed({ id: "7587869035283627011", ttlMs: 10_000 }),
    keepAlive: () => Effect.succeed(10_000),
    create: (_key, value) => put(value),
    write: (_key, value) => put(value),
    revoke: () => Effect.sync(() => void etcd.revokes++),
    reloadTls: Effect.succeed(false)
  }
  return { ops, etcd, written }
}

const noSpace = new EtcdUnavailable({
  operation: "write",
  reason: "etcdserver: mvcc: database space exceeded",
  answered: true
})

describe("a registration round's write decisions", () => {
  // agent.proto heartbeat_ms: the record is rewritten once per heartbeat; a tick that lands exactly half a tick short
  // of it is the one that writes, or the next write would come half a tick late (a tick after the heartbeat).
  it.effect("a rewrite is due from half a tick before the heartbeat, that instant included", () =>
    Effect.gen(function* () {
      const { ops, written } = scripted()
      // heartbeat 1.5 s, TTL 3 s: ticks every 1 s, due from 1 s after the last write
      const { timing, step } = yield* registrationStepOf(ops, "1500ms", "3s")
      assert.strictEqual(timing.tickMs, 1000)
      assert.strictEqual(timing.heartbeatMs - timing.tickMs / 2, 1000)
      yield* step("tick")
      yield* TestClock.adjust(Duration.millis(timing.tickMs))
      yield* step("tick")
      assert.lengthOf(written, 2)
    }).pipe(Effect.provide(nodeStatusTest({ state: "ready" })))
  )

  it.effect("a shutdown's write says draining, whatever the snapshot says", () =>
    Effect.gen(function* () {
      const { ops, written } = scripted()
      const { step } = yield* registrationStepOf(ops, "5s", "15s")
      yield* step("tick")
      yield* step("shutdown")
      assert.deepStrictEqual(
        written.map((r) => r.state),
        ["ready", "draining"]
      )
    }).pipe(Effect.provide(nodeStatusTest({ state: "ready" })))
  )

  it.effect("a refused rewrite of the state the key already says keeps the lease and the key (a stale writtenAt)", () =>
    Effect.gen(function* () {
      const { ops, etcd } = scripted()
      const { s, step } = yield* registrationStepOf(ops, "5s", "15s")
      yield* step("tick")
      etcd.refuse = noSpace
      yield* Effect.exit(step("change"))
      assert.strictEqual(etcd.revokes, 0)
      assert.isDefined(s.session)
    }).pipe(Effect.provide(nodeStatusTest({ state: "ready" })))
  )

  it.effect("a refused record of another state withdraws the key only when etcd answered the refusal", () =>
    Effect.gen(function* () {
      const { ops, etcd } = scripted()
      const control = yield* NodeStatusTest
      const { s, step } = yield* registrationStepOf(ops, "5s", "15s")
      yield* step("tick")
      yield* control.update((h) => ({ ...h, state: "cordoned" }))
      // etcd did not answer (a deadline, a connection refused): nothing is known refused; the lease is kept
      etcd.refuse = new EtcdUnavailable({ operation: "write", reason: "deadline exceeded" })
      yield* Effect.exit(step("change"))
      assert.strictEqual(etcd.revokes, 0)
      assert.isDefined(s.session)
      // etcd answered it (over its quota): the key saying "ready" is withdrawn with its lease
      etcd.refuse = noSpace
      yield* Effect.exit(step("change"))
      assert.strictEqual(etcd.revokes, 1)
      assert.isUndefined(s.session)
      assert.strictEqual(s.state, "retrying")
    }).pipe(Effect.provide(nodeStatusTest({ state: "ready" })))
  )

  it.effect("a conflict with the same holder round after round is logged once, a new holder again", () => {
    const errors: Array<string> = []
    return Effect.gen(function* () {
      const { ops, etcd } = scripted()
      etcd.held = "7000000000000000001"
      const { step } = yield* registrationStepOf(ops, "5s", "15s")
      for (let i = 0; i < 3; i++) yield* Effect.exit(step("tick"))
      assert.lengthOf(errors, 1)
      assert.include(errors[0], "by another live agent")
      etcd.held = "7000000000000000002"
      yield* Effect.exit(step("tick"))
      assert.lengthOf(errors, 2)
    }).pipe(
      Effect.provide(
        Layer.mergeAll(
          nodeStatusTest({ state: "ready" }),
          Logger.layer([
            Logger.make(({ logLevel, message }) => {
              if (logLevel === "Error") errors.push([message].flat().join(" "))
            })
          ])
        )
      )
    )
  })
})
