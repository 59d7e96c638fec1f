// What the real llama-server was measured to answer to /tokenize and /detokenize items, to a slot's launch checks
// in their order, and the shapes `verbose` and `return_progress` add: the rest of llamaChatFacts.ts's facts (the
// same tests send and pin them). Started as `-c 1024 -np 2` (a slot's context 512).
import type { ChatFact } from "./llamaChatFacts.ts"

const TYPE = "[json.exception.type_error.302] type must be"
const range = (n: string) => `vector::_M_range_check: __n (which is ${n}) >= this->size() (which is 32000)`

/** F9: /detokenize's get<llama_tokens>() and /tokenize's items, each a get<llama_token>() unless a string. */
export const TOKEN_ITEMS: ReadonlyArray<ChatFact> = [
  {
    why: "tokens null is no array",
    path: "/detokenize",
    body: { tokens: null },
    status: 500,
    message: `${TYPE} array, but is null`
  },
  {
    why: "a string is no token",
    path: "/detokenize",
    body: { tokens: ["a"] },
    status: 500,
    message: `${TYPE} number, but is string`
  },
  {
    why: "an array is no token",
    path: "/detokenize",
    body: { tokens: [[1]] },
    status: 500,
    message: `${TYPE} number, but is array`
  },
  {
    why: "every token converts before any is looked up",
    path: "/detokenize",
    body: { tokens: [99999, "a"] },
    status: 500,
    message: `${TYPE} number, but is string`
  },
  { why: "1.5 truncates to 1", path: "/detokenize", body: { tokens: [1.5] }, status: 200, answer: { content: "<s>" } },
  {
    why: "true is 1, 2.9 is 2, -0.5 is 0, 2^32+1 wraps to 1",
    path: "/detokenize",
    body: { tokens: [true, 2.9, -0.5, 4294967297] },
    status: 200,
    answer: { content: "<s></s><unk><s>" }
  },
  {
    why: "an int64 id wraps to int32",
    path: "/detokenize",
    body: { tokens: [99999999999] },
    status: 500,
    message: range("1215752191")
  },
  {
    why: "an item that is no string is a token",
    path: "/tokenize",
    body: { content: [1, [1]] },
    status: 500,
    message: `${TYPE} number, but is array`
  },
  {
    why: "null is no token",
    path: "/tokenize",
    body: { content: [null] },
    status: 500,
    message: `${TYPE} number, but is null`
  },
  {
    why: "true and 1.5 are token 1",
    path: "/tokenize",
    body: { content: [true, 1.5] },
    status: 200,
    answer: { tokens: [1, 1] }
  },
  {
    why: "add_special adds no BOS before a leading id",
    path: "/tokenize",
    body: { content: [1], add_special: true },
    status: 200,
    answer: { tokens: [1] }
  },
  {
    why: "a piece of an id outside the vocabulary",
    path: "/tokenize",
    body: { content: [99999], with_pieces: true },
    status: 500,
    message: range("99999")
  },
  {
    why: "a piece of -1",
    path: "/tokenize",
    body: { content: [-1], with_pieces: true },
    status: 500,
    message: range("18446744073709551615")
  }
]

const longIds = [...Array.from({ length: 1100 }, () => 5), 99999]
const longText = Array.from({ length: 1100 }, () => "a").join(" ")
const PENALTY = "Failed to initialize samplers: penalty_repeat must be finite and greater than 0"
const completion = (why: string, body: Record<string, unknown>, message: string): ChatFact => ({
  why,
  path: "/v1/completions",
  body: { max_tokens: 2, ...body },
  status: 400,
  message
})

/** A slot's launch: the fields, then bad token ids, then the samplers' init (penalty, grammar), then the context. */
export const LAUNCH_ORDER: ReadonlyArray<ChatFact> = [
  completion("bad ids before the penalty", { prompt: [5, 99999], repeat_penalty: 0 }, "Prompt contains invalid tokens"),
  completion("bad ids before the context", { prompt: longIds }, "Prompt contains invalid tokens"),
  completion(
    "bad ids before the penalty and the context",
    { prompt: longIds, repeat_penalty: 0 },
    "Prompt contains invalid tokens"
  ),
  completion(
    "a grammar before the context",
    { prompt: longText, grammar: "x" },
    "Failed to initialize samplers: failed to parse grammar"
  ),
  completion("the penalty before the grammar", { prompt: "a", grammar: "x", repeat_penalty: 0 }, PENALTY),
  completion(
    "the fields before bad ids",
    { prompt: [5, 99999], echo: 1 },
    "Field 'echo': [json.exception.type_error.302] type must be boolean, but is number"
  )
]

