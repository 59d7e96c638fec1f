// The 400 a request too long for the model's context gets from vLLM, SGLang and mlx-lm, in each engine's words
// (pure). llama.cpp's own check (exceed_context_size_error) lives with its request reading (request.ts).
import type { Endpoint } from "./chunks.ts"
import type { Flavor, SimConfig } from "./simConfig.ts"

/**
 * The simulated model's own context, what vLLM and SGLang take without --max-model-len / --context-length: vLLM
 * derives max_model_len from the model's config (vllm/config/model.py ModelConfig, _get_and_verify_max_len), SGLang
 * its context_len likewise (python/sglang/srt/configs/model_config.py ModelConfig, get_context_length), and both
 * report it in /v1/models and hold every request to it.
 */
export const SIM_MODEL_CONTEXT = 4096

export interface ContextRefusal {
  readonly message: string
  readonly param: string | null
}

/**
 * vLLM >= 0.10.1's `_validate_input` (vllm-project/vllm OpenAIServing._validate_input): a prompt of the whole
 * context leaves no room for a token, whatever max_tokens says; else max_tokens must fit beside the prompt. Both
 * raise VLLMValidationError, whose str() appends `(parameter=..., value=...)` (vllm/exceptions.py) and whose
 * parameter create_error_response puts in `param`. Before 0.10.1 (`legacy`): one ValueError of the older words,
 * the first only without max_tokens, and no param.
 */
const vllm = (
  limit: number,
  input: number,
  maxTokens: number | undefined,
  legacy: boolean
): ContextRefusal | undefined => {
  if (legacy) {
    if (maxTokens === undefined && input >= limit)
      return {
        message: `This model's maximum context length is ${limit} tokens. However, you requested ${input} tokens in the messages, Please reduce the length of the messages.`,
        param: null
      }
    if (maxTokens !== undefined && input + maxTokens > limit)
      return {
        message: `This model's maximum context length is ${limit} tokens. However, you requested ${input + maxTokens} tokens (${input} in the messages, ${maxTokens} in the completion). Please reduce the length of the messages or completion.`,
        param: null
      }
    return undefined
  }
  if (input >= limit)
    return {
      message: `This model's maximum context length is ${limit} tokens. However, your request has ${input} input tokens. Please reduce the length of the input messages. (parameter=input_tokens, value=${input})`,
      param: "input_tokens"
    }
  if (maxTokens !== undefined && input + maxTokens > limit)
    return {
      message: `'max_tokens' or 'max_completion_tokens' is too large: ${maxTokens}. This model's maximum context length is ${limit} tokens and your request has ${input} input tokens (${maxTokens} > ${limit} - ${input}). (parameter=max_tokens, value=${maxTokens})`,
      param: "max_tokens"
    }
  return undefined
}

/** What a request keeps once its length is checked: its first `keep` prompt tokens, its max_tokens, lines to log. */
export interface ContextFit {
  readonly keep: number
  readonly maxTokens: number | undefined
  readonly warnings: ReadonlyArray<string>
}

/**
 * SGLang's TokenizerManager._validate_one_request (sgl-project/sglang python/sglang/srt/managers/
 * tokenizer_manager.py; num_reserved_tokens 0 without EAGLE speculative decoding): an input of the whole context or
 * more is refused, and so is input plus max_new_tokens past it (`>`, since sgl-project/sglang#22546: a request
 * filling the context exactly is served, as #33814 measured, --context-length 4096 with 16 new tokens serving an input
 * of 4080 and refusing 4081; before it `>=` refused that one too); a ValueError the OpenAI layer answers 400 BadRequestError with no
 * param (serving_chat.py, serving_completions.py: `except ValueError as e: return
 * self.create_error_response(str(e))`). The words as a 2026 SGLang answered: `{"object":"error","message":"The input
 * (43028 tokens) is longer than the model's context length (40960 tokens).","type":"BadRequestError","param":null,
 * "code":400}`.
 *
 * With --allow-auto-truncate (server_args.py, default off) neither is refused: a warning is logged and the input cut
 * to its first context-length tokens (`del input_ids[_max_req_len:]`, the end of the prompt dropped), then
 * max_new_tokens, still checked against what is left, cut to `max(0, context - input)` with a second warning. A
 * request that names no max_new_tokens (a chat without max_tokens) is not checked for it. What passes goes on to
 * the scheduler's own, stricter bound (sglangSchedulerBound.ts: an input of min(context, KV pool) - 6 tokens or more
 * cut again or aborted, max_new_tokens capped at what is left less 2).
 */
