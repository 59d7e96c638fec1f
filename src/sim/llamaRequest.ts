// How llama-server reads an OpenAI request body (pure), so the llama_cpp flavor refuses and accepts what the
// real server does (checked against it by test/real/sim-differential.test.ts). Sources, ggml-org/llama.cpp:
// tools/server/server-schema.cpp (every request field: its type, its limits, its aliases), tools/server/
// server-common.cpp (tokenize_input_prompts for `prompt`, oaicompat_chat_params_parse for `messages`),
// common/chat.cpp (common_chat_msgs_parse_oaicompat) and tools/server/server-context.cpp (the order of it all).
// Errors keep llama-server's wording, nlohmann::json's exception texts included.
import {
  chatFormat,
  chatParser,
  drySequenceBreakers,
  grammarField,
  grammarTriggers,
  type Handler,
  lora,
  preservedTokens,
  reasoningBudgetEndTags,
  reasoningFormat,
  samplers,
  stop,
  stringField,
  typeError
} from "./llamaFields.ts"
import { llamaGreedy } from "./llamaGreedy.ts"
import { type CppType, clampFloat, cppString, cppValue } from "./llamaNumbers.ts"
import { shownParams } from "./llamaSlotParams.ts"

export { typeError }

export interface LlamaInvalid {
  readonly status: number
  readonly message: string
}

/** One prompt: its words (the echo mode answers with them) and its tokens as the server counts them. */
export interface LlamaPrompt {
  readonly words: ReadonlyArray<string>
  readonly tokens: ReadonlyArray<string>
}

/** The BOS token's piece, which llama-server puts before a text (tokenize_mixed with add_special), not token ids. */
export const BOS = "<s>"

/** The token ids of a completion prompt: integers in it, or in its sub-prompts. */
export const promptIds = (prompt: unknown): Array<number> =>
  Array.isArray(prompt)
    ? prompt.flatMap((p: unknown) => (Number.isInteger(p) ? [p as number] : Array.isArray(p) ? promptIds(p) : []))
    : []

/** The fields of the schema that the simulator acts on. */
export interface LlamaParams {
  /** `n_predict` (aliases max_completion_tokens, max_tokens): -1 (the default) runs to the end of the context. */
  readonly nPredict: number
  /** `n_cmpl` (alias n): completions per prompt, 1..-np. */
  readonly nCmpl: number
  readonly stream: boolean
  readonly includeUsage: boolean
  readonly ignoreEos: boolean
  readonly seed: number | undefined
  readonly stop: ReadonlyArray<string>
  /** `sse_ping_interval` (seconds, -1 off) when the request sets it. */
  readonly ssePingInterval: number | undefined
  /** `n_probs` (alias logprobs): top tokens per generated token; 0 none. */
  readonly nProbs: number
  readonly postSamplingProbs: boolean
  /** `timings_per_token`: `timings` on every streamed chunk. */
  readonly timingsPerToken: boolean
  /** `grammar` when a non-empty string: parsed when a slot takes the task (grammarParses), not here. */
  readonly grammar: string | undefined
  /** The sampler chain keeps one candidate (llamaGreedy.ts): the same prompt, the same text. */
  readonly greedy: boolean
  /** The task's params beyond the defaults, as /slots shows them (llamaSlotParams.ts). */
  readonly shown: Readonly<Record<string, unknown>>
  /** `dry_sequence_breakers` when the request sets them (a `__verbose` answer's generation_settings shows them). */
  readonly dryBreakers: ReadonlyArray<string> | undefined
}

const I32 = 2147483647
const I64 = 2n ** 63n - 1n

interface Field {
  /** The field, then its aliases: the first one present (and not null) is read. */
  readonly names: ReadonlyArray<string>
  /** field_bool, field_num<type>, or a field read by a handler of its own (llamaFields.ts). */
  readonly kind: "bool" | "num" | "handler"
  /** A number's C++ type: how a JSON number converts to it, and how std::to_string prints it (llamaNumbers.ts). */
  readonly type?: CppType
  /** Hard limits (set_hard_limits): outside them the request is refused; other numbers are clamped or taken. */
  readonly hard?: readonly [number | bigint, number | bigint | "n_parallel"]
  /** set_limits: the value clamped to them (`std::max(min, std::min(max, v))`), never refused. */
  readonly soft?: readonly [number, number]
  readonly handler?: Handler
  /** The name its errors carry where not the field's own (a nested field's inner one). */
  readonly reports?: string
  /** A chat's oaicompat_chat_params_parse sets it from the chat template, so the request's own is never read. */
  readonly chatSets?: true
}

