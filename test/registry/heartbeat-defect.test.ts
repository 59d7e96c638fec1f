/**
 * The etcd heartbeat (src/layers/registry/HealthReporter.ts) meeting a defect in one round (here the node's record
 * cannot be built: a bug in NodeStatus.snapshot), against a real etcd (test/support/etcd.ts). The round's failure
 * handling takes etcd's errors only, so a defect ended the loop's fiber with nothing said: no record written again,
 * the lease left to expire, /status still `registered`. Now the defect is one error line naming the heartbeat, and the
 * loop runs again with the reporter's backoff: the record keeps being written, its sequence growing.
 */
import { Effect, Layer, Logger, ManagedRuntime } from "effect"
import "nice-grpc"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { layerFromObject } from "../../src/layers/config/Config.ts"
import { layer as healthReporterLayer } from "../../src/layers/registry/HealthReporter.ts"
import { NodeStatus } from "../../src/services/node/NodeStatus.ts"
import { HealthReporter } from "../../src/services/registry/HealthReporter.ts"
import { layerTest as nodeStatusTest } from "../../src/testing/NodeStatus.ts"
import { type EtcdHandle, pollUntil, startEtcd } from "../support/etcd.ts"

let etcd: EtcdHandle

beforeAll(async () => {
  etcd = await startEtcd()
}, 30_000)

afterAll(async () => {
  await etcd?.dispose()
})

describe("the etcd heartbeat, a defect in a round", () => {
  it("is said once at error level, and the heartbeat goes on writing the record", async () => {
    // the test NodeStatus, whose snapshot dies once when armed
    const defect = { armed: false, fired: 0 }
    const status = Layer.effect(
      NodeStatus,
      Effect.map(NodeStatus, (s) =>
        NodeStatus.of({
          ...s,
          snapshot: Effect.suspend(() => {
            if (!defect.armed) return s.snapshot
            defect.armed = false
            defect.fired++
            return Effect.die(new TypeError("Cannot read properties of undefined (reading 'phase')"))
          })
        })
      )
    ).pipe(Layer.provide(nodeStatusTest({ nodeId: "n1", cluster: "c1", advertiseAddr: "127.0.0.1:7071" })))
    const errors: Array<string> = []
    const logger = Logger.make(({ logLevel, message }) => {
      if (logLevel === "Error")
        errors.push(
          [message]
            .flat()
            .filter((m) => typeof m === "string")
            .join(" ")
        )
    })
    const config = layerFromObject({
      cluster: { name: "c1", etcd: [etcd.endpoint], etcd_prefix: `/cgn-defect-${process.pid}` },
      agent: { node_id: "n1", heartbeat: "200ms", lease_ttl: "2s" },
      models: { m: { hf_repo: "org/m" } }
    })
    const runtime = ManagedRuntime.make(
      healthReporterLayer.pipe(
        Layer.provideMerge(Layer.mergeAll(config, status)),
        Layer.provide(Logger.layer([logger]))
      )
    )
    try {
      const reporterStatus = () => runtime.runPromise(Effect.flatMap(HealthReporter, (r) => r.status))
      await pollUntil("registered", async () => (await reporterStatus()).state === "registered")

      defect.armed = true
      await pollUntil("the defect said", () => errors.length > 0)
      expect(defect.fired).toBe(1)
      expect(errors).toHaveLength(1)
      expect(errors[0]).toMatch(
        /^the etcd heartbeat stopped on a defect of the agent's: the node's record in etcd is no longer written nor its lease kept alive; restarting it in \d+ ms$/
      )

      // the record is written again, heartbeat after heartbeat, under the same lease
      const after = await reporterStatus()
      await pollUntil(
        "three more writes after the defect",
        async () => (await reporterStatus()).writes >= after.writes + 3
      )
      const later = await reporterStatus()
      expect(later.state).toBe("registered")
      expect(later.epoch).toBe(after.epoch)
      expect(later.sequence).toBeGreaterThan(after.sequence)
      expect(errors).toHaveLength(1)
    } finally {
      await runtime.dispose()
    }
  }, 30_000)
})
