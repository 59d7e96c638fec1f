// SGLang's second bound on a request's length, the scheduler's, after the tokenizer manager's (contextLimit.ts)
// (pure). Sources, sgl-project/sglang:
// - python/sglang/srt/managers/tp_worker.py (TpModelWorker): max_req_len = min(context_len - 1,
//   max_total_num_tokens - 1) and max_req_input_len = max_req_len - 5 (asserted > 0 at start: "Memory pool size is
//   too small"); max_total_num_tokens is the KV pool's size in tokens (the simulator's --sim-kv-blocks ×
//   --page-size, what it reports as sglang:max_total_num_tokens).
// - python/sglang/srt/managers/scheduler.py (Scheduler.handle_generate_request, init_req_max_new_tokens): before the
//   length check, max_new_tokens (or 2^30 where the request named none) becomes max(0, min(it, max_req_len - input - 1,
//   max_total_num_tokens - input rounded up to a page - page_size - 1)), from the input as the tokenizer manager
//   passed it on.
// - python/sglang/srt/managers/utils.py (validate_input_length): an input of max_req_input_len tokens or more
//   (`>=`) is cut to its first max_req_input_len with --allow-auto-truncate (a warning logged), else the request is
//   aborted: Req.set_finish_with_abort (schedule_batch.py) logs the words at error level and finishes it with
//   FINISH_ABORT(words, HTTPStatus.BAD_REQUEST, "BadRequestError"). How that answers (faultReply.ts
//   schedulerAbort): a whole answer 400 as the tokenizer manager's refusals are, a stream 200 with an error event.

import { SIM_MODEL_CONTEXT } from "./contextLimit.ts"
import type { SimConfig } from "./simConfig.ts"

/** The tokens the scheduler keeps off an input's bound: max_req_input_len = max_req_len - 5. */
export const SGLANG_INPUT_RESERVE = 5

export interface SchedulerFit {
  /** The input's first tokens the request keeps. */
  readonly keep: number
  readonly maxTokens: number
  readonly warnings: ReadonlyArray<string>
}

export interface SchedulerAbort {
  /** validate_input_length's words, which the answer carries. */
  readonly abort: string
}

/** max_req_len and max_req_input_len for a context and a KV pool of `poolTokens`. */
export const sglangRequestBounds = (context: number, poolTokens: number) => {
  const maxReqLen = Math.min(context - 1, poolTokens - 1)
  return { maxReqLen, maxReqInputLen: maxReqLen - SGLANG_INPUT_RESERVE }
}

/**
 * The scheduler's take on an `input` token request that the tokenizer manager passed with `maxTokens` (where the
 * request named none SGLang starts from 2^30, the simulator from its default: both end up capped here).
 */
export const sglangSchedulerFit = (
  context: number,
  poolTokens: number,
  pageSize: number,
  input: number,
  maxTokens: number,
  autoTruncate: boolean
): SchedulerFit | SchedulerAbort => {
  const { maxReqLen, maxReqInputLen } = sglangRequestBounds(context, poolTokens)
  const pagedInput = Math.ceil(input / pageSize) * pageSize
  const capped = Math.max(0, Math.min(maxTokens, maxReqLen - input - 1, poolTokens - pagedInput - pageSize - 1))
  if (input < maxReqInputLen) return { keep: input, maxTokens: capped, warnings: [] }
  if (!autoTruncate)
    return {
      abort: `Input length (${input} tokens) exceeds the maximum allowed length (${maxReqInputLen} tokens). Use a shorter input or enable --allow-auto-truncate.`
    }
  // Python's f"{len(req.origin_input_ids)=}, {max_req_input_len=}"
  const warning = `Request length is longer than the KV cache pool size or the max context length. Truncated. len(req.origin_input_ids)=${input}, max_req_input_len=${maxReqInputLen}.`
  return { keep: maxReqInputLen, maxTokens: capped, warnings: [warning] }
}

/** The scheduler's fit for the simulator's SGLang: its context (or the model's), its KV pool, its page size. */
export const sglangScheduler = (cfg: SimConfig, input: number, maxTokens: number): SchedulerFit | SchedulerAbort =>
  sglangSchedulerFit(
    cfg.maxModelLen ?? SIM_MODEL_CONTEXT,
    cfg.kvBlocks * cfg.blockSize,
    cfg.blockSize,
    input,
    maxTokens,
    cfg.allowAutoTruncate === true
  )