const bool = (name: string, chatSets = false): Field => ({
  names: [name],
  kind: "bool",
  ...(chatSets ? { chatSets } : {})
})
const num = (names: ReadonlyArray<string>, type: CppType, hard?: Field["hard"]): Field => ({
  names,
  kind: "num",
  type,
  ...(hard === undefined ? {} : { hard })
})
const handled = (names: ReadonlyArray<string>, handler: Handler, chatSets = false): Field => ({
  names,
  kind: "handler",
  handler,
  ...(chatSets ? { chatSets } : {})
})
const floats = (...names: ReadonlyArray<string>) => names.map((n) => num([n], "float"))
/** A field_num with set_limits (server-schema.cpp): clamped, the float limits as floats. */
const clamped = (name: string, type: CppType, soft: readonly [number, number]): Field => ({
  ...num([name], type),
  soft
})
const FLT_MAX = 3.4028234663852886e38

/**
 * make_llama_cmpl_schema's fields in its order (the first bad one is the one reported), each number with its
 * C++ type (task_params, common_params_sampling). Left out: fields whose handlers refuse nothing (response_fields,
 * continue_final_message, reasoning_budget_message, logit_bias: json_value or lenient parsing).
 */
const fields = (chat: boolean): ReadonlyArray<Field> => [
  bool("verbose"),
  bool("timings_per_token"),
  bool("stream"),
  // stream_options is a nested field (field_nested): only an object is looked into
  { ...handled(["stream_options"], includeUsage), reports: "include_usage" },
  bool("cache_prompt"),
  bool("return_tokens"),
  bool("return_progress"),
  num(["sse_ping_interval"], "int32", [-1, I32]),
  num(["n_predict", "max_completion_tokens", "max_tokens"], "int32", [-1, I32]),
  num(["n_indent"], "int32", [0, I32]),
  num(["n_keep"], "int32", [-1, I32]),
  num(["n_discard"], "int32", [0, I32]),
  num(["n_cmpl", "n"], "int32", [1, "n_parallel"]),
  num(["n_cache_reuse"], "int32", [0, I32]),
  num(["t_max_predict_ms"], "int64", [-1n, I64]),
  clamped("top_k", "int32", [0, I32]),
  clamped("top_p", "float", [0, 1]),
  clamped("min_p", "float", [0, 1]),
  ...floats("top_n_sigma"),
  clamped("xtc_probability", "float", [0, 1]),
  clamped("xtc_threshold", "float", [0, 1]),
  ...floats("typical_p"),
  clamped("temperature", "float", [0, Number.POSITIVE_INFINITY]),
  ...floats("dynatemp_range", "dynatemp_exponent"),
  num(["repeat_last_n"], "int32", [0, I32]),
  ...floats("repeat_penalty", "frequency_penalty", "presence_penalty", "dry_multiplier", "dry_base"),
  num(["dry_allowed_length"], "int32", [0, I32]),
  num(["dry_penalty_last_n"], "int32", [0, I32]),
  clamped("mirostat", "int32", [0, 2]),
  ...floats("mirostat_tau", "mirostat_eta"),
  clamped("adaptive_target", "float", [-FLT_MAX, 1]),
  num(["adaptive_decay"], "float", [0, Math.fround(0.99)]),
  num(["seed"], "uint32"),
  num(["n_probs", "logprobs"], "int32"),
  num(["min_keep"], "int32", [0, I32]),
  bool("backend_sampling"),
  bool("post_sampling_probs"),
  handled(["lora"], lora),
  handled(["dry_sequence_breakers"], drySequenceBreakers),
  handled(["json_schema", "grammar"], grammarField(chat)),
  bool("grammar_lazy", true),
  handled(["chat_format"], chatFormat, true),
  handled(["reasoning_format"], reasoningFormat),
  handled(["generation_prompt"], stringField, true),
  bool("parse_tool_calls"),
  handled(["chat_parser"], chatParser, true),
  bool("echo"),
  handled(["preserved_tokens"], preservedTokens, true),
  handled(["grammar_triggers"], grammarTriggers, true),
  bool("reasoning_control"),
  num(["reasoning_budget_tokens"], "int32", [-1, I32]),
  handled(["reasoning_budget_start_tag"], stringField),
  handled(["reasoning_budget_end_tags", "reasoning_budget_end_tag"], reasoningBudgetEndTags),
  bool("ignore_eos"),
  handled(["stop"], stop),
  handled(["samplers"], samplers)
]

/** A null counts as absent ("clients can send null to request the server default", server-schema.cpp has_value). */
const present = (b: Record<string, unknown>, n: string): boolean => n in b && b[n] !== null

