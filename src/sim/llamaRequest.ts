// How llama-server reads an OpenAI request body (pure), so the llama_cpp flavor refuses and accepts what the
// real server does (checked against it by test/real/sim-differential.test.ts). Sources, ggml-org/llama.cpp:
// tools/server/server-schema.cpp (every request field: its type, its limits, its aliases), tools/server/
// server-common.cpp (tokenize_input_prompts for `prompt`, oaicompat_chat_params_parse for `messages`),
// common/chat.cpp (common_chat_msgs_parse_oaicompat) and tools/server/server-context.cpp (the order of it all).
// Errors keep llama-server's wording, nlohmann::json's exception texts included.
import { jsonSchemaError } from "./llamaJsonSchema.ts"
import { words } from "./tokens.ts"

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

const asPrompt = (w: ReadonlyArray<string>, bos: boolean): LlamaPrompt => ({ words: w, tokens: bos ? [BOS, ...w] : w })

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
}

/** nlohmann::json's type_name(). */
const typeName = (v: unknown): string => {
  if (v === null) return "null"
  if (Array.isArray(v)) return "array"
  if (typeof v === "object") return "object"
  return typeof v === "string" ? "string" : typeof v === "boolean" ? "boolean" : "number"
}

export const typeError = (want: string, v: unknown): string =>
  `[json.exception.type_error.302] type must be ${want}, but is ${typeName(v)}`

const I32 = 2147483647
/** INT64_MAX as a double (2^63): no JSON number past it reaches the check as an integer anyway. */
const I64 = 2 ** 63

interface Field {
  /** The field, then its aliases: the first one present (and not null) is read. */
  readonly names: ReadonlyArray<string>
  /** "grammar": the json_schema field (alias grammar), whose handler reads both (llamaGrammarField). */
  readonly kind: "bool" | "num" | "grammar"
  /** Hard limits (set_hard_limits): outside them the request is refused; other numbers are clamped or taken. */
  readonly hard?: readonly [number, number | "n_parallel"]
  /** The C++ type's kind: integers are truncated (nlohmann's get<int> of 1.5 is 1), floats printed with %f. */
  readonly float?: boolean
}

const bool = (name: string): Field => ({ names: [name], kind: "bool" })
const num = (names: ReadonlyArray<string>, hard?: Field["hard"], float = false): Field => ({
  names,
  kind: "num",
  ...(hard === undefined ? {} : { hard }),
  float
})

/**
 * make_llama_cmpl_schema's typed fields in its order (the first bad one is the one reported). Fields read by
 * custom handlers that the simulator does not model (lora, grammar, logit_bias, ...) are left out; `stop`
 * and `stream_options` are read apart (llamaParams).
 */
const FIELDS: ReadonlyArray<Field> = [
  bool("verbose"),
  bool("timings_per_token"),
  bool("stream"),
  bool("cache_prompt"),
  bool("return_tokens"),
  bool("return_progress"),
  num(["sse_ping_interval"], [-1, I32]),
  num(["n_predict", "max_completion_tokens", "max_tokens"], [-1, I32]),
  num(["n_indent"], [0, I32]),
  num(["n_keep"], [-1, I32]),
  num(["n_discard"], [0, I32]),
  num(["n_cmpl", "n"], [1, "n_parallel"]),
  num(["n_cache_reuse"], [0, I32]),
  num(["t_max_predict_ms"], [-1, I64]),
  ...["top_k", "top_p", "min_p", "top_n_sigma", "xtc_probability", "xtc_threshold", "typical_p", "temperature"].map(
    (n) => num([n])
  ),
  num(["dynatemp_range"]),
  num(["dynatemp_exponent"]),
  num(["repeat_last_n"], [0, I32]),
  ...["repeat_penalty", "frequency_penalty", "presence_penalty", "dry_multiplier", "dry_base"].map((n) => num([n])),
  num(["dry_allowed_length"], [0, I32]),
  num(["dry_penalty_last_n"], [0, I32]),
  ...["mirostat", "mirostat_tau", "mirostat_eta", "adaptive_target"].map((n) => num([n])),
  num(["adaptive_decay"], [0, 0.99], true),
  num(["seed"]),
  num(["n_probs", "logprobs"]),
  num(["min_keep"], [0, I32]),
  bool("backend_sampling"),
  bool("post_sampling_probs"),
  { names: ["json_schema", "grammar"], kind: "grammar" },
  bool("grammar_lazy"),
  bool("parse_tool_calls"),
  bool("echo"),
  bool("reasoning_control"),
  num(["reasoning_budget_tokens"], [-1, I32]),
  bool("ignore_eos")
]

