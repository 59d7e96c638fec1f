// Refusals of vLLM and SGLang read again from their sources (pure), beside requestChecks.ts: the 400 FastAPI's own
// body parsing gives (a body that is not JSON, an empty one, one that is not an object, a chat without messages) as
// each engine's RequestValidationError handler words it; SGLang's _validate_request checks, which run before
// anything else of a request; and the checks vLLM's SamplingParams makes once built (greedy with n > 1, logprobs
// beyond --max-logprobs) and the counts of logprobs its request models refuse below 0.
import type { Endpoint } from "./chunks.ts"
import { pyFloat, pyJsonError, pyRepr, pyStr } from "./pyWords.ts"
import type { Flavor, SimConfig } from "./simConfig.ts"
import { N_VOCAB } from "./tokens.ts"

/** One error of FastAPI's RequestValidationError (pydantic's shape): loc as the tuple pydantic gives. */
interface FieldError {
  readonly type: string
  readonly loc: ReadonlyArray<string | number>
  readonly msg: string
  readonly input: unknown
  /** ctx's values as Python prints them (a str's repr, an exception's). */
  readonly ctx?: Readonly<Record<string, string>>
}

const ctxText = (ctx: FieldError["ctx"]): string =>
  ctx === undefined
    ? ""
    : `, 'ctx': {${Object.entries(ctx)
        .map(([k, v]) => `${pyStr(k)}: ${v}`)
        .join(", ")}}`

/**
 * vLLM's summary of an error's input (vllm-project/vllm vllm/entrypoints/serve/exception_handling/handlers/
 * validation.py _summarize_error_input): containers by their size, a long string cut at 200 characters, anything
 * else as str().
 */
const vllmInput = (v: unknown): string => {
  if (typeof v === "string") return v.length > 200 ? `${v.slice(0, 200)}...[truncated]` : v
  if (Array.isArray(v)) return `<list of ${v.length} items>`
  if (typeof v === "object" && v !== null) return `<dict of ${Object.keys(v).length} items>`
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : pyFloat(v)
  return pyRepr(v)
}

/**
 * vLLM's 400 for a RequestValidationError (validation.py validation_exception_handler): type "Bad Request", `param`
 * the error's loc joined with dots (or the parameter its VLLMValidationError names), the message
 * `1 validation error:` and the error as a dict with its input summarised and its loc joined (_format_error).
 */
const vllmBody = (e: FieldError, param?: string): unknown => {
  const loc = e.loc.join(".")
  const ctx = ctxText(e.ctx)
  const detail = `{'type': ${pyStr(e.type)}, 'loc': ${pyStr(loc)}, 'msg': ${pyStr(e.msg)}, 'input': ${pyStr(vllmInput(e.input))}${ctx}}`
  return { error: { message: `1 validation error:\n  ${detail}`, type: "Bad Request", param: param ?? loc, code: 400 } }
}

/**
 * SGLang's 400 for a RequestValidationError (sgl-project/sglang python/sglang/srt/entrypoints/http_server.py
 * validation_exception_handler): its flat ErrorResponse with type "Bad Request" and no param; the message is
 * str(exc.errors()), FastAPI's list of errors as Python prints it (loc a tuple, input as parsed).
 */
const sglangBody = (e: FieldError): unknown => {
  const loc = `(${e.loc.map((p) => (typeof p === "number" ? String(p) : pyStr(p))).join(", ")}${e.loc.length === 1 ? "," : ""})`
  const ctx = ctxText(e.ctx)
  const message = `[{'type': ${pyStr(e.type)}, 'loc': ${loc}, 'msg': ${pyStr(e.msg)}, 'input': ${pyRepr(e.input)}${ctx}}]`
  return { object: "error", message, type: "Bad Request", param: null, code: 400 }
}

export type BodyRefusal = { readonly status: 400; readonly message: string; readonly body: unknown }

const refusal = (flavor: "vllm" | "sglang", e: FieldError): BodyRefusal => ({
  status: 400,
  message: e.msg,
  body: flavor === "vllm" ? vllmBody(e) : sglangBody(e)
})

const MISSING_BODY: FieldError = { type: "missing", loc: ["body"], msg: "Field required", input: null }

/**
 * A body JSON.parse refused, as FastAPI answers it (fastapi/routing.py get_request_handler): an empty body is no
 * body at all, so the required model is `missing`; any other goes to json.loads, whose error FastAPI reports as
 * `json_invalid` at ('body', position) with json's own message in ctx. Undefined for flavors other than vLLM, SGLang.
 */
