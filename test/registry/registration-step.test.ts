// The HealthReporter's round (layers/registry/registrationStep.ts) over a scripted etcd, on a TestClock, driven as
// the reporter drives it (a step per tick; a failed step moves to "retrying"): how often the record is rewritten,
// and what the registration state says while etcd is down.
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Layer, Logger } from "effect"
import { TestClock } from "effect/testing"
import { NodeHealth } from "../../src/gen/cgn/agent/v1/agent.ts"
import type { EtcdOps } from "../../src/layers/registry/etcdClient.ts"
import type { LeaseRecord } from "../../src/layers/registry/leaseRecord.ts"
import { makeRegistrationStep } from "../../src/layers/registry/registrationStep.ts"
import { initialReporterState } from "../../src/layers/registry/reporterState.ts"
import { NodeStatus } from "../../src/services/node/NodeStatus.ts"
import { EtcdUnavailable, LeaseLost } from "../../src/services/registry/HealthReporter.ts"
import { reporterTiming } from "../../src/services/registry/ReporterTiming.ts"
import { NodeStatusTest, layerTest as nodeStatusTest } from "../../src/testing/NodeStatus.ts"
import { registrationAgent } from "../support/registrationStep.ts"

/** A scripted etcd: every grant and write answered (or refused while `down`), each written record kept. */
const scriptedEtcd = () => {
  const written: Array<NodeHealth> = []
  const etcd = { down: false, grants: 0 }
  const refused = (operation: string) => Effect.fail(new EtcdUnavailable({ operation, reason: "connection refused" }))
  const put = (value: string) =>
    Effect.sync(() => {
      written.push(NodeHealth.fromJSON(JSON.parse(value)))
      return { _tag: "Written" } as const
    })
  const ops: EtcdOps = {
    grant: () => {
      if (etcd.down) return refused("grant")
      etcd.grants++
      return Effect.succeed({ id: "7587869035283627011", ttlMs: 10_000 })
    },
    keepAlive: () => (etcd.down ? refused("keepalive") : Effect.succeed(10_000)),
    create: (_key, value) => (etcd.down ? refused("create") : put(value)),
    write: (_key, value) => (etcd.down ? refused("write") : put(value)),
    revoke: () => Effect.void,
    reloadTls: Effect.succeed(false)
  }
  return { ops, etcd, written }
}

/** A step and its state, with the reporter's loop around it: a failed round moves to "retrying". */
const reporter = (agent: ReturnType<typeof registrationAgent>, ops: EtcdOps, leaseRecord?: LeaseRecord) =>
  Effect.gen(function* () {
    const nodeStatus = yield* NodeStatus
    const s = initialReporterState()
    const timing = reporterTiming(agent.heartbeat, agent.lease_ttl)
    const { step, setState } = makeRegistrationStep({
      s,
      ops,
      key: "/cgn/c1/nodes/n1",
      timing,
      agent,
      nodeStatus,
      leaseRecord
    })
    const round = step("tick").pipe(Effect.catch(() => setState("retrying")))
    return { s, timing, round, step }
  })

const warningsInto = (lines: Array<string>) =>
  Logger.layer([
    Logger.make(({ logLevel, message }) => {
      if (logLevel === "Warn") lines.push([message].flat().join(" "))
    })
  ])