/** F10: `__verbose`'s keys, in llama-server's order (server-task.cpp to_json_non_oaicompat, task_params::to_json). */
export const VERBOSE_FINAL_KEYS = [
  "index",
  "content",
  "tokens",
  "id_slot",
  "stop",
  "model",
  "tokens_predicted",
  "tokens_evaluated",
  "generation_settings",
  "prompt",
  "has_new_line",
  "truncated",
  "stop_type",
  "stopping_word",
  "tokens_cached",
  "timings"
]
export const VERBOSE_PARTIAL_KEYS = [
  "index",
  "content",
  "tokens",
  "stop",
  "id_slot",
  "tokens_predicted",
  "tokens_evaluated"
]
/** Where the keys only the full task_params::to_json has go, after the one before each. */
export const SETTINGS_EXTRA_KEYS: ReadonlyArray<readonly [string, string]> = [
  ["dry_penalty_last_n", "dry_sequence_breakers"],
  ["adaptive_decay", "stop"],
  ["stream", "logit_bias"],
  ["min_keep", "grammar"],
  ["grammar", "grammar_lazy"],
  ["grammar_lazy", "grammar_triggers"],
  ["grammar_triggers", "preserved_tokens"]
]
/** A whole answer's keys with `verbose`: `__verbose` after id, before timings (chat and completion alike). */
export const VERBOSE_ANSWER_KEYS = [
  "choices",
  "created",
  "model",
  "system_fingerprint",
  "object",
  "usage",
  "id",
  "__verbose",
  "timings"
]

/** F8: a stream's events with return_progress, one choice: two prompt_progress chunks (0%, then all), then tokens. */
export const PROGRESS_KEYS = ["total", "cache", "processed", "time_ms"]

/**
 * F8 with several prompts, a stream's prompt_progress chunks per choice (by index): each prompt's first completion
 * has two (its start, its prompt evaluated), a child (`n` > 1) only the second.
 */
export const PROGRESS_PER_CHOICE: ReadonlyArray<{
  readonly body: Record<string, unknown>
  readonly chunks: ReadonlyArray<number>
}> = [
  { body: { prompt: ["a b", "c d e"], max_tokens: 2 }, chunks: [2, 2] },
  { body: { prompt: ["a b", "c d e"], n: 2, max_tokens: 2 }, chunks: [2, 1, 2, 1] }
]

/** F10: a whole answer's `__verbose.tokens_cached`: prompt and output tokens but the last one, never evaluated. */
export const TOKENS_CACHED: ReadonlyArray<{ readonly body: Record<string, unknown>; readonly cached: number }> = [
  { body: { prompt: "a b", max_tokens: 2 }, cached: 4 },
  { body: { prompt: "a b c d", max_tokens: 3 }, cached: 7 }
]

/** A chat's top_logprobs is its n_probs: the alternatives of each token, and generation_settings.n_probs. */
export const CHAT_TOP_LOGPROBS = {
  body: { messages: [{ role: "user", content: "a b" }], max_tokens: 2, logprobs: true, top_logprobs: 2, verbose: true },
  nProbs: 2
}

/** A chat answer's alternatives per token and its generation_settings.n_probs, as CHAT_TOP_LOGPROBS counts them. */
export const chatProbsOf = (text: string): [Array<number>, unknown] => {
  const r = JSON.parse(text) as {
    choices: Array<{ logprobs: { content: Array<{ top_logprobs: Array<unknown> }> } }>
    __verbose: { generation_settings: { n_probs: unknown } }
  }
  return [
    r.choices[0]?.logprobs.content.map((c) => c.top_logprobs.length) ?? [],
    r.__verbose.generation_settings.n_probs
  ]
}

/** How many prompt_progress chunks each of `n` choices got, of a stream's JSON events. */
export const progressPerChoice = (events: ReadonlyArray<Record<string, unknown>>, n: number): Array<number> =>
  Array.from(
    { length: n },
    (_, i) =>
      events.filter((e) => e.prompt_progress !== undefined && (e.choices as Array<{ index: number }>)[0]?.index === i)
        .length
  )
