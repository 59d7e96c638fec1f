/**
 * Who holds the node key when registration is refused, as layers/registry/registrationStep.ts reads it from the key's
 * lease and value into /status `conflict` and the RegistrationConflict's words, and how soon a refused registration
 * tries again. Over a scripted etcd (no process): etcd gives a key written without a lease as lease 0
 * (etcd-io/etcd api/mvccpb kv.proto, KeyValue.lease: "If lease is 0, then no lease is attached to the key").
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit } from "effect"
import { TestClock } from "effect/testing"
import { NodeHealth } from "../../src/gen/cgn/agent/v1/agent.ts"
import type { EtcdOps, Holder } from "../../src/layers/registry/etcdClient.ts"
import { epochOf } from "../../src/services/registry/HealthReporter.ts"
import { layerTest as nodeStatusTest } from "../../src/testing/NodeStatus.ts"
import { registrationStepOf } from "../support/registrationStep.ts"

const OURS = "7587869035283627011"
const OTHER = "7000000000000000001"

/** etcd where the node key is held by `holder` while it is set; our lease granted, writes answered otherwise. */
const heldKey = (initial: Holder | undefined) => {
  const key = { holder: initial }
  const creates: Array<number> = []
  const answer = () =>
    Effect.sync(() =>
      key.holder === undefined ? ({ _tag: "Written" } as const) : { _tag: "Held" as const, holder: key.holder }
    )
  const ops: EtcdOps = {
    grant: () => Effect.succeed({ id: OURS, ttlMs: 10_000 }),
    keepAlive: () => Effect.succeed(10_000),
    create: () => Effect.suspend(() => Effect.sync(() => creates.push(creates.length)).pipe(Effect.andThen(answer()))),
    write: () => answer(),
    revoke: () => Effect.void,
    reloadTls: Effect.succeed(false)
  }
  return { ops, key, creates }
}

const failure = (exit: Exit.Exit<unknown, unknown>): string => (Exit.isFailure(exit) ? String(exit.cause) : "")

describe("the holder of a refused registration", () => {
  it.effect("a key with no lease (lease 0) is held by no lease: 'none', never epoch 0000000000000000", () =>
    Effect.gen(function* () {
      const { ops } = heldKey({ lease: "0", value: "written by hand" })
      const { s, step } = yield* registrationStepOf(ops)
      const exit = yield* Effect.exit(step("tick"))
      assert.strictEqual(s.state, "conflict")
      assert.deepStrictEqual(s.conflict, { lease: "none", advertiseAddr: "", epoch: "" })
      assert.include(failure(exit), "with no lease")
    }).pipe(Effect.provide(nodeStatusTest({ state: "ready" })))
  )

  it.effect("a holder's NodeHealth record gives its address and epoch; its lease is shown in hex", () =>
    Effect.gen(function* () {
      const record = NodeHealth.fromPartial({
        advertiseAddr: "10.0.0.9:7071",
        freshness: { epoch: "00000000000000aa" }
      })
      const { ops } = heldKey({ lease: OTHER, value: JSON.stringify(NodeHealth.toJSON(record)) })
      const { s, step } = yield* registrationStepOf(ops)
      yield* Effect.exit(step("tick"))
      assert.deepStrictEqual(s.conflict, {
        lease: epochOf(OTHER),
        advertiseAddr: "10.0.0.9:7071",
        epoch: "00000000000000aa"
      })
    }).pipe(Effect.provide(nodeStatusTest({ state: "ready" })))
  )

  // An unreadable holder record gives no address: that is no evidence the holder is this node's previous agent, even
  // for a node whose own advertised address is empty too.
  it.effect("a holder whose address is unknown is never taken for this node's previous agent", () =>
    Effect.gen(function* () {
      const { ops } = heldKey({ lease: OTHER, value: "not json" })
      const { step } = yield* registrationStepOf(ops)
      const cause = failure(yield* Effect.exit(step("tick")))
      assert.include(cause, "by another live agent")
      assert.notInclude(cause, "previous agent")
    }).pipe(Effect.provide(nodeStatusTest({ state: "ready", advertiseAddr: "" })))
  )

  // A conflict leaves the session unregistered: every round tries the create again, not only once per heartbeat, so the
  // node registers within a tick of the holder's key going away.
  it.effect("after a conflict over a key it held, the next tick tries the key again, not a heartbeat later", () =>
    Effect.gen(function* () {
      const { ops, key, creates } = heldKey(undefined)
      // a short lease: ticks (2 s) well inside a heartbeat (5 s)
      const { s, timing, step } = yield* registrationStepOf(ops, "5s", "6s")
      yield* step("tick")
      assert.strictEqual(s.state, "registered")
      // another lease took the key (a state change's write finds it held); then it goes away
      key.holder = { lease: OTHER, value: "{}" }
      yield* Effect.exit(step("change"))
      assert.strictEqual(s.state, "conflict")
      key.holder = undefined
      const before = creates.length
      assert.isBelow(timing.tickMs, timing.heartbeatMs - timing.tickMs / 2)
      yield* TestClock.adjust(timing.tickMs)
      yield* step("tick")
      assert.strictEqual(creates.length, before + 1)
      assert.strictEqual(s.state, "registered")
    }).pipe(Effect.provide(nodeStatusTest({ state: "ready" })))
  )
})