/** A null counts as absent ("clients can send null to request the server default", server-schema.cpp has_value). */
const present = (b: Record<string, unknown>, n: string): boolean => n in b && b[n] !== null

/** std::to_string of the limit or value: integers as such, floats with six decimals. */
const cpp = (v: number, float: boolean): string =>
  v === I64 ? "9223372036854775807" : float ? v.toFixed(6) : String(v)

/** A number field's value as the C++ type reads it: booleans are 0/1 to nlohmann, integers truncate. */
const numberValue = (v: unknown, float: boolean): number => {
  const n = typeof v === "boolean" ? Number(v) : (v as number)
  return float ? n : Math.trunc(n)
}

/** Reads the schema's fields; a wrong type or a value past a hard limit is 400 `Field '<name>': ...`. */
export const llamaParams = (
  b: Record<string, unknown>,
  nParallel: number,
  chat = false
): LlamaParams | LlamaInvalid => {
  const values = new Map<string, unknown>()
  for (const f of FIELDS) {
    const name = f.names.find((n) => present(b, n))
    if (name === undefined) continue
    const v = b[name]
    const bad = (text: string): LlamaInvalid => ({ status: 400, message: `Field '${name}': ${text}` })
    if (f.kind === "grammar") {
      const g = llamaGrammarField(b, chat)
      if (typeof g === "object") return bad(g.error)
      values.set("grammar", g)
      continue
    }
    if (f.kind === "bool") {
      if (typeof v !== "boolean") return bad(typeError("boolean", v))
      values.set(f.names[0] ?? name, v)
      continue
    }
    if (typeof v !== "number" && typeof v !== "boolean") return bad(typeError("number", v))
    const x = numberValue(v, f.float === true)
    if (f.hard !== undefined) {
      const [min, maxSpec] = f.hard
      const max = maxSpec === "n_parallel" ? nParallel : maxSpec
      if (x < min || x > max) {
        const range = `${cpp(min, f.float === true)} <= value <= ${cpp(max, f.float === true)}`
        return bad(`Value must be between ${range}, but got ${cpp(x, f.float === true)}`)
      }
    }
    values.set(f.names[0] ?? name, x)
  }
  // `stream_options` is a nested field: only an object is looked into (server-schema.cpp field_nested).
  let includeUsage = false
  const so = b.stream_options
  if (typeof so === "object" && so !== null && !Array.isArray(so)) {
    const iu = (so as Record<string, unknown>).include_usage
    if (iu !== undefined && iu !== null) {
      if (typeof iu !== "boolean") return { status: 400, message: `Field 'include_usage': ${typeError("boolean", iu)}` }
      includeUsage = iu
    }
  }
  const stop = stopStrings(b.stop)
  if (typeof stop === "string") return { status: 400, message: `Field 'stop': ${stop}` }
  const seed = values.get("seed")
  return {
    nPredict: (values.get("n_predict") as number | undefined) ?? -1,
    nCmpl: (values.get("n_cmpl") as number | undefined) ?? 1,
    stream: values.get("stream") === true,
    includeUsage,
    ignoreEos: values.get("ignore_eos") === true,
    seed: typeof seed === "number" ? seed >>> 0 : undefined,
    stop,
    ssePingInterval: values.get("sse_ping_interval") as number | undefined,
    // kept as sent, as /slots shows it (-1 is -1 there); one not above 0 asks for no probabilities
    nProbs: (values.get("n_probs") as number | undefined) ?? 0,
    postSamplingProbs: values.get("post_sampling_probs") === true,
    timingsPerToken: values.get("timings_per_token") === true,
    grammar: values.get("grammar") as string | undefined
  }
}

