/**
 * ServedContext: the context one request can use, as the engine itself says (a backend's
 * `capabilities.servedContext`), read once per Ready period (layers/engine/ServedContext.ts). The configured
 * `models.<name>.max_model_len` is what the engine was told; what a request gets can be less: llama-server gives each
 * of its `-np` slots `-c / -np`. ListModels reports the limit and Generate checks `max_tokens` against it, so a
 * router that sizes calls by ListModels is not refused or cut short by the engine.
 */
import { Context } from "effect"
import type { ServedContextSource } from "./Engine.ts"
import { isJsonObject } from "./EngineClient.ts"
import { cardOf, modelCards } from "./ModelList.ts"

export interface ServedContextService {
  /**
   * What the engine last said, in tokens; undefined before it has said, or when its answer held no usable value. A
   * plain read of a stored value: Generate calls it on every call.
   */
  readonly current: () => number | undefined
}

export class ServedContext extends Context.Service<ServedContext, ServedContextService>()("cgn-agent/ServedContext") {}

/**
 * The most ModelInfo.max_model_len (a proto uint32) carries. A larger figure is no context any model has: taken, it
 * made every ListModels fail INTERNAL "invalid uint32" (a hostile engine's 4294967296000); it is read as no usable
 * value, and the configured one stays in force.
 */
const MAX_CONTEXT = 0xffff_ffff

const positive = (v: unknown): number | undefined =>
  typeof v === "number" && Number.isInteger(v) && v > 0 && v <= MAX_CONTEXT ? v : undefined

const at = (entry: Record<string, unknown>, path: ReadonlyArray<string>): unknown => {
  let v: unknown = entry
  for (const key of path) v = isJsonObject(v) ? v[key] : undefined
  return v
}

/**
 * The per-request context in a model list (`body`, parsed JSON) as `source` locates it, for the model the engine
 * lists as `model`; a string saying why there is none (the debug log's words) otherwise. The entry is the one whose
 * `id` is `model`, else the list's only entry: a server listing several others (a gateway) names none of them ours.
 */
export const servedContextOf = (body: unknown, source: ServedContextSource, model: string): number | string => {
  const entries = modelCards(body)
  if (entries === undefined) return `no "data" list in the answer of ${source.path}`
  const entry = cardOf(entries, model)
  if (entry === undefined) return `no entry with id "${model}" among ${entries.length} in ${source.path}`
  for (const path of source.fields) {
    const n = positive(at(entry, path))
    if (n !== undefined) return n
  }
  return `no positive integer at ${source.fields.map((f) => f.join(".")).join(" or ")} in ${source.path} (at most 2^32-1)`
}

/**
 * The context one request can use on this node: the smaller of the configured and the engine's values, whichever are
 * known (undefined: neither is). `engine` says whether the engine's value is the one that binds (a refusal names it).
 */
export const requestContext = (
  configured: number | undefined,
  served: number | undefined
): { readonly tokens: number; readonly engine: boolean } | undefined => {
  if (served === undefined) return configured === undefined ? undefined : { tokens: configured, engine: false }
  if (configured !== undefined && configured <= served) return { tokens: configured, engine: false }
  return { tokens: served, engine: true }
}
