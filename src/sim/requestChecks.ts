// Per-flavor refusals of an OpenAI request's fields (pure), beside the prompt and length checks of request.ts: what
// vLLM's and SGLang's request models and sampling parameters refuse with 400, and what mlx-lm answers with no
// response at all.

import type { Endpoint } from "./chunks.ts"
import { vllmValidationError } from "./errors.ts"
import { mlxRefusal } from "./mlxRequest.ts"
import { pyFloat } from "./pyWords.ts"
import type { SimConfig } from "./simConfig.ts"
import { vllmLogprobsRefusal } from "./upstreamRefusals.ts"

export type Invalid = {
  readonly status: number
  readonly message: string
  readonly param: string | null
  /** A flavor's whole error body when it is not the flavor's usual shape (errors.ts). */
  readonly body?: unknown
  /** mlx-lm: the request raised in its handler, and the connection is closed with no HTTP response. */
  readonly drop?: true
  /** SGLang: its scheduler aborted the request (faultReply.ts schedulerAbort): a stream's answer is 200 SSE. */
  readonly schedulerAbort?: { readonly stream: boolean }
}

/** Python's truthiness of a JSON value, as the engines' validators test `data.get(...)`. */
const truthy = (v: unknown): boolean => {
  if (v === undefined || v === null || v === false || v === 0 || v === "") return false
  if (Array.isArray(v)) return v.length > 0
  if (typeof v === "object") return Object.keys(v).length > 0
  return true
}

const STREAM_OPTIONS_TEXT = "Stream options can only be defined when `stream=True`."

/**
 * vLLM's completion and chat request models refuse `stream_options` (when truthy) unless `stream` is
 * (validate_stream_options in vllm-project/vllm vllm/entrypoints/openai/completion/protocol.py and
 * vllm/entrypoints/openai/chat_completion/protocol.py). It is a `mode="before"` model validator, so it answers
 * before any field is checked. SGLang's models have no such validator and ignore the options
 * (sgl-project/sglang python/sglang/srt/entrypoints/openai/protocol.py); neither does llama-server or mlx-lm.
 */
const streamOptionsWithoutStream = (cfg: SimConfig, b: Record<string, unknown>): Invalid | undefined => {
  if (cfg.flavor !== "vllm" || !truthy(b.stream_options) || truthy(b.stream)) return undefined
  const body = vllmValidationError(STREAM_OPTIONS_TEXT, "stream_options", Object.keys(b).length)
  return { status: 400, message: STREAM_OPTIONS_TEXT, param: "stream_options", body }
}

const CACHE_SALT_TEXT = "Parameter 'cache_salt' must be a non-empty string if provided."

/**
 * vLLM's completion and chat request models refuse a `cache_salt` that is set (not null) but is not a non-empty
 * string (check_cache_salt_support in vllm-project/vllm vllm/entrypoints/openai/completion/protocol.py and
 * chat_completion/protocol.py: `data.get("cache_salt") is not None and (not isinstance(data["cache_salt"], str) or
 * not data["cache_salt"])` raises VLLMValidationError(..., parameter="cache_salt")). A `mode="before"` model
 * validator too, so it answers before any field is checked; serving such a request unsalted would share the
 * prefix cache the client asked to keep apart. SGLang drops an empty salt (serving_base.py _compute_extra_key).
 */
const cacheSaltRefusal = (cfg: SimConfig, b: Record<string, unknown>): Invalid | undefined => {
  const salt = b.cache_salt
  if (cfg.flavor !== "vllm" || salt === undefined || salt === null || (typeof salt === "string" && salt !== ""))
    return undefined
  const body = vllmValidationError(CACHE_SALT_TEXT, "cache_salt", Object.keys(b).length)
  return { status: 400, message: CACHE_SALT_TEXT, param: "cache_salt", body }
}

const INT64_MAX = 2n ** 63n - 1n
const INT64_MIN = -(2n ** 63n)

