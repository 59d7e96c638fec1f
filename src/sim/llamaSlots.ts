// llama-server's slots as GET /slots shows them (tools/server/server-context.cpp server_slot::to_json with
// only_metrics, as the route asks unless LLAMA_SERVER_SLOTS_DEBUG is set): each slot's id, context, whether it is
// processing, then, once it has served a task, that task's (the current one, else the last: `task ? task :
// task_prev`): its id, the slot's tokens, its prompt's processed and cached tokens, its params
// (task_params::to_json(true)) and `next_token`. Measured against the real server: while a task runs, the slot's
// tokens are its prompt's and those decoded so far, n_remain is n_predict less those; once it ended (the slot
// reset), its prompt's and all but the last token, none processed nor cached, n_remain -1, n_decoded 0, and
// has_next_token false, set by the task's last token (process_token): a task cancelled (its client left a stream)
// leaves it true, as server_slot::reset never clears it, until the slot's next task ends. A child task's slot (`n`)
// keeps no tokens once it ended (server_slot::release: prompt_clear for a child). A task's params are the
// request's on the defaults, with the server's reasoning format (deepseek) and a chat's format.
// Task ids (server_queue::get_new_id) count every task of the server: each prompt's task and each of its children,
// each pass of the loop that finds a slot busy (update_slots posts a NEXT_RESPONSE task: one a decode step, the
// prompt's included), and each GET /slots and /metrics (SLOT_GET, METRICS); not /health, /props, /v1/models,
// /tokenize, /detokenize nor /apply-template, which answer from the HTTP thread (measured).

import { GENERATION_PROMPT } from "./llamaTemplate.ts"

/** task_params::to_json(true) of the server's defaults (common/common.h common_params_sampling), in its order. */
export const DEFAULT_PARAMS = {
  seed: 4294967295,
  temperature: 0.800000011920929,
  dynatemp_range: 0,
  dynatemp_exponent: 1,
  top_k: 40,
  top_p: 0.949999988079071,
  min_p: 0.05000000074505806,
  top_n_sigma: -1,
  xtc_probability: 0,
  xtc_threshold: 0.10000000149011612,
  typical_p: 1,
  repeat_last_n: 64,
  repeat_penalty: 1,
  presence_penalty: 0,
  frequency_penalty: 0,
  dry_multiplier: 0,
  dry_base: 1.75,
  dry_allowed_length: 2,
  dry_penalty_last_n: 64,
  mirostat: 0,
  mirostat_tau: 5,
  mirostat_eta: 0.10000000149011612,
  adaptive_target: -1,
  adaptive_decay: 0.8999999761581421,
  max_tokens: -1,
  n_predict: -1,
  n_keep: 0,
  n_discard: 0,
  ignore_eos: false,
  stream: false,
  n_probs: 0,
  min_keep: 0,
  chat_format: "Content-only",
  reasoning_format: "none",
  reasoning_in_content: false,
  generation_prompt: "",
  samplers: ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"],
  "speculative.types": "none",
  timings_per_token: false,
  post_sampling_probs: false,
  backend_sampling: false,
  lora: []
}

/** What a slot shows of the task it runs or last ran. */
export interface SlotTask {
  readonly promptTokens: number
  /** n_predict: the request's cap, or -1. */
  readonly nPredict: number
  readonly chat: boolean
  readonly stream: boolean
  readonly seed: number | undefined
  readonly ignoreEos: boolean
  readonly nProbs: number
  readonly timingsPerToken: boolean
  readonly postSamplingProbs: boolean
  /** The request's other params beyond the defaults (llamaSlotParams.ts). */
  readonly shown?: Readonly<Record<string, unknown>> | undefined
}

interface Held {
  readonly idTask: number
  readonly task: SlotTask
  decoded: number
  /** The slot's tokens (prompt_cache's prompt.tokens): its prompt's, with its BOS, then those decoded. */
  readonly tokens: Array<string>
  /** Its last token, which the slot takes once the next is decoded. */
  pending: string
  hasNext: boolean
  /** A child task's slot, whose tokens go at its end. */
  readonly child: boolean
}

