/**
 * The engine's launch plan on this host: the backend's render (backends/index.ts) with the engine's GPUs, from
 * `models.x.gpus` or NVML's list, as `run` starts it (planLayer) and as `check` and `render` show it (resolvePlan).
 */
import * as os from "node:os"
import { Context, Effect, Layer, Option } from "effect"
import type { Gpu } from "../../gen/cgn/agent/v1/agent.ts"
import { type AgentConfig, Config, ConfigError } from "../../services/config/Config.ts"
import { formatPath } from "../../services/config/SchemaProblems.ts"
import { EnginePlan, type LaunchPlan, type RenderHost } from "../../services/engine/Engine.ts"
import { hostOfAddr } from "../../services/net/HostPort.ts"
import { assignGpus, cudaEnv } from "../../services/node/Gpus.ts"
import { Nvml } from "../../services/node/Nvml.ts"
import { xidRuleOf } from "../../services/node/Xid.ts"
import { type AdvertiseError, advertiseAddrOf } from "../../services/registry/Advertise.ts"
import * as NvmlLive from "../node/Nvml.ts"
import * as Logging from "../observability/Logging.ts"
import { engineOf } from "./backends/index.ts"

/** What an automatic choice that took faulty GPUs (`faults`: theirs), too few being healthy, says (at start, or later). */
export const fillInWarning = (model: string, faults: ReadonlyArray<string>): string =>
  `${formatPath(["models", model, "gpus"])}: too few healthy GPUs; the automatic choice takes faulty ones (${faults.join("; ")}): the engine is held, the node unhealthy, until they clear`

/**
 * The plan with the engine's GPUs: `models.x.gpus`, or the first tp x dp healthy GPUs of `gpus` (NVML's list,
 * empty without NVML), faulty ones filling in when too few are healthy (said in the plan's warnings), given as
 * CUDA_VISIBLE_DEVICES. Fails when the host cannot hold the engine. With no GPUs from NVML the automatic choice is
 * left to the GPU gate, which makes it before the first spawn once NVML lists GPUs (layers/engine/GpuGate.ts).
 */
export const planFor = (
  config: AgentConfig,
  gpus: ReadonlyArray<Gpu>,
  host?: RenderHost
): Effect.Effect<LaunchPlan, ConfigError> => {
  const engine = engineOf(config)
  const plan = engine.render(config, host)
  if (engine.capabilities.cudaGpus !== true) return Effect.succeed(plan)
  const m = config.model
  // the same Xid rule as the gate's (GpuGate.ts): a GPU given to the engine is one the gate lets it start on
  const xidRule = xidRuleOf(config.engine)
  const assignment = assignGpus(m.gpus, m.tp * m.dp, gpus, xidRule)
  if (assignment._tag === "Impossible") {
    return Effect.fail(
      new ConfigError({
        file: config.file ?? "<inline>",
        problems: [`${formatPath(["models", m.name, "gpus"])}: ${assignment.reason}`]
      })
    )
  }
  const faulty = assignment._tag === "Assigned" ? (assignment.faults ?? []) : []
  return Effect.succeed({
    ...plan,
    // [engine].env stays last: an operator can still override CUDA_DEVICE_ORDER
    env: { ...cudaEnv(m.gpus, assignment), ...plan.env },
    ...(faulty.length === 0
      ? {}
      : {
          warnings: [...(plan.warnings ?? []), fillInWarning(m.name, faulty)]
        }),
    ...(assignment._tag === "Assigned" ? { gpus: assignment.indices } : {})
  })
}

/**
 * The plan as `check` and `render` see it: GPUs from NVML when this host has it (no metrics, no daemon), read by
 * the NVML worker thread at `nvmlWorker` (programs/programPaths.ts) as in the daemon, with the Xids the daemon kept
 * for this boot in state_dir (read only), so that an automatic assignment skips the GPUs the daemon would.
 */
export const resolvePlan = (
  config: AgentConfig,
  nvmlWorker: string
): Effect.Effect<LaunchPlan, ConfigError | AdvertiseError> =>
  planLayer.pipe(
    Layer.provideMerge(NvmlLive.layerBare(nvmlWorker, { stateDir: config.agent.state_dir, readOnly: true })),
    Layer.provide(Layer.succeed(Config, config)),
    Layer.build,
    // GPUs the config names that NVML could not check (no library, no driver): a warning of the plan's (check and
    // render print them as `warning:` lines), not passed over as checked
    Effect.flatMap((context) => {
      const plan = Context.get(context, EnginePlan)
      if (config.model.gpus.length === 0) return Effect.succeed(plan)
      return Effect.map(Context.get(context, Nvml).unavailable, (why) =>
        why === undefined
          ? plan
          : {
              ...plan,
              warnings: [
                ...(plan.warnings ?? []),
                `${formatPath(["models", config.model.name, "gpus"])} not checked against this host's GPUs: NVML is not available (${why})`
              ]
            }
      )
    }),
    Effect.scoped,
    // stdout is the command's output (render --json): NVML's problems go to stderr, its info stays out, whatever
    // CGN_LOG_LEVEL says (a `kubectl exec ... check` inherits the daemon's: its info lines were mixed into the output)
    Effect.provide(Logging.layer("warn", "Warn"))
  )

/**
 * The plan of the configured engine (the config was validated against its capabilities, so rendering
 * succeeds); GPUs from NVML when an Nvml service is in context.
 */
export const planLayer: Layer.Layer<EnginePlan, ConfigError | AdvertiseError, Config> = Layer.effect(
  EnginePlan,
  Effect.gen(function* () {
    const config = yield* Config
    const nvml = yield* Effect.serviceOption(Nvml)
    const gpus = Option.isSome(nvml) ? yield* nvml.value.gpus : []
    // the interfaces are listed only for a wildcard listen host (Advertise.ts)
    const advertised = yield* advertiseAddrOf(
      {
        advertiseAddr: config.agent.advertise_addr,
        listenGrpc: config.agent.listen_grpc,
        nodeIp: config.agent.node_ip
      },
      os.networkInterfaces
    )
    return yield* planFor(config, gpus, { advertiseHost: hostOfAddr(advertised) })
  })
)
