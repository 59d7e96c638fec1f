// What the real llama-server was measured to answer to request fields (test/real/sim-differential-8.test.ts sends
// these to both it and the simulator; test/sim/llama-request-conversions.test.ts holds the simulator's pure field
// checks to them without the binary). Bodies go out through JSON.stringify, whose digits are what the real server
// converts: 1e10 is written 10000000000 (an integer to nlohmann), 1e21 as 1e+21 (a double).

export interface RequestFact {
  /** Which class of the fuzz's findings it stands for, and why it answers so. */
  readonly why: string
  /** chat: /v1/chat/completions; else /v1/completions. */
  readonly chat?: true
  /** The fields beside the prompt (or messages) and max_tokens 2. */
  readonly extra: Record<string, unknown>
  /** The 400's message; absent where the request is taken (200). */
  readonly refused?: string
  /** Of a taken completion: whether its choice carries logprobs. */
  readonly logprobs?: boolean
}

const range = (field: string, lo: string, hi: string, got: string) =>
  `Field '${field}': Value must be between ${lo} <= value <= ${hi}, but got ${got}`
const I32 = "2147483647"
const typeMust = (field: string, want: string, is: string) =>
  `Field '${field}': [json.exception.type_error.302] type must be ${want}, but is ${is}`
const PENALTY = "Failed to initialize samplers: penalty_repeat must be finite and greater than 0"

/** F3: numbers converted to the field's C++ type (int32, int64, float) before the range check, printed after. */
export const CONVERSIONS: ReadonlyArray<RequestFact> = [
  { why: "int32 wraps an int64 below INT32_MIN into range", extra: { n_keep: -2149483649 } },
  {
    why: "int32 wraps 2^31 to INT32_MIN",
    extra: { n_keep: 2147483648 },
    refused: range("n_keep", "-1", I32, "-2147483648")
  },
  {
    why: "int32 wraps 2^31 (repeat_last_n)",
    extra: { repeat_last_n: 2147483648 },
    refused: range("repeat_last_n", "0", I32, "-2147483648")
  },
  { why: "int32 wraps 2^32 to 0 (sse_ping_interval taken)", extra: { sse_ping_interval: 4294967296 } },
  { why: "int32 wraps 10^10 (n's bound is -np)", extra: { n: 1e10 }, refused: range("n", "1", "2", "1410065408") },
  {
    why: "a double past int32 (1e+21) is INT32_MIN",
    extra: { n_keep: 1e21 },
    refused: range("n_keep", "-1", I32, "-2147483648")
  },
  { why: "a double truncates toward zero", extra: { n_keep: -2.5 }, refused: range("n_keep", "-1", I32, "-2") },
  {
    why: "a double that truncates to 2^31 is past int32: INT32_MIN",
    extra: { n_keep: 2147483648.5 },
    refused: range("n_keep", "-1", I32, "-2147483648")
  },
  {
    why: "int64 wraps a uint64 literal",
    extra: { t_max_predict_ms: 1e19 },
    refused: range("t_max_predict_ms", "-1", "9223372036854775807", "-8446744073709551616")
  },
  {
    why: "float prints %f's full digits",
    extra: { adaptive_decay: 1e30 },
    refused: range("adaptive_decay", "0.000000", "0.990000", "1000000015047466219876688855040.000000")
  },
  {
    why: "float overflows to inf",
    extra: { adaptive_decay: 1e39 },
    refused: range("adaptive_decay", "0.000000", "0.990000", "inf")
  },
  {
    why: "float overflows to -inf",
    extra: { adaptive_decay: -1e39 },
    refused: range("adaptive_decay", "0.000000", "0.990000", "-inf")
  },
  {
    why: "float rounds to 24 bits",
    extra: { adaptive_decay: 123456789.123 },
    refused: range("adaptive_decay", "0.000000", "0.990000", "123456792.000000")
  },
  { why: "float rounds onto the limit 0.99f", extra: { adaptive_decay: 0.9900000001 } },
  { why: "n_probs wraps negative: no logprobs", extra: { n_probs: 2147483648 }, logprobs: false },
  { why: "logprobs (n_probs' alias) wraps to 1: logprobs", extra: { logprobs: 4294967297 }, logprobs: true },
  { why: "n_probs 1: logprobs", extra: { n_probs: 1 }, logprobs: true }
]

