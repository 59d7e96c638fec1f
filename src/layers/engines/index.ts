/**
 * The engine registry: one backend per `[engine].kind`. The only place that maps a kind to its module,
 * so no `if (kind === ...)` is needed anywhere else.
 */
import { Effect, Layer } from "effect"
import { Config, type EngineKind } from "../../services/Config.ts"
import { type Engine, EnginePlan } from "../../services/Engine.ts"
import { llamaCpp } from "./llama_cpp.ts"
import { mlx } from "./mlx.ts"
import { openaiCompat } from "./openai_compat.ts"
import { sglang } from "./sglang.ts"
import { vllm } from "./vllm.ts"

const engines: Readonly<Record<EngineKind, Engine>> = {
  vllm,
  sglang,
  llama_cpp: llamaCpp,
  mlx,
  openai_compat: openaiCompat
}

/** The backend for a kind. */
export const engineFor = (kind: EngineKind): Engine => engines[kind]

/** The plan of the configured engine (the config was validated against its capabilities, so rendering succeeds). */
export const planLayer: Layer.Layer<EnginePlan, never, Config> = Layer.effect(
  EnginePlan,
  Effect.map(Config, (config) => engineFor(config.engine.kind).render(config))
)
