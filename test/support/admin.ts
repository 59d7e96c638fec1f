/**
 * The live admin server on an ephemeral loopback port over test services (metrics, node status, drain, cordon in
 * memory, no GPUs, the test supervisor), for the admin route tests; `close` releases it.
 */
import { Context, Effect, Exit, Layer, Logger, Scope } from "effect"
import * as AdminLive from "../../src/layers/admin/Admin.ts"
import * as ConfigLayer from "../../src/layers/config/Config.ts"
import { AdminServer } from "../../src/services/admin/Admin.ts"
import type { EngineProcess } from "../../src/services/engine/EngineProcess.ts"
import { Drain } from "../../src/services/node/Drain.ts"
import type { Nvml } from "../../src/services/node/Nvml.ts"
import * as CordonTest from "../../src/testing/Cordon.ts"
import * as EngineTest from "../../src/testing/EngineProcess.ts"
import * as MetricsTest from "../../src/testing/Metrics.ts"
import * as NodeStatusLayer from "../../src/testing/NodeStatus.ts"
import * as NvmlTest from "../../src/testing/Nvml.ts"

export const startAdmin = async <E = never>(
  options: {
    /** [agent] keys over `listen_admin = "127.0.0.1:0"`. */
    readonly agent?: Record<string, unknown>
    readonly nvml?: Layer.Layer<Nvml>
    readonly engine?: Layer.Layer<EngineProcess | E>
    /** Where its log lines go ("<level> <message>"); none: the default logger. */
    readonly logs?: Array<string>
  } = {}
) => {
  const config = ConfigLayer.layerFromObject({
    models: { m: { hf_repo: "org/m" } },
    agent: { listen_admin: "127.0.0.1:0", ...options.agent }
  })
  const deps = Layer.mergeAll(
    MetricsTest.layerTest,
    NodeStatusLayer.layerTest({ nodeId: "node-a" }),
    Drain.layer,
    options.nvml ?? NvmlTest.layerFixed([]),
    CordonTest.layerMemory,
    options.engine ?? EngineTest.layerTest()
  ).pipe(Layer.provideMerge(config))
  const scope = await Effect.runPromise(Scope.make())
  const logs = options.logs
  const logger = Logger.make(({ logLevel, message }) =>
    logs?.push(
      `${logLevel} ${[message]
        .flat()
        .map((m) => (typeof m === "string" ? m : JSON.stringify(m)))
        .join(" ")}`
    )
  )
  const app = AdminLive.layer().pipe(
    Layer.provideMerge(deps),
    Layer.provide(logs === undefined ? Layer.empty : Logger.layer([logger]))
  )
  const ctx = await Effect.runPromise(Layer.buildWithScope(app, scope))
  return {
    ctx,
    url: Context.get(ctx, AdminServer).url,
    close: () => Effect.runPromise(Scope.close(scope, Exit.void))
  }
}
