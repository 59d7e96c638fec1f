/**
 * The engine registry: one backend per `[engine].kind`. The only place that maps a kind to its module,
 * so no `if (kind === ...)` is needed anywhere else. Pure data and render functions: the plan with the host's GPUs
 * is layers/engine/EnginePlan.ts's.
 */
import type { EngineKind } from "../../../services/config/Config.ts"
import type { Engine } from "../../../services/engine/Engine.ts"
import { withEngineKey } from "./engineKey.ts"
import { llamaCpp } from "./llama_cpp.ts"
import { mlx } from "./mlx.ts"
import { openaiCompat } from "./openai_compat.ts"
import { sglang } from "./sglang.ts"
import { vllm } from "./vllm.ts"

/** A backend whose every plan carries engine.api_key as its capabilities say (engineKey.ts). */
const keyed = (engine: Engine): Engine => ({
  ...engine,
  render: (config, host) => withEngineKey(engine.render(config, host), engine.capabilities, config.engine.api_key)
})

const engines: Readonly<Record<EngineKind, Engine>> = {
  vllm: keyed(vllm),
  sglang: keyed(sglang),
  llama_cpp: keyed(llamaCpp),
  mlx: keyed(mlx),
  openai_compat: keyed(openaiCompat)
}

/** The backend for a kind. */
export const engineFor = (kind: EngineKind): Engine => engines[kind]
