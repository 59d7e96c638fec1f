// The HealthReporter's round (layers/registry/registrationStep.ts) over a scripted etcd, on a TestClock, driven as
// the reporter drives it (a step per tick; a failed step moves to "retrying"): how often the record is rewritten,
// and what the registration state says while etcd is down.
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Layer, Logger, Result } from "effect"
import { TestClock } from "effect/testing"
import { NodeHealth } from "../../src/gen/cgn/agent/v1/agent.ts"
import { decodeConfigObject } from "../../src/layers/config/Config.ts"
import type { EtcdOps } from "../../src/layers/registry/etcdClient.ts"
import { makeRegistrationStep } from "../../src/layers/registry/registrationStep.ts"
import { initialReporterState } from "../../src/layers/registry/reporterState.ts"
import { NodeStatus } from "../../src/services/node/NodeStatus.ts"
import { EtcdUnavailable, LeaseLost } from "../../src/services/registry/HealthReporter.ts"
import { reporterTiming } from "../../src/services/registry/ReporterTiming.ts"
import { layerTest as nodeStatusTest } from "../../src/testing/NodeStatus.ts"

const agentOf = (heartbeat: string, leaseTtl: string) => {
  const decoded = decodeConfigObject(
    {
      cluster: { name: "c1", etcd: ["http://127.0.0.1:1"] },
      agent: { node_id: "n1", heartbeat, lease_ttl: leaseTtl },
      models: { m: { hf_repo: "org/m" } }
    },
    undefined,
    {}
  )
  if (Result.isFailure(decoded)) throw new Error(decoded.failure.message)
  return decoded.success.agent
}

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
const reporter = (agent: ReturnType<typeof agentOf>, ops: EtcdOps) =>
  Effect.gen(function* () {
    const nodeStatus = yield* NodeStatus
    const s = initialReporterState()
    const timing = reporterTiming(agent.heartbeat, agent.lease_ttl)
    const { step, setState } = makeRegistrationStep({ s, ops, key: "/cgn/c1/nodes/n1", timing, agent, nodeStatus })
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
      const agent = agentOf(heartbeat, leaseTtl)
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

  // "'revoked' and 'retrying' stay visible until the registration succeeds": an etcd that stays unreachable reads
  // retrying throughout, with one warning, not registering/retrying at every retry.
  it.effect("an unreachable etcd: the state stays retrying until etcd answers, one warning for it", () => {
    const warnings: Array<string> = []
    return Effect.gen(function* () {
      const agent = agentOf("1s", "10s")
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
        const agent = agentOf("1s", "10s")
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
})
