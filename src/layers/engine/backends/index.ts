/**
 * The engine registry: one backend per `[engine].kind`. The only place that maps a kind to its module,
 * so no `if (kind === ...)` is needed anywhere else. Pure data and render functions: the plan with the host's GPUs
 * is layers/engine/EnginePlan.ts's.
 */
import type { EngineKind, ProxiedKind } from "../../../services/config/Config.ts"
import type { Engine, LaunchPlan } from "../../../services/engine/Engine.ts"
import { withEngineKey } from "./engineKey.ts"
import { llamaCpp } from "./llama_cpp.ts"
import { mlx } from "./mlx.ts"
import { openaiCompat, proxying } from "./openai_compat.ts"
import { sglang } from "./sglang.ts"
import { vllm } from "./vllm.ts"

/** A backend whose every plan carries engine.api_key as its capabilities say (engineKey.ts). */
const keyed = (engine: Engine): Engine => ({
  ...engine,
  render: (config, host) => withEngineKey(engine.render(config, host), engine.capabilities, config.engine.api_key)
})

/** openai_compat before a server of a known kind (`engine.proxied_kind`): that engine's wire capabilities. */
const proxied: Readonly<Record<ProxiedKind, Engine>> = {
  vllm: keyed(proxying(vllm)),
  sglang: keyed(proxying(sglang)),
  llama_cpp: keyed(proxying(llamaCpp)),
  mlx: keyed(proxying(mlx))
}

const compat = keyed(openaiCompat)

const engines: Readonly<Record<EngineKind, Engine>> = {
  vllm: keyed(vllm),
  sglang: keyed(sglang),
  llama_cpp: keyed(llamaCpp),
  mlx: keyed(mlx),
  // The plan follows the config's proxied_kind whoever renders it (its /metrics series are the proxied engine's):
  // a render through `engineFor(kind)` alone cannot miss them.
  openai_compat: {
    ...compat,
    render: (config, host) =>
      (config.engine.proxied_kind === undefined ? compat : proxied[config.engine.proxied_kind]).render(config, host)
  }
}

/**
 * The backend for a kind; for openai_compat with `proxiedKind` (`engine.proxied_kind`, LaunchPlan.proxiedKind), the
 * one that speaks as that engine does. A caller holding the config or the plan asks engineOf or engineOfPlan below.
 */
export const engineFor = (kind: EngineKind, proxiedKind?: ProxiedKind): Engine =>
  kind === "openai_compat" && proxiedKind !== undefined ? proxied[proxiedKind] : engines[kind]

/** What names a config's engine backend: `engine.kind`, and `engine.proxied_kind` for openai_compat. */
export interface EngineNaming {
  readonly engine: { readonly kind: EngineKind; readonly proxied_kind?: ProxiedKind | undefined }
}

/**
 * The backend of a config's engine, its proxied kind included: what every caller holding the config asks, so none
 * can forget `proxied_kind` (engineFor's second argument) where the answer depends on how the server speaks.
 */
export const engineOf = (config: EngineNaming): Engine => engineFor(config.engine.kind, config.engine.proxied_kind)

/** The backend a plan was rendered by (LaunchPlan.kind and proxiedKind): as engineOf for the plan's holders. */
export const engineOfPlan = (plan: Pick<LaunchPlan, "kind" | "proxiedKind">): Engine =>
  engineFor(plan.kind, plan.proxiedKind)