describe("registrationStep", () => {
  // agent.proto `heartbeat_ms`: "The writer's [agent].heartbeat ...: it rewrites the record this often, so one older
  // than a few of these ... is from a node that stopped writing".
  it.effect.each([
    ["ticks of a heartbeat", "1s", "10s"],
    ["ticks shorter than a heartbeat (a short lease)", "3s", "4s"]
  ] as const)("rewrites the record once per heartbeat: %s", ([, heartbeat, leaseTtl]) =>
    Effect.gen(function* () {
      const agent = registrationAgent(heartbeat, leaseTtl)
      const { ops, written } = scriptedEtcd()
      const { timing, round } = yield* reporter(agent, ops)
      for (let t = 0; t < 30_000; t += timing.tickMs) {
        yield* round
        yield* TestClock.adjust(timing.tickMs)
      }
      const at = written.map((r) => Date.parse(r.freshness!.writtenAt))
      assert.isAtLeast(at.length, Math.floor(30_000 / timing.heartbeatMs))
      for (let i = 1; i < at.length; i++) {
        const gap = at[i]! - at[i - 1]!
        assert.isAtMost(gap, timing.heartbeatMs, `write ${i} came ${gap} ms after the one before`)
        // within half a tick of it (a write waits for a tick), never more often than that
        assert.isAtLeast(gap, timing.heartbeatMs - timing.tickMs / 2, `write ${i}`)
      }
      assert.strictEqual(written.at(-1)!.freshness!.heartbeatMs, timing.heartbeatMs)
    }).pipe(Effect.provide(nodeStatusTest({ state: "ready" })))
  )

  // A chaos soak (llama-server SIGSTOPped): 3 failed liveness probes tore the engine down and every call was refused,
  // yet etcd said `ready` with engine phase `unhealthy` until `starting` was written: the liveness verdict was damped
  // (agent.health_damping). A liveness loss always ends the run (layers/engine/watch.ts), so no state is damped: each
  // is in the record of the write its change makes, whatever agent.health_damping says (no effect any more).
  it.effect(
    "every state change is in the next write's record, a liveness teardown's included, whatever health_damping",
    () =>
      Effect.gen(function* () {
        const agent = registrationAgent("30s", "90s", { health_damping: 10 })
        const { ops, written } = scriptedEtcd()
        const { step } = yield* reporter(agent, ops)
        const control = yield* NodeStatusTest
        yield* step("tick")
        const changes: ReadonlyArray<readonly [string, string]> = [
          ["ready", "ready"],
          // the liveness probe failed liveness_failures times: the run is being torn down
          ["unhealthy", "unhealthy"],
          // and ready again at once (a write that read the snapshot after Restarting and Starting had passed)
          ["ready", "ready"],
          ["unhealthy", "unhealthy"],
          ["starting", "restarting"],
          ["ready", "ready"],
          ["cordoned", "ready"],
          ["ready", "ready"]
        ]
        for (const [state, phase] of changes) {
          yield* control.update((h) => ({ ...h, state, engine: { ...h.engine!, phase } }))
          yield* step("change")
          const last = written.at(-1)!
          assert.deepStrictEqual([last.state, last.engine?.phase], [state, phase])
        }
      }).pipe(Effect.provide(nodeStatusTest({ state: "starting" })))
  )

  // "'revoked' and 'retrying' stay visible until the registration succeeds": an etcd that stays unreachable reads
  // retrying throughout, with one warning, not registering/retrying at every retry.
  it.effect("an unreachable etcd: the state stays retrying until etcd answers, one warning for it", () => {
    const warnings: Array<string> = []
    return Effect.gen(function* () {
      const agent = registrationAgent("1s", "10s")
      const { ops, etcd, written } = scriptedEtcd()
      etcd.down = true
      const { s, round } = yield* reporter(agent, ops)
      for (let i = 0; i < 10; i++) {
        yield* round
        if (i > 0) assert.strictEqual(s.state, "retrying", `after round ${i}`)
        yield* TestClock.adjust(1000)
      }
      assert.deepStrictEqual(warnings, ["etcd registration: retrying"])
      etcd.down = false
      yield* round
      assert.strictEqual(s.state, "registered")
      assert.lengthOf(written, 1)
    }).pipe(Effect.provide(Layer.mergeAll(nodeStatusTest({ state: "ready" }), warningsInto(warnings))))
  })

  // A revoke from outside that lands between a tick's keepalive and its write (seen against a real etcd with
  // `etcdctl lease revoke`): the key is gone with the lease, and that is the lease's loss, not a key "deleted
  // outside the agent while its lease lives", nor create's NOT_FOUND words.
  it.effect(
    "a lease revoked between a tick's keepalive and its write: the lease's loss, not a key deleted by hand",
    () => {
      const warnings: Array<string> = []
      return Effect.gen(function* () {
        const agent = registrationAgent("1s", "10s")
        const { ops } = scriptedEtcd()
        let revoked = false
        let revokeAfterKeepAlive = false
        const lost = (reason: string) => Effect.fail(new LeaseLost({ leaseId: "7587869035283627011", reason }))
        const racing: EtcdOps = {
          ...ops,
          keepAlive: (id) =>
            Effect.suspend(() => {
              if (revoked) return lost("etcd reports the lease expired or revoked")
              // this keepalive is answered; the revoke lands right after it
              if (revokeAfterKeepAlive) revoked = true
              return ops.keepAlive(id)
            }),
          write: (key, value, id) =>
            revoked ? Effect.succeed({ _tag: "Missing" } as const) : ops.write(key, value, id),
          create: (key, value, id) =>
            revoked ? lost("Lease 5 NOT_FOUND: etcdserver: requested lease not found") : ops.create(key, value, id)
        }
        const { s, timing, step } = yield* reporter(agent, racing)
        yield* step("tick")
        assert.strictEqual(s.state, "registered")
        yield* TestClock.adjust(timing.heartbeatMs)
        revokeAfterKeepAlive = true
        const exit = yield* Effect.exit(step("tick"))
        assert.isTrue(Exit.isFailure(exit))
        assert.include(String(Exit.isFailure(exit) ? exit.cause : ""), "etcd reports the lease expired or revoked")
        assert.deepStrictEqual(
          warnings.filter((w) => w.includes("deleted outside the agent")),
          []
        )
      }).pipe(Effect.provide(Layer.mergeAll(nodeStatusTest({ state: "ready" }), warningsInto(warnings))))
    }
  )

  // The takeover of a dead predecessor's key (leaseRecord.ts), over the scripted etcd: the order of the calls and
  // what the conflict says when the revoke fails.
  describe("the lease the previous agent recorded in agent.state_dir", () => {
    const PREVIOUS = "4111120487276619526"
    // the holder advertises this node's address: the conflict a dead predecessor leaves, which says why not revoked
    const ADDRESS = "10.0.0.5:7071"
    const here = nodeStatusTest({ state: "ready", advertiseAddr: ADDRESS })
    /** The scripted etcd with the node key held by `holderLease` until it is revoked; every call in `calls`. */
    const heldBy = (holderLease: string, revokeFails = false) => {
      const { ops } = scriptedEtcd()
      const calls: Array<string> = []
      let held = true
      const traced: EtcdOps = {
        ...ops,
        grant: (ttl) => Effect.tap(ops.grant(ttl), (g) => Effect.sync(() => calls.push(`grant ${g.id}`))),
        create: (key, value, id) =>
          Effect.suspend(() => {
            calls.push(`create ${id}`)
            return held
              ? Effect.succeed({
                  _tag: "Held",
                  holder: { lease: holderLease, value: JSON.stringify({ advertiseAddr: ADDRESS }) }
                } as const)
              : ops.create(key, value, id)
          }),
        revoke: (id) =>
          Effect.suspend(() => {
            calls.push(`revoke ${id}`)
            if (revokeFails)
              return Effect.fail(new EtcdUnavailable({ operation: "revoke", reason: "deadline exceeded" }))
            if (id === holderLease) held = false
            return Effect.void
          })
      }
      const record: LeaseRecord = {
        previous: PREVIOUS,
        write: (id) => Effect.sync(() => calls.push(`record ${id}`)),
        remove: Effect.void,
        notRevoked: "the record names another lease"
      }
      return { ops: traced, calls, record }
    }

    // A key created under a lease the record does not name yet would be a key the next agent cannot take over,
    // were this agent killed between the two: the record is written first.
    it.effect(
      "its lease is revoked and the key created in the same round, the new lease recorded before any create",
      () =>
        Effect.gen(function* () {
          const { ops, calls, record } = heldBy(PREVIOUS)
          const { s, step } = yield* reporter(registrationAgent("1s", "10s"), ops, record)
          yield* step("tick")
          assert.strictEqual(s.state, "registered")
          assert.deepStrictEqual(calls, [
            "grant 7587869035283627011",
            "record 7587869035283627011",
            "create 7587869035283627011",
            `revoke ${PREVIOUS}`,
            "create 7587869035283627011"
          ])
        }).pipe(Effect.provide(here))
    )

    it.effect(
      "a revoke that fails leaves the conflict, saying that the revoke failed and why (not what the record names)",
      () =>
        Effect.gen(function* () {
          const { ops, calls, record } = heldBy(PREVIOUS, true)
          const { step } = yield* reporter(registrationAgent("1s", "10s"), ops, record)
          const exit = yield* Effect.exit(step("tick"))
          assert.isTrue(Exit.isFailure(exit))
          const cause = String(Exit.isFailure(exit) ? exit.cause : "")
          assert.include(cause, "and this is that lease, but its revoke failed (")
          assert.include(cause, "deadline exceeded")
          assert.notInclude(cause, "the record names another lease")
          assert.deepStrictEqual(
            calls.filter((c) => c.startsWith("revoke")),
            [`revoke ${PREVIOUS}`]
          )
        }).pipe(Effect.provide(here))
    )

    it.effect("a holder's lease the record does not name is not revoked, the record's words in the conflict", () =>
      Effect.gen(function* () {
        const { ops, calls, record } = heldBy("7000000000000000001")
        const { step } = yield* reporter(registrationAgent("1s", "10s"), ops, record)
        const exit = yield* Effect.exit(step("tick"))
        assert.isTrue(Exit.isFailure(exit))
        assert.include(String(Exit.isFailure(exit) ? exit.cause : ""), "the record names another lease")
        assert.deepStrictEqual(
          calls.filter((c) => c.startsWith("revoke")),
          []
        )
      }).pipe(Effect.provide(here))
    )
  })
})
