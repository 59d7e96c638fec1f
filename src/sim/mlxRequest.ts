// mlx-lm's request checks (pure). mlx_lm/server.py `APIHandler.do_POST` reads each field with its default, then
// `validate_model_parameters` raises a bare ValueError for the first bad one; nothing in the handler catches it, so
// ThreadingHTTPServer prints the traceback and closes the connection: the client gets no HTTP response at all. A
// body without `messages` (chat) or `prompt` (completions) ends the same way, at the handlers' asserts.
// (ml-explore/mlx-lm mlx_lm/server.py, validate_model_parameters, handle_chat_completions, handle_text_completions.)
import type { Endpoint } from "./chunks.ts"

const isInt = (v: unknown): v is number => typeof v === "number" && Number.isInteger(v)
const isNumber = (v: unknown): v is number => typeof v === "number"

/** The ValueError mlx-lm raises for `body`, in its order of checks; undefined when it takes the request. */
export const mlxRefusal = (endpoint: Endpoint, b: Record<string, unknown>): string | undefined => {
  const stream = b.stream ?? false
  if (typeof stream !== "boolean") return "stream must be a boolean"
  const maxTokens = b.max_completion_tokens ?? b.max_tokens ?? 0
  if (!isInt(maxTokens) || maxTokens < 0) return "max_tokens must be a non-negative integer"
  const temperature = b.temperature ?? 0
  if (!isNumber(temperature) || temperature < 0) return "temperature must be a non-negative float"
  const topP = b.top_p ?? 1
  if (!isNumber(topP) || topP < 0 || topP > 1) return "top_p must be a float between 0 and 1"
  const topK = b.top_k ?? 0
  if (!isInt(topK) || topK < 0) return "top_k must be a non-negative integer"
  const minP = b.min_p ?? 0
  if (!isNumber(minP) || minP < 0 || minP > 1) return "min_p must be a float between 0 and 1"
  const draft = b.num_draft_tokens ?? 0
  if (!isInt(draft) || draft < 0) return "num_draft_tokens must be a non-negative integer"
  const repetition = b.repetition_penalty ?? 0
  if (!isNumber(repetition) || repetition < 0) return "repetition_penalty must be a non-negative float"
  const logprobs = b.logprobs ?? false
  if (typeof logprobs !== "boolean") return "logprobs must be a boolean"
  const topLogprobs = b.top_logprobs ?? -1
  if (topLogprobs !== -1 && !(isNumber(topLogprobs) && topLogprobs > 0 && topLogprobs <= 10))
    return `top_logprobs must be between 1 and 10 but got ${String(topLogprobs)}`
  const context = b.repetition_context_size ?? 20
  if (!isInt(context) || context < 0) return "repetition_context_size must be a non-negative integer"
  const bias = b.logit_bias ?? null
  if (bias !== null) {
    if (typeof bias !== "object" || Array.isArray(bias)) return "logit_bias must be a dict of int to float"
    if (Object.keys(bias).some((k) => !/^\s*[-+]?\d+\s*$/.test(k))) return "logit_bias must be a dict of int to float"
  }
  // mlx-lm wants a Python float here (an integer-valued JSON number fails); JSON.parse cannot tell them apart
  const xtcP = b.xtc_probability ?? 0
  if (!(isNumber(xtcP) && xtcP >= 0 && xtcP <= 1)) return "xtc_probability must be a float between 0.00 and 1.00"
  const xtcT = b.xtc_threshold ?? 0
  if (!(isNumber(xtcT) && xtcT >= 0 && xtcT <= 0.5)) return "xtc_threshold must be a float between 0.00 and 0.5"
  if (typeof (b.model ?? "default_model") !== "string") return "model must be a string"
  const adapter = b.adapters ?? null
  if (adapter !== null && typeof adapter !== "string") return "adapter must be a string"
  const seed = b.seed ?? null
  if (seed !== null && !isInt(seed)) return "seed must be an integer"
  if (endpoint === "chat" && !("messages" in b)) return "Chat completions requires 'messages' (AssertionError)"
  if (endpoint === "completion" && !("prompt" in b)) return "Text completions requires 'prompt' (AssertionError)"
  return undefined
}
