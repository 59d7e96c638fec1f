// llama-server's slots as GET /slots shows them (tools/server/server-context.cpp server_slot::to_json with
// only_metrics, as the route asks unless LLAMA_SERVER_SLOTS_DEBUG is set): each slot's id, context, whether it is
// processing, then, once it has served a task, that task's (the current one, else the last: `task ? task :
// task_prev`): its id, the slot's tokens, its prompt's processed and cached tokens, its params
// (task_params::to_json(true)) and `next_token`. Measured against the real server: while a task runs, the slot's
// tokens are its prompt's and those decoded so far, n_remain is n_predict less those; once it ended (the slot
// reset), its prompt's and all but the last token, none processed nor cached, has_next_token false, n_remain -1,
// n_decoded 0. A task's params are the request's on the defaults, with the server's reasoning format (deepseek)
// and a chat's format. Task ids count every task of the server (/slots and /metrics are tasks too); here only
// the generating ones.

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
}

interface Held {
  readonly idTask: number
  readonly task: SlotTask
  decoded: number
}

/** The tasks each slot of one engine core runs or last ran. */
export class SlotBook {
  private readonly slots = new Map<number, Held>()
  private tasks = 0

  /** A task takes `slot`. */
  start(slot: number, task: SlotTask): void {
    this.slots.set(slot, { idTask: this.tasks++, task, decoded: 0 })
  }

  /** The task in `slot` decoded a token. */
  token(slot: number): void {
    const h = this.slots.get(slot)
    if (h !== undefined) h.decoded++
  }

  /** Slot `id` as /slots shows it; `busy`: whether it runs its task now. */
  toJson(id: number, nCtx: number, busy: boolean): Record<string, unknown> {
    const head = { id, n_ctx: nCtx, speculative: false, is_processing: busy }
    const h = this.slots.get(id)
    if (h === undefined) return head
    const t = h.task
    const params = {
      ...DEFAULT_PARAMS,
      ...(t.seed === undefined ? {} : { seed: t.seed }),
      max_tokens: t.nPredict,
      n_predict: t.nPredict,
      ignore_eos: t.ignoreEos,
      stream: t.stream,
      n_probs: t.nProbs,
      chat_format: t.chat ? "peg-native" : "Content-only",
      reasoning_format: "deepseek",
      // the chat template's generation prompt (the simulator's ChatML, llamaRoutes.ts)
      generation_prompt: t.chat ? "<|im_start|>assistant\n" : "",
      timings_per_token: t.timingsPerToken,
      post_sampling_probs: t.postSamplingProbs
    }
    const tokens = t.promptTokens + (busy ? h.decoded : Math.max(0, h.decoded - 1))
    const remain = busy && t.nPredict >= 0 ? t.nPredict - h.decoded : -1
    const next = { has_next_token: busy, has_new_line: false, n_remain: remain, n_decoded: busy ? h.decoded : 0 }
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
