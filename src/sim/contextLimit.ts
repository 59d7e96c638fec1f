// The 400 a request too long for the model's context gets from vLLM, SGLang and mlx-lm, in each engine's words
// (pure). llama.cpp's own check (exceed_context_size_error) lives with its request reading (request.ts).
import type { Flavor } from "./simConfig.ts"

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

/**
 * SGLang's TokenizerManager._validate_one_request (sgl-project/sglang python/sglang/srt/managers/
 * tokenizer_manager.py): the input must be shorter than the context, and input plus max_new_tokens too (`>=`
 * refuses); a ValueError the OpenAI layer answers 400 BadRequestError with no param (serving_chat.py,
 * serving_completions.py: `except ValueError as e: return self.create_error_response(str(e))`). The words as a
 * 2026 SGLang answered: `{"object":"error","message":"The input (43028 tokens) is longer than the model's context
 * length (40960 tokens).","type":"BadRequestError","param":null,"code":400}`.
 */
const sglang = (limit: number, input: number, maxTokens: number | undefined): ContextRefusal | undefined => {
  if (input >= limit)
    return {
      message: `The input (${input} tokens) is longer than the model's context length (${limit} tokens).`,
      param: null
    }
  if (maxTokens !== undefined && input + maxTokens >= limit)
    return {
      message: `Requested token count exceeds the model's maximum context length of ${limit} tokens. You requested a total of ${input + maxTokens} tokens: ${input} tokens from the input messages and ${maxTokens} tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit.`,
      param: null
    }
  return undefined
}

/**
 * The refusal of `input` prompt tokens plus `maxTokens` (undefined: the request named none), or undefined. `limit`:
 * the command line's; without one vLLM and SGLang hold a request to the model's context (SIM_MODEL_CONTEXT).
 */
export const contextRefusal = (
  flavor: Flavor,
  limit: number | undefined,
  input: number,
  maxTokens: number | undefined,
  legacy: boolean
): ContextRefusal | undefined => {
  if (flavor === "vllm") return vllm(limit ?? SIM_MODEL_CONTEXT, input, maxTokens, legacy)
  if (flavor === "sglang") return sglang(limit ?? SIM_MODEL_CONTEXT, input, maxTokens)
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