/**
 * The json_schema field's handler (server-schema.cpp make_llama_cmpl_schema): a `json_schema` with no `grammar` key
 * (even a null one) is converted to a grammar, its failure `"json_schema": <the converter's error>`; else `grammar`
 * when a non-empty string (json_value: another type is ignored, with a warning in the log). A chat request's
 * json_schema is converted earlier, by its chat template's code (common/chat.cpp, in words of its own): not modelled.
 */
const llamaGrammarField = (b: Record<string, unknown>, chat: boolean): string | undefined | { error: string } => {
  if ("json_schema" in b && !("grammar" in b)) {
    const error = chat ? undefined : jsonSchemaError(b.json_schema)
    return error === undefined ? undefined : { error: `"json_schema": ${error}` }
  }
  return typeof b.grammar === "string" && b.grammar !== "" ? b.grammar : undefined
}

/**
 * `stop`: a string is one stop string, an array's strings each one (an element nlohmann calls empty, null or
 * [] or {}, is skipped; "" is not), anything else is ignored; an array element of another type is refused.
 */
const stopStrings = (stop: unknown): Array<string> | string => {
  if (typeof stop === "string") return [stop]
  if (!Array.isArray(stop)) return []
  const out: Array<string> = []
  for (const w of stop) {
    if (typeof w === "string") out.push(w)
    else if (w === null || (typeof w === "object" && Object.keys(w).length === 0)) continue
    else return typeError("string", w)
  }
  return out
}

const PROMPT_ELEMENTS =
  '"prompt" elements must be a string, a list of tokens, a JSON object containing a prompt string, or a list of mixed strings & tokens.'

const isInt = (v: unknown): boolean => typeof v === "number" && Number.isInteger(v)

/** One sub-prompt (tokenize_input_subprompt): a string, token ids, strings and ids mixed, or {prompt_string}. */
const subPrompt = (p: unknown): LlamaPrompt | undefined => {
  if (typeof p === "string") return asPrompt(words(p), true)
  if (Array.isArray(p)) {
    if (p.length > 0 && p.every(isInt)) return asPrompt(p.map(String), false)
    const mixed =
      p.every((x) => isInt(x) || typeof x === "string") && p.some(isInt) && p.some((x) => typeof x === "string")
    if (mixed)
      return asPrompt(
        p.flatMap((x) => (typeof x === "string" ? words(x) : [String(x)])),
        typeof p[0] === "string"
      )
    if (p.length === 0) return asPrompt([], false)
  }
  if (typeof p === "object" && p !== null && !Array.isArray(p) && "prompt_string" in p) {
    const s = (p as { prompt_string: unknown }).prompt_string
    return typeof s === "string" ? asPrompt(words(s), true) : undefined
  }
  return undefined
}

/**
 * /v1/completions' prompts (tokenize_input_prompts): an array with no integer in it is several prompts, each
 * answered (times `n`) as its own choice; anything else is one. A body that is no object fails at
 * `data.at("prompt")`, as nlohmann words it.
 */
export const llamaPrompts = (body: unknown): Array<LlamaPrompt> | LlamaInvalid => {
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    return { status: 400, message: `[json.exception.type_error.304] cannot use at() with ${typeName(body)}` }
  }
  if (!("prompt" in body)) return { status: 400, message: "[json.exception.out_of_range.403] key 'prompt' not found" }
  const prompt = (body as { prompt: unknown }).prompt
  const many = Array.isArray(prompt) && !prompt.some(isInt)
  const out: Array<LlamaPrompt> = []
  for (const p of many ? (prompt as Array<unknown>) : [prompt]) {
    const one = subPrompt(p)
    if (one === undefined) return { status: 400, message: PROMPT_ELEMENTS }
    out.push(one)
  }
  if (out.length === 0) return { status: 400, message: '"prompt" must not be empty' }
  return out
}
