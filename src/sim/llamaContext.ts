// llama-server's context per slot (pure), from -c, -np, --kv-unified and the model's training context:
// src/llama-context.cpp (llama_context: n_ctx padded to 256; without a unified KV cache each sequence gets
// n_ctx / n_seq_max padded to 256, n_ctx rounded to that times n_seq_max) and tools/server/server-context.cpp
// (n_ctx_slot(): capped at the model's n_ctx_train, "the slot context (...) exceeds the training context of the
// model (...) - capping"). -c 0 or none is the training context; -np unset is 4 slots on a unified cache
// (tools/server/server.cpp, "n_parallel is set to auto").

/** GGML_PAD(x, 256). */
const pad256 = (x: number): number => Math.ceil(x / 256) * 256

export interface LlamaContextArgs {
  /** `-c`: undefined or 0 for the model's own. */
  readonly ctx: number | undefined
  /** `-np`: undefined for auto. */
  readonly parallel: number | undefined
  readonly unified: boolean
}

/**
 * One slot's context, or undefined when neither -c nor the model's training context is known (the simulator then
 * checks no prompt length).
 */
export const llamaSlotContext = (a: LlamaContextArgs, nCtxTrain: number | undefined): number | undefined => {
  // No -c (or -c 0): every sequence gets the whole training context, the cache sized for all of them when it is not
  // unified (common/fit.cpp common_params_fit_impl: "context size unset and KV cache not unified -> using n_ctx_train
  // x n_seq_max"); unified, the cache is the training context, which n_ctx_slot() caps a slot at anyway.
  if (a.ctx === undefined || a.ctx === 0) return nCtxTrain
  const nCtx = pad256(a.ctx)
  const unified = a.unified || a.parallel === undefined
  const perSeq = unified ? nCtx : pad256(Math.floor(nCtx / Math.max(1, a.parallel ?? 1)))
  return nCtxTrain === undefined ? perSeq : Math.min(perSeq, nCtxTrain)
}
