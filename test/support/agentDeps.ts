// What an in-process gRPC server needs in front of a real engine (a simulator): the config, the live
// EngineClient on a plan for that URL, and EngineProcess / NodeStatus test layers set Ready. Shared by
// the gRPC, P/D and mTLS tests; each composes its own server (admission, TLS) on top.
import { Layer } from "effect"
import { layerFromObject } from "../../src/layers/config/Config.ts"
import { layerFromPlan } from "../../src/layers/engine/EngineClient.ts"
import type { EngineKind } from "../../src/services/config/Config.ts"
import { State } from "../../src/services/engine/EngineState.ts"
import { layerTest as engineLayerTest, testPlan } from "../../src/testing/EngineProcess.ts"
import { layerTest as nodeStatusLayerTest } from "../../src/testing/NodeStatus.ts"

export interface AgentDepsOptions {
  readonly kind?: EngineKind
  /** Keys of [agent] (node_id defaults to "node-1"). */
  readonly agent?: Record<string, unknown>
  /** Keys of [engine] beyond kind and url. */
  readonly engine?: Record<string, unknown>
}

/** The config layer alone (to provide to layers that read it, e.g. Admission) and all the dependencies. */
export const agentDeps = (engineUrl: string, options: AgentDepsOptions = {}) => {
  const kind = options.kind ?? "vllm"
  const port = Number(new URL(engineUrl).port)
  const plan = testPlan({ kind, baseUrl: engineUrl, port, servedModel: "m", requestModel: "m" })
  const config = layerFromObject({
    agent: { node_id: "node-1", ...options.agent },
    engine: { kind, url: engineUrl, ...options.engine },
    models: { m: { hf_repo: "org/m" } }
  })
  const deps = Layer.mergeAll(
    config,
    layerFromPlan(plan),
    engineLayerTest({ plan, initial: State.Ready({ since: Date.now(), run: 0 }) }),
    nodeStatusLayerTest({ state: "ready" })
  )
  return { config, deps }
}
