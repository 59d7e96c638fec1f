// What a request asks of llama-server's chunks beyond their text (pure): its logprobs, per-token timings, its tasks'
// begins, and the debugging extras `verbose` (a `__verbose` object: server-task.cpp to_json_non_oaicompat) and
// `return_progress` (prompt_progress chunks: server-context.cpp update_slots). request.ts builds it, llamaChunks.ts
// writes it. Measured against the real binary by test/real/sim-differential-9.test.ts.
import type { Usage } from "./chunks.ts"
import type { LlamaParams, LlamaPrompt } from "./llamaRequest.ts"
import { SlotBook } from "./llamaSlots.ts"

/** What a request asks of llama-server's chunks beyond the text (request.ts reads it). */
export interface LlamaOut {
  /** `n_probs` (chat: top_logprobs): the top tokens listed with each token's logprob; 0: `logprobs` null. */
  readonly nProbs: number
  /** `post_sampling_probs`: probabilities (`prob`, `top_probs`) instead of logprobs. */
  readonly postSamplingProbs: boolean
  /** `timings_per_token`: `timings` on every chunk. */
  readonly timingsPerToken: boolean
  /**
   * The choices whose task begins with a `data: null` event (request.ts), and how many choices, from the first,
   * hold their slots as the answer starts (generate.ts, requestSlots.ts): a later one begins as it takes its slot.
   */
  readonly begins: ReadonlyArray<number>
  readonly slots: number
  /** `n_predict` as asked (-1: none), for /slots (llamaSlots.ts). */
  readonly nPredict: number
  /** The task's other params beyond the defaults, for /slots (llamaSlotParams.ts). */
  readonly shown?: Readonly<Record<string, unknown>> | undefined
  /** `verbose`: each choice's `__verbose` (to_json_non_oaicompat) begins with these, by choice. */
  readonly verbose?: LlamaVerbose | undefined
  /** `return_progress` in a stream: each choice's prompt length, and whether it is a child (`n`), by choice. */
  readonly progress?: ReadonlyArray<{ readonly total: number; readonly child: boolean }> | undefined
}

/** What a `__verbose` says of each choice's task (server_task_result_cmpl_final::to_json_non_oaicompat). */
export interface LlamaVerbose {
  /** `generation_settings` (task_params::to_json). */
  readonly settings: ReadonlyArray<Record<string, unknown>>
  /** The prompt detokenized, its BOS first. */
  readonly prompts: ReadonlyArray<string>
  readonly promptTokens: ReadonlyArray<number>
}

/** `timings` (server_slot_stats::to_json); the simulator takes no time. */
export const timings = (u: Usage): string =>
  JSON.stringify({
    cache_n: 0,
    prompt_n: u.prompt_tokens,
    prompt_ms: 0,
    prompt_per_token_ms: 0,
    prompt_per_second: 0,
    predicted_n: u.completion_tokens,
    predicted_ms: 0,
    predicted_per_token_ms: 0,
    predicted_per_second: 0
  })

/**
 * A task's generation_settings (task_params::to_json(false)): /slots' params (llamaSlots.ts, the same task's, read
 * off a SlotBook of its own), with the keys only the full form has, where it has them (measured).
 */
const generationSettings = (p: LlamaParams, chat: boolean, seed: number | undefined, nProbs: number) => {
  const book = new SlotBook()
  const task = { promptTokens: 0, nPredict: p.nPredict, chat, stream: p.stream, seed, ignoreEos: p.ignoreEos }
  book.start(
    0,
    { ...task, nProbs, timingsPerToken: p.timingsPerToken, postSamplingProbs: p.postSamplingProbs, shown: p.shown },
    [],
    0,
    false
  )
  const params = book.toJson(0, 0, false).params as Record<string, unknown>
  const after: Record<string, Record<string, unknown>> = {
    dry_penalty_last_n: { dry_sequence_breakers: p.dryBreakers ?? ["\n", ":", '"', "*"] },
    adaptive_decay: { stop: p.stop },
    stream: { logit_bias: [] },
    min_keep: { grammar: p.grammar ?? "", grammar_lazy: false, grammar_triggers: [], preserved_tokens: [] }
  }
  return Object.fromEntries(Object.entries(params).flatMap(([k, v]) => [[k, v], ...Object.entries(after[k] ?? {})]))
}

/** A request's LlamaOut (request.ts), from its fields (llamaRequest.ts) and what it generates. */
export const llamaOut = (r: {
  readonly params: LlamaParams
  readonly chatProbs: number | undefined
  readonly slots: number
  readonly chat: boolean
  readonly body: unknown
  readonly prompts: ReadonlyArray<LlamaPrompt & { readonly text?: string }>
  readonly sequences: ReadonlyArray<{ readonly promptTokens: number; readonly seed: number | undefined }>
}): LlamaOut => {
  const { params: p, sequences } = r
  const nProbs = r.chatProbs ?? p.nProbs
  // the schema took these as booleans where present (llamaParams)
  const b = r.body as { verbose?: unknown; return_progress?: unknown }
  const prompt = (q: (typeof r.prompts)[number]) => (q.text === undefined ? q.tokens.join(" ") : `<s> ${q.text}`)
  const prompts = sequences.map((_, i) => r.prompts[Math.floor(i / p.nCmpl)])
  return {
    nProbs,
    postSamplingProbs: p.postSamplingProbs,
    timingsPerToken: p.timingsPerToken,
    // Every prompt but the first is a task whose begin (is_begin, server-task.cpp to_json: null) is a `data: null`
    // as a slot takes it, the first's only releases the headers (handle_completions_impl); children (`n`): none.
    begins: sequences.flatMap((_, i) => (i > 0 && i % p.nCmpl === 0 ? [i] : [])),
    slots: r.slots,
    nPredict: p.nPredict,
    shown: p.shown,
    verbose:
      b.verbose === true
        ? {
            settings: sequences.map((s) => generationSettings(p, r.chat, s.seed, nProbs)),
            prompts: prompts.map((q) => (q === undefined ? "" : prompt(q))),
            promptTokens: sequences.map((s) => s.promptTokens)
          }
        : undefined,
    progress:
      b.return_progress === true && p.stream
        ? sequences.map((s, i) => ({ total: s.promptTokens, child: i % p.nCmpl !== 0 }))
        : undefined
  }
}

/** stop_type_to_str of a finish: "length" is the limit, "stop" a stop string's (`matched`) or the EOS. */
const stopType = (reason: string, matched: string | undefined) =>
  reason === "length" ? "limit" : matched === undefined ? "eos" : "word"

/**
 * A final result's `__verbose` (to_json_non_oaicompat): choice `index`'s, its `content` (empty in a stream, whose
 * text went out in its chunks). The simulator's slot id and cached tokens are stand-ins of the right type.
 */
export const finalVerbose = (
  v: LlamaVerbose,
  model: string,
  index: number,
  content: string,
  u: Usage,
  reason: string,
  matched?: string
) =>
  JSON.stringify({
    index,
    content,
    tokens: [],
    id_slot: 0,
    stop: true,
    model,
    tokens_predicted: u.completion_tokens,
    tokens_evaluated: u.prompt_tokens,
    generation_settings: v.settings[index] ?? {},
    prompt: v.prompts[index] ?? "",
    has_new_line: false,
    truncated: false,
    stop_type: stopType(reason, matched),
    stopping_word: matched ?? "",
    tokens_cached: Math.max(0, u.total_tokens - 1),
    timings: JSON.parse(timings(u)) as unknown
  })
