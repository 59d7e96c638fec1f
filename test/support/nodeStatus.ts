// What the live NodeStatus layer needs around it in a test: a test engine (EngineProcessControl sets its state),
// `client` as the engine client (its `load` is what the engine-load sampler scrapes), admission with 4 slots and a
// queue of 2, the drain lever, an in-memory cordon, `nvml` (no GPUs unless given), test metrics, over `config`;
// `plan`: the test engine's launch plan (testing/EngineProcess.ts testPlan unless given).
import { Layer } from "effect"
import * as AdmissionLayer from "../../src/layers/grpc/Admission.ts"
import type { Config } from "../../src/services/config/Config.ts"
import type { LaunchPlan } from "../../src/services/engine/Engine.ts"
import type { EngineClient } from "../../src/services/engine/EngineClient.ts"
import { Drain } from "../../src/services/node/Drain.ts"
import type { Nvml } from "../../src/services/node/Nvml.ts"
import * as CordonTest from "../../src/testing/Cordon.ts"
import { layerTest as engineLayerTest } from "../../src/testing/EngineProcess.ts"
import * as MetricsTest from "../../src/testing/Metrics.ts"
import * as NvmlTest from "../../src/testing/Nvml.ts"

export const nodeStatusDeps = <E>(
  config: Layer.Layer<Config, E>,
  client: Layer.Layer<EngineClient>,
  nvml: Layer.Layer<Nvml> = NvmlTest.layerFixed([]),
  plan?: LaunchPlan
) =>
  Layer.mergeAll(
    engineLayerTest(plan === undefined ? {} : { plan }),
    client,
    AdmissionLayer.layerWith({ maxInflight: 4, maxQueue: 2 }),
    Drain.layer,
    CordonTest.layerMemory,
    nvml,
    MetricsTest.layerTest
  ).pipe(Layer.provideMerge(config))
