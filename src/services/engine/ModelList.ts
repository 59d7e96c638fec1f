/**
 * An engine's `/v1/models` answer: the card of the model the agent serves, and what a 200 can still say about
 * readiness. Newer llama-server builds let `/models` and `/v1/models` through while the model loads (every other
 * endpoint answers 503 "Loading model"), listing the model with `"meta": null` until it is loaded
 * (ggml-org/llama.cpp tools/server/server-http.cpp `middleware_server_state`; the bundled build answers 503 there
 * too): a readiness probe taking that 200 as ready turns a proxied llama-server Ready while every call still gets
 * 503. Only the served model's card counts: a gateway may list others, loading or not, and a card with no `meta`
 * key at all (vLLM, SGLang) says nothing of it. Pure: the probe (layers/engine/probe.ts) and ServedContext read the
 * answer.
 */
import { isJsonObject } from "./EngineClient.ts"

/** The most of a model list's answer the probe reads; a longer one is taken at its 200. */
export const MODEL_LIST_READ_BYTES = 1024 * 1024

/** The list's cards (its `data` entries that are objects), or undefined when the answer has no `data` list. */
export const modelCards = (body: unknown): ReadonlyArray<Record<string, unknown>> | undefined => {
  const data = isJsonObject(body) ? body.data : undefined
  return Array.isArray(data) ? data.filter(isJsonObject) : undefined
}

/**
 * The card of `model`: the one whose `id` is `model`, else the list's only card (a server that names its model
 * otherwise); none when several others are listed (a gateway), which name none of them ours.
 */
export const cardOf = (
  cards: ReadonlyArray<Record<string, unknown>>,
  model: string
): Record<string, unknown> | undefined =>
  cards.find((c) => c.id === model) ?? (cards.length === 1 ? cards[0] : undefined)

/** Whether a model list (parsed JSON) lists `model` as still loading: its card's `meta` is null. */
export const modelStillLoading = (body: unknown, model: string): boolean => {
  const cards = modelCards(body)
  return cards !== undefined && cardOf(cards, model)?.meta === null
}
