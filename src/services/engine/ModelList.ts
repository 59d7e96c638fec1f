/**
 * What a 200 from an engine's `/v1/models` can still say about readiness. Newer llama-server builds let `/models` and
 * `/v1/models` through while the model loads (every other endpoint answers 503 "Loading model"), listing the model
 * with `"meta": null` until it is loaded (ggml-org/llama.cpp tools/server/server-http.cpp `middleware_server_state`;
 * the bundled build answers 503 there too): a readiness probe taking that 200 as ready turns a proxied llama-server Ready
 * while every call still gets 503. A card with no `meta` key at all (vLLM, SGLang, a gateway) says nothing of it.
 * Pure: the probe (layers/engine/probe.ts) reads the answer.
 */
import { isJsonObject } from "./EngineClient.ts"

/** The most of a model list's answer the probe reads; a longer one is taken at its 200. */
export const MODEL_LIST_READ_BYTES = 1024 * 1024

/** Whether a model list (parsed JSON) lists a model as still loading: a card whose `meta` is null. */
export const modelStillLoading = (body: unknown): boolean => {
  const data = isJsonObject(body) ? body.data : undefined
  return Array.isArray(data) && data.some((card) => isJsonObject(card) && card.meta === null)
}