/** F4: fields read by handlers of their own, each refused in its own words and in the schema's order. */
export const HANDLED_FIELDS: ReadonlyArray<RequestFact> = [
  {
    why: "reasoning_budget_start_tag is a string",
    extra: { reasoning_budget_start_tag: 1 },
    refused: typeMust("reasoning_budget_start_tag", "string", "number")
  },
  {
    why: "reasoning_budget_end_tags' elements are strings",
    extra: { reasoning_budget_end_tags: ["a", 2] },
    refused: typeMust("reasoning_budget_end_tags", "string", "number")
  },
  {
    why: "reasoning_budget_end_tag (the alias) is a string",
    extra: { reasoning_budget_end_tag: [1] },
    refused: typeMust("reasoning_budget_end_tag", "string", "array")
  },
  { why: "a string end tag is its own one element", extra: { reasoning_budget_end_tags: "x" } },
  {
    why: "preserved_tokens are strings",
    extra: { preserved_tokens: [1] },
    refused: typeMust("preserved_tokens", "string", "number")
  },
  {
    why: "a grammar trigger is an object",
    extra: { grammar_triggers: [1] },
    refused: "Field 'grammar_triggers': [json.exception.type_error.304] cannot use at() with number"
  },
  {
    why: "a grammar trigger has a type",
    extra: { grammar_triggers: [{}] },
    refused: "Field 'grammar_triggers': [json.exception.out_of_range.403] key 'type' not found"
  },
  {
    why: "a one-token WORD trigger must be preserved",
    extra: { grammar_triggers: [{ type: 1, value: "the" }] },
    refused: "Field 'grammar_triggers': Grammar trigger word should be marked as preserved token: the"
  },
  {
    why: "a preserved one is taken",
    extra: { grammar_triggers: [{ type: 1, value: "the" }], preserved_tokens: ["the"] }
  },
  {
    why: "a WORD trigger of several tokens need not be preserved",
    extra: { grammar_triggers: [{ type: 1, value: "a b" }] }
  },
  { why: "a grammar that is not lazy needs no trigger", extra: { grammar_triggers: [], grammar_lazy: false } },
  {
    why: "a lazy grammar needs a trigger",
    extra: { grammar_triggers: [], grammar_lazy: true },
    refused: "Field 'grammar_triggers': Error: no triggers set for lazy grammar!"
  },
  { why: "chat_parser is a string", extra: { chat_parser: 1 }, refused: typeMust("chat_parser", "string", "number") },
  {
    why: "chat_parser is JSON text",
    extra: { chat_parser: "" },
    refused:
      "Field 'chat_parser': [json.exception.parse_error.101] parse error at line 1, column 1: attempting to parse an empty input; check that your input string or stream contains the expected JSON"
  },
  {
    why: "chat_parser's root names a parser",
    extra: { chat_parser: '{"parsers":[],"rules":{},"root":0}' },
    refused: "Field 'chat_parser': Root references invalid parser ID: 0"
  },
  {
    why: "a rule's parser id is below the parsers' count",
    extra: { chat_parser: '{"parsers":[],"rules":{"r":0},"root":0}' },
    refused: "Field 'chat_parser': Rule 'r' references invalid parser ID: 0"
  },
  {
    why: "a root of -1 (COMMON_PEG_INVALID_PARSER_ID) is no reference",
    extra: { chat_parser: '{"parsers":[],"rules":{},"root":-1}' }
  },
  { why: "chat_format is a number", extra: { chat_format: "x" }, refused: typeMust("chat_format", "number", "string") },
  {
    why: "generation_prompt is a string",
    extra: { generation_prompt: 1 },
    refused: typeMust("generation_prompt", "string", "number")
  },
  {
    why: "samplers' elements are strings",
    extra: { samplers: [1] },
    refused: typeMust("samplers", "string", "number")
  },
  { why: "samplers as chars are taken", extra: { samplers: "xyz" } },
  {
    why: "dry_sequence_breakers is no empty array",
    extra: { dry_sequence_breakers: [] },
    refused: "Field 'dry_sequence_breakers': Error: dry_sequence_breakers must be a non-empty array of strings"
  },
  {
    why: "dry_sequence_breakers is an array, reported before a later bad field (echo)",
    extra: { echo: 1, dry_sequence_breakers: "x" },
    refused: "Field 'dry_sequence_breakers': Error: dry_sequence_breakers must be a non-empty array of strings"
  },
  {
    why: "lora is an array",
    extra: { lora: "x" },
    refused: "Field 'lora': Error: 'lora' must be an array of objects with 'id' and 'scale' fields"
  },
  { why: "lora's entries are not looked into", extra: { lora: [1] } },
  {
    why: "reasoning_format is a string",
    extra: { reasoning_format: 1 },
    refused: typeMust("reasoning_format", "string", "number")
  },
  {
    why: "reasoning_format is a known one",
    extra: { reasoning_format: "" },
    refused: "Field 'reasoning_format': Unknown reasoning format: "
  },
  { why: "reasoning_format deepseek-legacy is a known one", extra: { reasoning_format: "deepseek-legacy" } },
  {
    why: "a non-empty json_schema array is no schema",
    extra: { json_schema: [1] },
    refused: "Field 'json_schema': \"json_schema\": JSON schema conversion failed:\nUnrecognized schema: [1]"
  },
  {
    why: "stop is read before samplers",
    extra: { stop: [1], samplers: [1] },
    refused: typeMust("stop", "string", "number")
  },
  {
    why: "a chat reads samplers too",
    chat: true,
    extra: { samplers: [1] },
    refused: typeMust("samplers", "string", "number")
  },
  {
    why: "a chat reads the reasoning budget's tags (this template has none of its own)",
    chat: true,
    extra: { reasoning_budget_start_tag: 1 },
    refused: typeMust("reasoning_budget_start_tag", "string", "number")
  },
  { why: "a chat's template sets preserved_tokens", chat: true, extra: { preserved_tokens: [1] } },
  { why: "a chat's template sets chat_parser", chat: true, extra: { chat_parser: 1 } },
  { why: "a chat's template sets chat_format", chat: true, extra: { chat_format: "x" } }
]