export const unparsedBody = (flavor: Flavor, raw: string): BodyRefusal | undefined => {
  if (flavor !== "vllm" && flavor !== "sglang") return undefined
  if (raw === "") return refusal(flavor, MISSING_BODY)
  // JSON.parse refuses a few texts json.loads takes (NaN, Infinity), not modelled: answered as a decode error at 0
  const { msg, pos } = pyJsonError(raw) ?? { msg: "Expecting value", pos: 0 }
  return refusal(flavor, {
    type: "json_invalid",
    loc: ["body", pos],
    msg: "JSON decode error",
    input: {},
    ctx: { error: pyStr(msg) }
  })
}

/**
 * A parsed body the request model cannot take: JSON null is no body (`missing`), anything else not an object
 * pydantic's `model_attributes_type`.
 */
export const notAnObject = (flavor: "vllm" | "sglang", body: unknown): BodyRefusal =>
  refusal(
    flavor,
    body === null
      ? MISSING_BODY
      : {
          type: "model_attributes_type",
          loc: ["body"],
          msg: "Input should be a valid dictionary or object to extract fields from",
          input: body
        }
  )

/**
 * A pydantic field validator's ValueError (`msg` "Value error, ..." and the exception in ctx): SGLang's
 * CompletionRequest.validate_max_tokens_positive refuses a max_tokens of 0 or less (sgl-project/sglang
 * python/sglang/srt/entrypoints/openai/protocol.py), before its handler runs.
 */
export const sglangFieldRefusal = (field: string, text: string, input: unknown): BodyRefusal =>
  refusal("sglang", {
    type: "value_error",
    loc: ["body", field],
    msg: `Value error, ${text}`,
    input,
    ctx: { error: `ValueError(${pyStr(text)})` }
  })

/** A chat body without `messages` (a required field of both engines' ChatCompletionRequest). */
export const missingMessages = (flavor: "vllm" | "sglang", b: Record<string, unknown>): BodyRefusal =>
  refusal(flavor, { type: "missing", loc: ["body", "messages"], msg: "Field required", input: b })

/** The roles SGLang's ChatCompletionMessageGenericParam takes, case-insensitively; "user" is its own model's. */
const SGLANG_GENERIC_ROLES = ["system", "assistant", "tool", "function", "developer", "latest_reminder"]

/**
 * A chat message whose role neither of SGLang's message models takes (sgl-project/sglang
 * python/sglang/srt/entrypoints/openai/protocol.py: ChatCompletionMessageParam is the union of
 * ChatCompletionMessageGenericParam, whose `_normalize_role` validator raises for a role outside its Literal, and
 * ChatCompletionMessageUserParam, Literal["user"]): pydantic reports both members' errors. vLLM takes any role
 * (CustomChatCompletionMessageParam, vllm/entrypoints/chat_utils.py) and leaves it to the chat template.
 */
export const sglangRoleRefusal = (b: Record<string, unknown>): BodyRefusal | undefined => {
  if (!Array.isArray(b.messages)) return undefined
  const i = b.messages.findIndex((m: unknown) => {
    const role = typeof m === "object" && m !== null ? (m as { role?: unknown }).role : undefined
    return typeof role === "string" && role !== "user" && !SGLANG_GENERIC_ROLES.includes(role.toLowerCase())
  })
  if (i < 0) return undefined
  const role = (b.messages[i] as { role: string }).role
  const text = `'role' must be one of ${SGLANG_GENERIC_ROLES.map(pyStr).join(", ")} (case-insensitive).`
  const at = (model: string) => `('body', 'messages', ${i}, '${model}', 'role')`
  const generic = `{'type': 'value_error', 'loc': ${at("ChatCompletionMessageGenericParam")}, 'msg': ${pyStr(`Value error, ${text}`)}, 'input': ${pyStr(role)}, 'ctx': {'error': ValueError(${pyStr(text)})}}`
  const user = `{'type': 'literal_error', 'loc': ${at("ChatCompletionMessageUserParam")}, 'msg': "Input should be 'user'", 'input': ${pyStr(role)}, 'ctx': {'expected': "'user'"}}`
  const message = `[${generic}, ${user}]`
  return { status: 400, message, body: { object: "error", message, type: "Bad Request", param: null, code: 400 } }
}

const blank = (s: string) => s.trim() === ""

/**
 * SGLang's `_validate_request`, which handle_request runs first and answers 400 BadRequestError with no param
 * (sgl-project/sglang python/sglang/srt/entrypoints/openai/serving_base.py handle_request). Chat
 * (serving_chat.py): an empty messages list; max_completion_tokens (or max_tokens) beyond --context-length, when the
 * server was given one (server_args.context_length). Completions (serving_completions.py): an empty prompt, one of
 * whitespace only, a list with such a string, negative token ids.
 */
