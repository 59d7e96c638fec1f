// How llama-server takes a completion or a chat request (pure): the llama_cpp flavor's half of request.ts validate.
// A prompt's tokens are counted by the model's tokenizer where the simulator reads one from the model file
// (spmVocab.ts), as llama-server counts them: its usage.prompt_tokens, /slots and the context-size refusal.
import type { Endpoint } from "./chunks.ts"
import { grammarParses } from "./llamaGrammar.ts"
import { llamaAssistantPrefill, llamaChatProbs, llamaMessages } from "./llamaMessages.ts"
import { llamaOut } from "./llamaOut.ts"
import { llamaPrompts, type Tokenize } from "./llamaPrompts.ts"
import { type LlamaInvalid, type LlamaPrompt, llamaParams, promptIds } from "./llamaRequest.ts"
import type { GenRequest, Invalid, Sequence } from "./request.ts"
import type { SimConfig } from "./simConfig.ts"
import { spmPieces } from "./spmVocab.ts"
import { N_VOCAB } from "./tokens.ts"

/**
 * llama-server's context when -c is not given is the model's own. The simulator has none: it checks no prompt
 * then, and ends generation at this many tokens (what its /props reports).
 */
const LLAMA_DEFAULT_CTX = 4096

/** ggml-org/llama.cpp include/llama.h:37: the seed that asks for a random one. */
const LLAMA_DEFAULT_SEED = 0xffffffff

const invalid = (e: LlamaInvalid): Invalid => ({ status: e.status, message: e.message, param: null })

/** What llama-server's refusals from common_sampler_init begin with (server-context.cpp launch_slot_with_task). */
const SAMPLER_INIT = "Failed to initialize samplers: "

/**
 * llama-server: the prompts (or messages), then every field of the schema (llamaRequest.ts), then a slot's launch,
 * then, per prompt, its length against a slot's context (with its BOS; tools/server/server-context.cpp,
 * ERROR_TYPE_EXCEED_CONTEXT_SIZE). The request's `model` is not looked at. Generation stops at `n_predict`
 * (0 still makes one token: the budget is checked after a token, server-context.cpp process_token) or when
 * prompt and output fill the slot's context ("length"), whichever comes first; -1 or none: the latter.
 */
export const validateLlama = (cfg: SimConfig, endpoint: Endpoint, body: unknown): GenRequest | Invalid => {
  let prompts: Array<LlamaPrompt>
  let chatProbs: number | undefined
  const vocab = cfg.vocab
  // tokenize_input_prompts(..., add_special, parse_special = true): special tokens in the text are parsed
  const tokenize: Tokenize = vocab && ((text: string, addSpecial: boolean) => spmPieces(vocab, text, addSpecial))
  if (endpoint === "chat") {
    const m = llamaMessages(body)
    if ("status" in m) return invalid(m)
    // the rendered chat is the prompt, tokenized as a completion's is
    prompts = [tokenize === undefined ? m : { ...m, tokens: tokenize(m.text, true) }]
    // refused by llamaMessages where bad
    const probs = llamaChatProbs(body)
    chatProbs = typeof probs === "number" ? probs : undefined
  } else {
    const p = llamaPrompts(body, tokenize)
    if (!Array.isArray(p)) return invalid(p)
    prompts = p
  }
  const params = llamaParams(body as Record<string, unknown>, cfg.maxSeqs, endpoint === "chat")
  // the fields' refusals first; a slot's launch (server-context.cpp launch_slot_with_task) then refuses a token id
  // outside the vocabulary (task.tokens.validate), then common_sampler_init its penalties (llamaParams), its grammar
  if ("status" in params && !params.message.startsWith(SAMPLER_INIT)) return invalid(params)
  if (endpoint === "completion" && promptIds((body as { prompt?: unknown }).prompt).some((t) => t < 0 || t >= N_VOCAB))
    return { status: 400, message: "Prompt contains invalid tokens", param: null }
  if ("status" in params) return invalid(params)
  if (params.grammar !== undefined && !grammarParses(params.grammar))
    return { status: 400, message: `${SAMPLER_INIT}failed to parse grammar`, param: null }
  const ctxLen = cfg.slotContext ?? LLAMA_DEFAULT_CTX
  const sequences: Array<Sequence> = []
  for (const p of prompts) {
    const n = p.tokens.length
    if (cfg.slotContext !== undefined && n >= ctxLen) {
      const message = `request (${n} tokens) exceeds the available context size (${ctxLen} tokens), try increasing it`
      const error = { code: 400, message, type: "exceed_context_size_error", n_prompt_tokens: n, n_ctx: ctxLen }
      return { status: 400, message, param: null, body: { error } }
    }
    const room = Math.max(1, ctxLen - n)
    const maxTokens = params.nPredict < 0 ? room : Math.min(Math.max(1, params.nPredict), room)
    // Each further completion of a prompt samples with the seed + its number (server-task.h add_child), but for
    // LLAMA_DEFAULT_SEED (0xFFFFFFFF, -1 as sent), which each keeps (tools/server/server-task.h:240): a seed drawn
    // afresh (src/llama-sampler.cpp:340 get_rng_seed), here the shared stream, as for no seed (/slots shows
    // 4294967295 for either).
    const seed0 = params.seed === LLAMA_DEFAULT_SEED ? undefined : params.seed
    for (let j = 0; j < params.nCmpl; j++) {
      const seed = seed0 === undefined ? undefined : (seed0 + j) >>> 0
      sequences.push({ words: p.words, tokens: p.tokens, promptTokens: n, maxTokens, seed })
    }
  }
  const first = sequences[0] as Sequence
  return {
    endpoint,
    promptWords: first.tokens ?? first.words,
    maxTokens: first.maxTokens,
    stream: params.stream,
    includeUsage: params.includeUsage,
    seed: params.seed,
    greedy: params.greedy,
    cacheSalt: undefined,
    kvTransferParams: undefined,
    ignoreEos: params.ignoreEos,
    bootstrap: undefined,
    sequences,
    stop: params.stop,
    ...(endpoint === "chat" ? llamaAssistantPrefill(body, cfg.mode === "echo") : {}),
    llama: llamaOut({ params, chatProbs, slots: cfg.maxSeqs, chat: endpoint === "chat", body, prompts, sequences }),
    ssePingMs:
      params.ssePingInterval === undefined
        ? cfg.ssePingMs
        : params.ssePingInterval > 0
          ? params.ssePingInterval * 1000
          : undefined
  }
}