/**
 * vLLM bounds `seed` to torch.long: `seed: int | None = Field(None, ge=_LONG_INFO.min, le=_LONG_INFO.max)` on its
 * completion and chat request models (vllm-project/vllm vllm/entrypoints/openai/protocol.py), so pydantic refuses a
 * larger one, answered 400 as vLLM answers every validation error. Read from the raw body: JSON.parse rounds it.
 */
const seedOutOfRange = (cfg: SimConfig, rawBody: string): Invalid | undefined => {
  if (cfg.flavor !== "vllm") return undefined
  const m = /"seed"\s*:\s*(-?\d+)\s*[,}]/.exec(rawBody)
  if (m === null) return undefined
  const seed = BigInt(m[1] ?? "0")
  if (seed >= INT64_MIN && seed <= INT64_MAX) return undefined
  const [bound, limit] = seed > INT64_MAX ? ["less", INT64_MAX] : ["greater", INT64_MIN]
  return { status: 400, message: `seed: Input should be ${bound} than or equal to ${limit}`, param: "seed" }
}

/**
 * What a flavor refuses before it reads the prompt: vLLM's model validators and seed bound; mlx-lm's
 * `validate_model_parameters`, which runs before anything else in its handler (mlxRequest.ts).
 */
export const earlyRefusal = (
  cfg: SimConfig,
  endpoint: Endpoint,
  b: Record<string, unknown>,
  rawBody: string
): Invalid | undefined => {
  if (cfg.flavor === "mlx") {
    const raised = mlxRefusal(endpoint, b)
    return raised === undefined ? undefined : { status: 0, message: raised, param: null, drop: true }
  }
  // check_logprobs is defined between the two (pydantic runs `before` model validators last-defined first)
  const logprobs = cfg.flavor === "vllm" ? vllmLogprobsRefusal(endpoint, b) : undefined
  return streamOptionsWithoutStream(cfg, b) ?? logprobs ?? cacheSaltRefusal(cfg, b) ?? seedOutOfRange(cfg, rawBody)
}

/** A number field, or its default when absent or null (the engines' `x if x is not None else default`). */
const num = (b: Record<string, unknown>, key: string, fallback: number): number => {
  const v = b[key]
  return typeof v === "number" ? v : fallback
}

const refused = (message: string, param: string | null = null): Invalid => ({ status: 400, message, param })

/**
 * vLLM's SamplingParams._verify_args, in its order (vllm-project/vllm vllm/sampling_params.py; VLLMValidationError,
 * answered 400). Defaults as SamplingParams.from_optional's. The float fields are Python floats by then (pydantic's
 * `float` takes a JSON 3 as 3.0), written as Python writes them; temperature's and top_p's errors name the parameter
 * and value, which str() appends to the message (vllm/exceptions.py VLLMValidationError.__str__) and
 * create_error_response puts in `param` (vllm/entrypoints/serve/exception_handling/error_response.py).
 */
const vllmSampling = (b: Record<string, unknown>): Invalid | undefined => {
  const named = (text: string, param: string, value: number): Invalid =>
    refused(`${text} (parameter=${param}, value=${pyFloat(value)})`, param)
  const presence = num(b, "presence_penalty", 0)
  if (!(presence >= -2 && presence <= 2))
    return refused(`presence_penalty must be in [-2, 2], got ${pyFloat(presence)}.`)
  const frequency = num(b, "frequency_penalty", 0)
  if (!(frequency >= -2 && frequency <= 2))
    return refused(`frequency_penalty must be in [-2, 2], got ${pyFloat(frequency)}.`)
  const repetition = num(b, "repetition_penalty", 1)
  if (repetition <= 0) return refused(`repetition_penalty must be greater than zero, got ${pyFloat(repetition)}.`)
  const temperature = num(b, "temperature", 1)
  const t = pyFloat(temperature)
  if (temperature < 0) return named(`temperature must be non-negative, got ${t}.`, "temperature", temperature)
  if (temperature > 2) return named(`temperature must be in [0, 2], got ${t}.`, "temperature", temperature)
  const topP = num(b, "top_p", 1)
  if (!(topP > 0 && topP <= 1)) return named(`top_p must be in (0, 1], got ${pyFloat(topP)}.`, "top_p", topP)
  const topK = num(b, "top_k", 0)
  if (topK < -1) return refused(`top_k must be 0 (disable), or at least 1, got ${topK}.`)
  const minP = num(b, "min_p", 0)
  if (!(minP >= 0 && minP <= 1)) return refused(`min_p must be in [0, 1], got ${pyFloat(minP)}.`)
  return undefined
}