export const sglangRequestRefusal = (
  cfg: SimConfig,
  endpoint: Endpoint,
  b: Record<string, unknown>
): string | undefined => {
  if (endpoint === "chat") {
    if (Array.isArray(b.messages) && b.messages.length === 0) return "Messages cannot be empty."
    const rawMax = b.max_completion_tokens || b.max_tokens
    const limit = cfg.maxModelLen
    if (typeof rawMax === "number" && limit !== undefined && rawMax > limit)
      // its two f-strings join with no space between them
      return `max_completion_tokens is too large: ${rawMax}.This model supports at most ${limit} completion tokens.`
    return undefined
  }
  const prompt = b.prompt
  if (prompt === "" || (Array.isArray(prompt) && prompt.length === 0)) return "Prompt cannot be None"
  if (typeof prompt === "string") return blank(prompt) ? "Prompt cannot be empty or whitespace only" : undefined
  if (!Array.isArray(prompt)) return undefined
  if (prompt.every((p) => typeof p === "string")) {
    const i = prompt.findIndex((p) => blank(p as string))
    return i < 0 ? undefined : `Prompt at index ${i} cannot be empty or whitespace only`
  }
  if (prompt.every((p) => typeof p === "number"))
    return prompt.some((p) => (p as number) < 0) ? "Token IDs must be non-negative" : undefined
  return undefined
}

/**
 * The counts of logprobs vLLM's request models refuse as they parse the body: check_logprobs, a `mode="before"` model
 * validator (vllm-project/vllm vllm/entrypoints/openai/completion/protocol.py, a completion's `logprobs`;
 * chat_completion/protocol.py, a chat's `top_logprobs`), takes 0 and up and -1 (the whole vocabulary, refused later
 * by vllmBuiltRefusal) and raises VLLMValidationError(parameter=..., value=...) for any other below 0. (Releases
 * before -1 was taken for a completion refused it too, as "`logprobs` must be a positive value.".) pydantic makes it
 * a value_error at loc ('body',) with the exception in ctx, whose `parameter` the handler makes the param
 * (vllm/entrypoints/serve/exception_handling/handlers/validation.py); its str() appends parameter and value
 * (vllm/exceptions.py).
 */
export const vllmLogprobsRefusal = (
  endpoint: Endpoint,
  b: Record<string, unknown>
): (BodyRefusal & { readonly param: string }) | undefined => {
  const field = endpoint === "completion" ? "logprobs" : "top_logprobs"
  const value = b[field]
  if (typeof value !== "number" || value >= 0 || value === -1) return undefined
  const text = `\`${field}\` must be a positive value or -1.`
  const e: FieldError = {
    type: "value_error",
    loc: ["body"],
    msg: `Value error, ${text} (parameter=${field}, value=${vllmInput(value)})`,
    input: b,
    ctx: { error: `VLLMValidationError(${pyStr(text)})` }
  }
  return { status: 400, message: text, body: vllmBody(e, field), param: field }
}

/** vLLM's --max-logprobs default (vllm-project/vllm vllm/config/model.py ModelConfig.max_logprobs). */
export const VLLM_MAX_LOGPROBS = 20

/**
 * What vLLM refuses once its SamplingParams is built (vllm-project/vllm vllm/sampling_params.py): __post_init__'s
 * greedy check (temperature below _SAMPLING_EPS with n > 1, a ValueError with no parameter), then verify's
 * _validate_logprobs (the sample logprobs asked for beyond max_logprobs: a completion's `logprobs`, a chat's
 * `top_logprobs` when `logprobs` is true, ChatCompletionRequest.to_sampling_params; -1 counts as the vocabulary's
 * size), whose VLLMValidationError names the parameter and value (str() appends them: vllm/exceptions.py).
 */
export const vllmBuiltRefusal = (
  endpoint: Endpoint,
  b: Record<string, unknown>
): { readonly message: string; readonly param: string | null } | undefined => {
  const n = typeof b.n === "number" ? b.n : 1
  const raw = typeof b.temperature === "number" ? b.temperature : 1
  // __post_init__ first raises a temperature in (0, _MAX_TEMP) to _MAX_TEMP (1e-2), against nan and inf in its
  // tensors: only 0 stays below _SAMPLING_EPS (1e-5) to be greedy (a negative one was refused by _verify_args)
  const temperature = raw > 0 && raw < 1e-2 ? 1e-2 : raw
  if (temperature < 1e-5 && n > 1) return { message: `n must be 1 when using greedy sampling, got ${n}.`, param: null }
  const count = endpoint === "completion" ? b.logprobs : b.logprobs === true ? b.top_logprobs : undefined
  // -1 is model_config.get_vocab_size(): the vLLM flavor reads no model file, so the simulator's own vocabulary,
  // N_VOCAB (tokens.ts), the size its token ids stay below
  const asked = count === -1 ? N_VOCAB : count
  if (typeof asked === "number" && asked > VLLM_MAX_LOGPROBS)
    return {
      message: `Requested sample logprobs of ${asked}, which is greater than max allowed: ${VLLM_MAX_LOGPROBS} (parameter=logprobs, value=${asked})`,
      param: "logprobs"
    }
  return undefined
}