const sglang = (
  limit: number,
  input: number,
  maxTokens: number | undefined,
  autoTruncate: boolean
): ContextRefusal | ContextFit => {
  const warnings: Array<string> = []
  let n = input
  if (n >= limit) {
    const text = `The input (${n} tokens) is longer than the model's context length (${limit} tokens).`
    if (!autoTruncate) return { message: text, param: null }
    warnings.push(`${text} Truncating the input.`)
    n = limit
  }
  let max = maxTokens
  if (max !== undefined && n + max > limit) {
    if (!autoTruncate)
      return {
        message: `Requested token count exceeds the model's maximum context length of ${limit} tokens. You requested a total of ${n + max} tokens: ${n} tokens from the input messages and ${max} tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit.`,
        param: null
      }
    warnings.push(
      `Requested token count (${n} input + ${max} new) exceeds the model's context length (${limit} tokens). Truncating max_new_tokens.`
    )
    max = Math.max(0, limit - n)
  }
  return { keep: n, maxTokens: max, warnings }
}

const otherRefusal = (
  flavor: Flavor,
  limit: number | undefined,
  input: number,
  maxTokens: number | undefined,
  legacy: boolean
): ContextRefusal | undefined => {
  if (flavor === "vllm") return vllm(limit ?? SIM_MODEL_CONTEXT, input, maxTokens, legacy)
  if (limit === undefined) return undefined
  // mlx-lm checks no context length; a simulated limit keeps the generic words.
  if (maxTokens !== undefined && input + maxTokens > limit)
    return {
      message: `This model's maximum context length is ${limit} tokens. However, you requested ${input + maxTokens} tokens (${input} in the messages, ${maxTokens} in the completion). Please reduce the length of the messages or completion.`,
      param: null
    }
  if (maxTokens === undefined && input > limit)
    return {
      message: `This model's maximum context length is ${limit} tokens. However, you requested ${input} tokens in the messages, Please reduce the length of the messages.`,
      param: null
    }
  return undefined
}

/**
 * The refusal of `input` prompt tokens plus `maxTokens` (undefined: the request named none), or what the request
 * keeps (SGLang with --allow-auto-truncate: `autoTruncate`). `limit`: the command line's; without one vLLM and SGLang
 * hold a request to the model's context (SIM_MODEL_CONTEXT).
 */
export const contextFit = (
  flavor: Flavor,
  limit: number | undefined,
  input: number,
  maxTokens: number | undefined,
  legacy: boolean,
  autoTruncate = false
): ContextRefusal | ContextFit => {
  if (flavor === "sglang") return sglang(limit ?? SIM_MODEL_CONTEXT, input, maxTokens, autoTruncate)
  const refusal = otherRefusal(flavor, limit, input, maxTokens, legacy)
  return refusal ?? { keep: input, maxTokens, warnings: [] }
}

/** Where SGLang's scheduler starts a request that names no max_new_tokens: 1 << 30 (sglangSchedulerBound.ts caps it). */
export const SGLANG_UNNAMED_MAX_NEW_TOKENS = 2 ** 30

/**
 * The max_tokens of a request that names none, and whether the length checks see it as named. Completions: the
 * pydantic default, 16 on both vLLM and SGLang, which their context checks count as the request's own
 * (vllm-project/vllm vllm/entrypoints/openai/completion/protocol.py CompletionRequest.max_tokens = 16 and
 * build_tok_params' max_output_tokens; sgl-project/sglang python/sglang/srt/entrypoints/openai/protocol.py
 * CompletionRequest.max_tokens = 16). A vLLM chat: the rest of the context, max_model_len - input
 * (vllm/entrypoints/utils.py get_max_tokens, the min over the values set; the simulated model has no
 * generation_config default). An SGLang chat passes max_new_tokens None (protocol.py ChatCompletionRequest
 * to_sampling_params), which the scheduler starts from 1 << 30 (python/sglang/srt/managers/scheduler.py
 * init_req_max_new_tokens) and caps at the context's rest. mlx-lm: its --max-tokens. --sim-default-max-tokens,
 * where given, for every request.
 */
export const unnamedMaxTokens = (
  cfg: SimConfig,
  endpoint: Endpoint,
  input: number
): { readonly maxTokens: number; readonly checked: boolean } => {
  if (cfg.simDefaultMaxTokens !== undefined) return { maxTokens: cfg.simDefaultMaxTokens, checked: false }
  const uvicornEngine = cfg.flavor === "vllm" || cfg.flavor === "sglang"
  if (!uvicornEngine) return { maxTokens: cfg.defaultMaxTokens, checked: false }
  if (endpoint !== "chat") return { maxTokens: cfg.defaultMaxTokens, checked: true }
  if (cfg.flavor === "sglang") return { maxTokens: SGLANG_UNNAMED_MAX_NEW_TOKENS, checked: false }
  return { maxTokens: Math.max(0, (cfg.maxModelLen ?? SIM_MODEL_CONTEXT) - input), checked: false }
}
