// A registration round (layers/registry/registrationStep.ts) over a scripted etcd: the [agent] section it reads,
// decoded as the daemon decodes it (node n1 of cluster c1, an etcd that is never dialled, the heartbeat and lease TTL
// given), and the round itself.
import { Effect, Result } from "effect"
import { decodeConfigObject } from "../../src/layers/config/Config.ts"
import type { EtcdOps } from "../../src/layers/registry/etcdClient.ts"
import { makeRegistrationStep } from "../../src/layers/registry/registrationStep.ts"
import { initialReporterState } from "../../src/layers/registry/reporterState.ts"
import type { AgentConfig } from "../../src/services/config/Config.ts"
import { NodeStatus } from "../../src/services/node/NodeStatus.ts"
import { reporterTiming } from "../../src/services/registry/ReporterTiming.ts"

export const registrationAgent = (
  heartbeat: string,
  leaseTtl: string,
  more: Record<string, unknown> = {}
): AgentConfig["agent"] => {
  const decoded = decodeConfigObject(
    {
      cluster: { name: "c1", etcd: ["http://127.0.0.1:1"] },
      agent: { node_id: "n1", heartbeat, lease_ttl: leaseTtl, ...more },
      models: { m: { hf_repo: "org/m" } }
    },
    undefined,
    {}
  )
  if (Result.isFailure(decoded)) throw new Error(decoded.failure.message)
  return decoded.success.agent
}

/** One registration round (`step`) over `ops` for node n1, with its state and timing: what the reporter's loop runs. */
export const registrationStepOf = (ops: EtcdOps, heartbeat = "5s", leaseTtl = "15s") =>
  Effect.gen(function* () {
    const agent = registrationAgent(heartbeat, leaseTtl)
    const s = initialReporterState()
    const timing = reporterTiming(agent.heartbeat, agent.lease_ttl)
    const nodeStatus = yield* NodeStatus
    const { step } = makeRegistrationStep({ s, ops, key: "/cgn/c1/nodes/n1", timing, agent, nodeStatus })
    return { s, timing, step }
  })