/** F5: common_sampler_init's checks, after every field's. */
export const SAMPLER_INIT: ReadonlyArray<RequestFact> = [
  { why: "repeat_penalty 0", extra: { repeat_penalty: 0 }, refused: PENALTY },
  { why: "repeat_penalty below 0", extra: { repeat_penalty: -1 }, refused: PENALTY },
  { why: "repeat_penalty false is 0", extra: { repeat_penalty: false }, refused: PENALTY },
  { why: "a denormal repeat_penalty: its inverse is inf", extra: { repeat_penalty: 1e-40 }, refused: PENALTY },
  { why: "a small normal repeat_penalty is taken", extra: { repeat_penalty: 1e-37 } },
  { why: "an infinite repeat_penalty is clamped to FLT_MAX: taken", extra: { repeat_penalty: 1e39 } },
  { why: "an infinite frequency_penalty is clamped too", extra: { frequency_penalty: 1e39 } },
  { why: "a chat's samplers too", chat: true, extra: { repeat_penalty: 0 }, refused: PENALTY },
  {
    why: "a later bad field is reported first",
    extra: { repeat_penalty: 0, ignore_eos: 1 },
    refused: typeMust("ignore_eos", "boolean", "number")
  }
]

/** F7 and F11: grammar_lazy a chat's template sets; stream_options read right after stream. */
export const ORDER: ReadonlyArray<RequestFact> = [
  { why: "a chat's grammar_lazy is its template's", chat: true, extra: { grammar_lazy: 1 } },
  {
    why: "a completion's grammar_lazy is read",
    extra: { grammar_lazy: 1 },
    refused: typeMust("grammar_lazy", "boolean", "number")
  },
  {
    why: "include_usage is read before cache_prompt",
    extra: { cache_prompt: 0, stream_options: { include_usage: 1 } },
    refused: typeMust("include_usage", "boolean", "number")
  },
  {
    why: "include_usage is read after timings_per_token",
    extra: { stream_options: { include_usage: 1 }, timings_per_token: 1 },
    refused: typeMust("timings_per_token", "boolean", "number")
  }
]