/** The tokens two lists begin with alike (server_tokens::get_common_prefix). */
const commonPrefix = (a: ReadonlyArray<string>, b: ReadonlyArray<string>): number => {
  let n = 0
  while (n < a.length && n < b.length && a[n] === b[n]) n++
  return n
}

/** The tasks each slot of one engine core runs or last ran. */
export class SlotBook {
  private readonly slots = new Map<number, Held>()
  private tasks = 0

  /** A task id taken by something else than a generation (a decode step, /slots, /metrics). */
  taskId(): void {
    this.tasks++
  }

  /**
   * A task takes `slot`; `tokens` its prompt's (with its BOS). Its id was taken as it was posted (`id`:
   * RequestSlots reserves a request's ids together, as handle_completions_impl numbers its tasks and children).
   */
  start(slot: number, task: SlotTask, tokens: ReadonlyArray<string>, id: number, child: boolean): void {
    this.slots.set(slot, { idTask: id, task, decoded: 0, tokens: [...tokens], pending: "", hasNext: true, child })
  }

  /** Ids for `n` tasks posted together: the first. */
  reserve(n: number): number {
    const first = this.tasks
    this.tasks += n
    return first
  }

  /** The task in `slot` decoded `token`; the slot keeps all but a task's last (the next step's input). */
  token(slot: number, token: string): void {
    const h = this.slots.get(slot)
    if (h === undefined) return
    if (h.decoded > 0) h.tokens.push(h.pending)
    h.pending = token
    h.decoded++
  }

  /** The task in `slot` made its last token (has_next_token false). */
  ended(slot: number): void {
    const h = this.slots.get(slot)
    if (h !== undefined) h.hasNext = false
  }

  /** The slot is released: a child's tokens go (prompt_clear). */
  released(slot: number): void {
    const h = this.slots.get(slot)
    if (h?.child === true) h.tokens.length = 0
  }

  /**
   * get_available_slot's first rule: of the idle slots `free` that hold tokens, the one whose tokens share the
   * longest prefix with the task's `tokens`, as a fraction of the task's, if above `threshold`
   * (--slot-prompt-similarity, common/common.h default 0.1; 0 turns it off); else undefined (the LRU rule).
   */
  similar(free: ReadonlyArray<number>, tokens: ReadonlyArray<string>, threshold: number): number | undefined {
    if (threshold === 0 || tokens.length === 0) return undefined
    let best = 0
    let pick: number | undefined
    for (const id of free) {
      const held = this.slots.get(id)?.tokens ?? []
      if (held.length === 0) continue
      const sim = commonPrefix(held, tokens) / tokens.length
      if (sim > best && sim > threshold) [best, pick] = [sim, id]
    }
    return pick
  }

  /** Slot `id` as /slots shows it; `busy`: whether it runs its task now. */
  toJson(id: number, nCtx: number, busy: boolean): Record<string, unknown> {
    const head = { id, n_ctx: nCtx, speculative: false, is_processing: busy }
    const h = this.slots.get(id)
    if (h === undefined) return head
    const t = h.task
    const params = {
      ...DEFAULT_PARAMS,
      ...t.shown,
      ...(t.seed === undefined ? {} : { seed: t.seed }),
      max_tokens: t.nPredict,
      n_predict: t.nPredict,
      ignore_eos: t.ignoreEos,
      stream: t.stream,
      n_probs: t.nProbs,
      chat_format: t.chat ? "peg-native" : "Content-only",
      reasoning_format: t.shown?.reasoning_format ?? "deepseek",
      // the chat template's generation prompt (the simulator's ChatML)
      generation_prompt: t.chat ? GENERATION_PROMPT : "",
      timings_per_token: t.timingsPerToken,
      post_sampling_probs: t.postSamplingProbs
    }
    const tokens = busy ? t.promptTokens + h.decoded : h.tokens.length
    const remain = busy && t.nPredict >= 0 ? t.nPredict - h.decoded : -1
    const next = { has_next_token: h.hasNext, has_new_line: false, n_remain: remain, n_decoded: busy ? h.decoded : 0 }
    return {
      ...head,
      id_task: h.idTask,
      n_prompt_tokens: tokens,
      n_prompt_tokens_processed: busy ? t.promptTokens : 0,
      n_prompt_tokens_cache: 0,
      params,
      next_token: [next]
    }
  }
}