/** stream_options.include_usage, a field_bool inside the nested field: its errors name the inner field. */
const includeUsage: Handler = (b, _, values) => {
  const so = b.stream_options
  if (typeof so !== "object" || so === null || Array.isArray(so)) return undefined
  const iu = (so as Record<string, unknown>).include_usage
  if (iu === undefined || iu === null) return undefined
  if (typeof iu !== "boolean") return typeError("boolean", iu)
  values.set("include_usage", iu)
  return undefined
}

/** A number field: its value as the C++ type reads it, or the hard limit's refusal in std::to_string's words. */
const numberField = (f: Field, v: number | boolean, nParallel: number): number | bigint | string => {
  const type = f.type ?? "int32"
  const x = cppValue(v, type)
  if (f.soft !== undefined) return Math.max(f.soft[0], Math.min(f.soft[1], x as number))
  if (f.hard === undefined) return type === "float" ? clampFloat(x as number) : x
  const [min, maxSpec] = f.hard
  const max = maxSpec === "n_parallel" ? nParallel : maxSpec
  if (x >= min && x <= max) return x
  const range = `${cppString(min, type)} <= value <= ${cppString(max, type)}`
  return `Value must be between ${range}, but got ${cppString(x, type)}`
}

/**
 * common_sampler_init's checks, which fail the slot's launch as "Failed to initialize samplers: ..."
 * (common/sampling.cpp): penalty_repeat must be a positive float whose inverse is finite (a denormal's is not).
 * penalty_freq and penalty_present must be finite too, but field_num's limits clamp an infinity to FLT_MAX first.
 */
const samplerError = (values: Map<string, unknown>): string | undefined => {
  const p = (values.get("repeat_penalty") as number | undefined) ?? 1
  return p > 0 && Number.isFinite(Math.fround(1 / p)) ? undefined : "penalty_repeat must be finite and greater than 0"
}

/** Reads the schema's fields; a wrong type or a value past a hard limit is 400 `Field '<name>': ...`. */
export const llamaParams = (
  b: Record<string, unknown>,
  nParallel: number,
  chat = false
): LlamaParams | LlamaInvalid => {
  const values = new Map<string, unknown>()
  for (const f of fields(chat)) {
    if (chat && f.chatSets === true) continue
    const name = f.names.find((n) => present(b, n))
    if (name === undefined) continue
    const v = b[name]
    const bad = (text: string): LlamaInvalid => ({ status: 400, message: `Field '${f.reports ?? name}': ${text}` })
    if (f.kind === "handler") {
      const error = f.handler?.(b, name, values)
      if (error !== undefined) return bad(error)
      continue
    }
    if (f.kind === "bool") {
      if (typeof v !== "boolean") return bad(typeError("boolean", v))
      values.set(f.names[0] ?? name, v)
      continue
    }
    if (typeof v !== "number" && typeof v !== "boolean") return bad(typeError("number", v))
    const x = numberField(f, v, nParallel)
    if (typeof x === "string") return bad(x)
    values.set(f.names[0] ?? name, x)
  }
  const sampler = samplerError(values)
  // the real server finds this as a slot takes the task, after a prompt's bad token ids and before its length against
  // the context: request.ts (validateLlama) holds this refusal back by its prefix to answer in that order
  if (sampler !== undefined) return { status: 400, message: `Failed to initialize samplers: ${sampler}` }
  const seed = values.get("seed")
  return {
    nPredict: (values.get("n_predict") as number | undefined) ?? -1,
    nCmpl: (values.get("n_cmpl") as number | undefined) ?? 1,
    stream: values.get("stream") === true,
    includeUsage: values.get("include_usage") === true,
    ignoreEos: values.get("ignore_eos") === true,
    seed: typeof seed === "number" ? seed : undefined,
    stop: (values.get("stop") as Array<string> | undefined) ?? [],
    ssePingInterval: values.get("sse_ping_interval") as number | undefined,
    // kept as sent, as /slots shows it (-1 is -1 there); one not above 0 asks for no probabilities
    nProbs: (values.get("n_probs") as number | undefined) ?? 0,
    postSamplingProbs: values.get("post_sampling_probs") === true,
    timingsPerToken: values.get("timings_per_token") === true,
    grammar: values.get("grammar") as string | undefined,
    greedy: llamaGreedy(values, b),
    shown: shownParams(values, b, values.get("stream") === true),
    // the handler took it: a non-empty array of strings
    dryBreakers: present(b, "dry_sequence_breakers") ? (b.dry_sequence_breakers as Array<string>) : undefined
  }
}