/**
 * SGLang's SamplingParams.verify, in its order, after __post_init__ has made a temperature below 1e-6 greedy (top_k
 * 1) and -1 the whole vocabulary (sgl-project/sglang python/sglang/srt/sampling/sampling_params.py); a ValueError
 * there is answered 400. Its float fields are Python floats (the request model's `float`), written as Python does.
 */
const sglangSampling = (b: Record<string, unknown>): Invalid | undefined => {
  const temperature = num(b, "temperature", 1)
  if (temperature < 0) return refused(`temperature must be a non-negative finite number, got ${pyFloat(temperature)}.`)
  const topP = num(b, "top_p", 1)
  if (!(topP > 0 && topP <= 1)) return refused(`top_p must be in (0, 1], got ${pyFloat(topP)}.`)
  const minP = num(b, "min_p", 0)
  if (!(minP >= 0 && minP <= 1)) return refused(`min_p must be in [0, 1], got ${pyFloat(minP)}.`)
  const rawTopK = num(b, "top_k", -1)
  const topK = temperature < 1e-6 ? 1 : rawTopK === -1 ? 1 << 30 : rawTopK
  if (topK < 1) return refused(`top_k must be -1 (disable) or at least 1, got ${topK}.`)
  const frequency = num(b, "frequency_penalty", 0)
  if (!(frequency >= -2 && frequency <= 2))
    return refused(`frequency_penalty must be in [-2, 2], got ${pyFloat(frequency)}.`)
  const presence = num(b, "presence_penalty", 0)
  if (!(presence >= -2 && presence <= 2))
    return refused(`presence_penalty must be in [-2, 2], got ${pyFloat(presence)}.`)
  const repetition = num(b, "repetition_penalty", 1)
  if (!(repetition > 0 && repetition <= 2))
    return refused(`repetition_penalty must be in (0, 2] (1.0 = no penalty), got ${pyFloat(repetition)}.`)
  return undefined
}

/** The engine's sampling-parameter checks, which run once the prompt has passed its length check. */
export const samplingRefusal = (cfg: SimConfig, b: Record<string, unknown>): Invalid | undefined =>
  cfg.flavor === "vllm" ? vllmSampling(b) : cfg.flavor === "sglang" ? sglangSampling(b) : undefined

/**
 * Whether the request samples greedily, so that the same prompt gives the same text: vLLM below its _SAMPLING_EPS
 * 1e-5 (vllm-project/vllm vllm/sampling_params.py, SamplingParams.sampling_type GREEDY; default 1.0); SGLang below
 * its 1e-6, which __post_init__ turns into top_k 1 (sgl-project/sglang python/sglang/srt/sampling/sampling_params.py;
 * default 1.0); mlx-lm at 0, its argmax (ml-explore/mlx-lm mlx_lm/sample_utils.py make_sampler; the server's default
 * --temp is 0.0). In each, top_k 1 keeps the top token alone: the same choice.
 */
export const greedySampling = (cfg: SimConfig, b: Record<string, unknown>): boolean => {
  const eps = cfg.flavor === "vllm" ? 1e-5 : cfg.flavor === "sglang" ? 1e-6 : Number.MIN_VALUE
  return num(b, "temperature", cfg.flavor === "mlx" ? 0 : 1) < eps || num(b, "top_k", 0) === 1
}
